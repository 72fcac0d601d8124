// Schema check of Kubernetes manifests (deploy/kubernetes rendered by kustomize, the Helm chart
// rendered by tests/node/helm_render.mjs): every object of each multi-document YAML file is
// validated against the OpenAPI schema of its apiVersion and kind (kubernetes-models: types,
// required fields, enums, formats; unknown fields are not refused by these schemas). Then what
// agentbox's deployment must hold (deploy_expect below).
//   node k8s_check.mjs FILE...        exit 0: all valid; 1: the errors are printed
import fs from "node:fs";
import YAML from "yaml";

export function parseAll(text) {
  return YAML.parseAllDocuments(text)
    .map((d) => {
      if (d.errors.length) throw new Error(d.errors.map((e) => e.message).join("; "));
      return d.toJSON();
    })
    .filter((o) => o !== null && o !== undefined);
}

async function modelOf(apiVersion, kind) {
  const path = apiVersion.includes("/") ? apiVersion : `v1`;
  const mod = await import(`kubernetes-models/${path}`);
  if (!mod[kind]) throw new Error(`no schema for ${apiVersion} ${kind}`);
  return mod[kind];
}

export async function validateObjects(objs) {
  const errors = [];
  const seen = new Set();
  for (const o of objs) {
    const id = `${o.apiVersion} ${o.kind} ${o.metadata?.name}`;
    if (!o.apiVersion || !o.kind || !o.metadata?.name) {
      errors.push(`${id}: apiVersion, kind and metadata.name are required`);
      continue;
    }
    if (seen.has(id)) errors.push(`${id}: defined twice`);
    seen.add(id);
    try {
      const Model = await modelOf(o.apiVersion, o.kind);
      new Model(o).validate();
    } catch (e) {
      errors.push(`${id}: ${e.message}`);
    }
  }
  return errors;
}

const find = (objs, kind, pred = () => true) => objs.filter((o) => o.kind === kind && pred(o));

// What every rendering of agentbox's deployment holds (issue 23): a privileged agentboxd
// DaemonSet with a hostPath data dir, node name from spec.nodeName and advertise URL from the
// pod IP, probes /healthz and /readyz, scrape annotations, the token from a Secret; a Service;
// NetworkPolicies; a PDB for etcd; etcd as a StatefulSet of 3 unless an external URL is given.
export function deployExpect(objs, { externalEtcd = false, externalSecret = false } = {}) {
  const errors = [];
  const need = (cond, what) => {
    if (!cond) errors.push(what);
  };
  const ds = find(objs, "DaemonSet");
  need(ds.length === 1, "one DaemonSet (agentboxd)");
  if (ds.length === 1) {
    const pod = ds[0].spec.template;
    const c = pod.spec.containers[0];
    const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, e]));
    need(c.securityContext?.privileged === true, "agentboxd privileged");
    need(env.NODE_NAME?.valueFrom?.fieldRef?.fieldPath === "spec.nodeName",
         "NODE_NAME from spec.nodeName");
    need(env.POD_IP?.valueFrom?.fieldRef?.fieldPath === "status.podIP", "POD_IP from status.podIP");
    need(env.AGENTBOX_TOKEN?.valueFrom?.secretKeyRef?.key === "token", "token from a Secret");
    const args = (c.args ?? []).join(" ");
    need(args.includes("--node-name=$(NODE_NAME)"), "--node-name=$(NODE_NAME)");
    need(args.includes("--advertise-url=http://$(POD_IP):"), "--advertise-url from the pod IP");
    need(c.livenessProbe?.httpGet?.path === "/healthz", "liveness /healthz");
    need(JSON.stringify(c.readinessProbe ?? {}).includes("/readyz"), "readiness /readyz");
    need(pod.metadata?.annotations?.["prometheus.io/scrape"] === "true", "scrape annotations");
    const data = (pod.spec.volumes ?? []).find((v) => v.hostPath);
    need(data?.hostPath?.path === "/var/lib/agentbox", "hostPath data dir /var/lib/agentbox");
    const secretNames = new Set(find(objs, "Secret").map((s) => s.metadata.name));
    const ref = env.AGENTBOX_TOKEN?.valueFrom?.secretKeyRef?.name;
    need(externalSecret ? !secretNames.has(ref) : secretNames.has(ref),
         externalSecret ? `the existing Secret ${ref} is not rendered` : `the Secret ${ref} is rendered`);
  }
  need(find(objs, "Service").some((s) => s.spec.selector?.["app.kubernetes.io/name"] === "agentboxd"),
       "a Service for the daemons");
  need(find(objs, "NetworkPolicy").length >= 1, "NetworkPolicies");
  const sts = find(objs, "StatefulSet");
  if (externalEtcd) {
    need(sts.length === 0, "no etcd StatefulSet with an external etcd");
  } else {
    need(sts.length === 1 && sts[0].spec.replicas === 3, "etcd StatefulSet of 3");
    need(find(objs, "PodDisruptionBudget").length >= 1, "a PodDisruptionBudget for etcd");
  }
  const cm = find(objs, "ConfigMap")[0];
  need(cm && YAML.parse(cm.data["agentboxd.yaml"]).cluster?.etcd?.length >= 1,
       "the daemons' config names etcd");
  return errors;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  let failed = false;
  for (const file of process.argv.slice(2)) {
    const objs = parseAll(fs.readFileSync(file, "utf8"));
    const errors = await validateObjects(objs);
    for (const e of errors) console.error(`${file}: ${e}`);
    failed ||= errors.length > 0 || objs.length === 0;
    console.log(`${file}: ${objs.length} objects, ${errors.length} errors`);
  }
  process.exit(failed ? 1 : 0);
}
