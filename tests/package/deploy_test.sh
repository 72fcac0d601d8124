#!/usr/bin/env bash
# deploy/kubernetes and deploy/helm/agentbox offline (issue 23): kustomize (kubectl's built-in)
# renders the manifests; tests/node/deploy_check.mjs renders the chart (defaults + secrets, and
# examples/external-etcd.yaml) and checks every object against its Kubernetes schema and what
# the deployment needs; then agentboxd's own parser reads the daemons' config of each rendering.
# Usage: deploy_test.sh REPO BUILD_DIR
set -euo pipefail
repo=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/agentbox-deploy-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# deploy/container/Containerfile cannot be built here (its stages need Debian's archive and the
# npm registry); what can be checked offline: every file it COPYs from the repo exists.
while read -r src; do
  [[ -e $repo/$src ]] || { echo "FAIL: Containerfile copies $src, which does not exist"; exit 1; }
done < <(sed -n 's/^COPY \([^-][^ ]*\( [^ ]*\)*\) [^ ]*$/\1/p' "$repo/deploy/container/Containerfile" |
         tr ' ' '\n' | grep -v '^\.$')
echo "ok   the Containerfile's COPY sources exist"

kubectl kustomize "$repo/deploy/kubernetes" >"$tmp/kustomize-out.yaml" 2>"$tmp/kustomize.err" ||
  { cat "$tmp/kustomize.err"; echo "FAIL: kubectl kustomize"; exit 1; }
(cd "$repo/tests/node" && node deploy_check.mjs "$repo" "$tmp/kustomize-out.yaml" "$tmp")

for r in kustomize helm-defaults helm-external-etcd; do
  rc=0
  out=$(AGENTBOX_TOKEN=a-test-token "$build/bin/agentboxd" --config "$tmp/$r.yaml" \
        --check-backend host 2>&1) || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: agentboxd does not take the $r config (exit $rc): $out"
    cat "$tmp/$r.yaml"
    exit 1
  fi
  echo "ok   agentboxd parses the $r config"
done
