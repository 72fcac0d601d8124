// deploy/kubernetes and deploy/helm/agentbox, offline (issue 23; tests/package/deploy_test.sh
// runs it): the kustomize rendering (a file made by `kubectl kustomize`) and the chart rendered
// by helm_render.mjs (no Helm is packaged offline) with its defaults plus the two required
// secrets and with examples/external-etcd.yaml; every object passes the schema of its
// apiVersion/kind and holds what the deployment needs (k8s_check.mjs). The daemons' config of
// each rendering is written to OUT_DIR/<name>.yaml for agentboxd's own parser.
//   node deploy_check.mjs REPO KUSTOMIZE_OUTPUT OUT_DIR
import fs from "node:fs";
import path from "node:path";
import { parseAll, validateObjects, deployExpect } from "./k8s_check.mjs";
import { Chart, loadValues } from "./helm_render.mjs";

const [repo, kustomized, outDir] = process.argv.slice(2);
const chartDir = path.join(repo, "deploy/helm/agentbox");
let failures = 0;
let passes = 0;

async function check(name, text, opts) {
  const objs = parseAll(text);
  const errors = [...(await validateObjects(objs)), ...deployExpect(objs, opts).map((e) => `missing: ${e}`)];
  const cm = objs.find((o) => o.kind === "ConfigMap" && o.data?.["agentboxd.yaml"]);
  if (cm) fs.writeFileSync(path.join(outDir, `${name}.yaml`), cm.data["agentboxd.yaml"]);
  else errors.push("no ConfigMap with agentboxd.yaml");
  const kinds = objs.map((o) => o.kind).join(", ");
  if (errors.length) {
    failures++;
    console.log(`FAIL ${name} (${objs.length} objects: ${kinds})`);
    for (const e of errors) console.log(`  ${e}`);
  } else {
    passes++;
    console.log(`ok   ${name}: ${objs.length} objects valid (${kinds})`);
  }
}

// One version everywhere: the .deb (cmake/Packaging.cmake) and its changelog, the chart, the
// kustomize image tag.
{
  const version = /set\(AGENTBOX_VERSION ([^)]+)\)/.exec(
    fs.readFileSync(path.join(repo, "cmake/Packaging.cmake"), "utf8"))?.[1];
  const chart = parseAll(fs.readFileSync(path.join(chartDir, "Chart.yaml"), "utf8"))[0];
  const kust = parseAll(fs.readFileSync(path.join(repo, "deploy/kubernetes/kustomization.yaml"), "utf8"))[0];
  const tag = kust.images?.find((i) => i.name === "agentbox")?.newTag;
  const changelog = /^agentbox \(([^)]+)\)/.exec(
    fs.readFileSync(path.join(repo, "deploy/debian/changelog"), "utf8"))?.[1];
  const ok = chart.apiVersion === "v2" && chart.name === "agentbox" && version &&
    changelog === version &&
    chart.version === version && chart.appVersion === version && tag === version;
  if (ok) passes++;
  else failures++;
  console.log(`${ok ? "ok  " : "FAIL"} versions: package ${version}, changelog ${changelog}, ` +
              `chart ${chart.version} ` +
              `(app ${chart.appVersion}, apiVersion ${chart.apiVersion}), kustomize image tag ${tag}`);
}

await check("kustomize", fs.readFileSync(kustomized, "utf8"), {});

// Defaults alone: the chart refuses to render without the secrets, naming them.
try {
  new Chart(chartDir, loadValues(chartDir)).render();
  failures++;
  console.log("FAIL helm defaults: rendered without a token");
} catch (e) {
  if (/set token/.test(e.message)) {
    passes++;
    console.log(`ok   helm defaults without secrets refused: ${e.message}`);
  } else {
    failures++;
    console.log(`FAIL helm defaults: ${e.message}`);
  }
}
const secrets = path.join(outDir, "secrets-values.yaml");
fs.writeFileSync(secrets, "token: a-test-token\nclusterSecret: a-test-cluster-secret\n");
await check("helm-defaults", new Chart(chartDir, loadValues(chartDir, [secrets])).render(), {});
const example = path.join(chartDir, "examples/external-etcd.yaml");
const exText = new Chart(chartDir, loadValues(chartDir, [example])).render();
await check("helm-external-etcd", exText, { externalEtcd: true, externalSecret: true });
fs.rmSync(secrets);

console.log(`${passes} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
