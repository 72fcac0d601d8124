{{/* The release's name prefix of every object. */}}
{{- define "agentbox.fullname" -}}
{{ .Release.Name | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "agentbox.labels" -}}
app.kubernetes.io/part-of: agentbox
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "agentbox.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "agentbox.secretName" -}}
{{ default (printf "%s-secrets" (include "agentbox.fullname" .)) .Values.existingSecret }}
{{- end }}

{{- define "agentbox.etcdName" -}}
{{ include "agentbox.fullname" . }}-etcd
{{- end }}
