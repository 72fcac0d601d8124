// The E2B section of `make bench` (agentbox-bench --section e2b): the stock SDK against agentboxd,
// beside the native /v1 exec from the same Node process (same runtime, Node's keep-alive
// fetch, interleaved), printed as one JSON object of millisecond samples.
// Usage: node e2b_bench.mjs BASE_URL(http://127.0.0.1:PORT) N_RUNS N_CREATES
import { Sandbox } from "e2b";

const [url, runsArg, createsArg] = process.argv.slice(2);
const runs = Number(runsArg ?? 300);
const creates = Number(createsArg ?? 50);
const base = `${url}/e2b`;
const opts = { apiKey: "e2b_bench", apiUrl: base, sandboxUrl: base };
const now = () => Number(process.hrtime.bigint()) / 1e6;

async function nativeExec(id, body) {
  const res = await fetch(`${url}/v1/sessions/${id}/exec`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  const j = await res.json();
  if (j.exit_code !== 0) throw new Error(`native exec: ${JSON.stringify(j)}`);
}

const sbx = await Sandbox.create("base", opts);
const id = sbx.sandboxId;
const trueArgv = JSON.stringify({ argv: ["/bin/true"] });
// What the SDK runs for commands.run("true"): /bin/bash -l -c true.
const bashArgv = JSON.stringify({ argv: ["/bin/bash", "-l", "-c", "true"] });
for (let i = 0; i < 20; i++) {
  await sbx.commands.run("true");
  await nativeExec(id, trueArgv);
  await nativeExec(id, bashArgv);
}
const out = { sdk_run: [], native_true: [], native_bash: [], create_first: [], native_create_first: [] };
for (let i = 0; i < runs; i++) {
  let t0 = now();
  await sbx.commands.run("true");
  out.sdk_run.push(now() - t0);
  t0 = now();
  await nativeExec(id, bashArgv);
  out.native_bash.push(now() - t0);
  t0 = now();
  await nativeExec(id, trueArgv);
  out.native_true.push(now() - t0);
}
await sbx.kill();
// Interleaved with its baseline: the same through /v1 (create the session, exec the same
// /bin/bash -l -c true, delete).
for (let i = 0; i < creates; i++) {
  let t0 = now();
  const s = await Sandbox.create("base", opts);
  await s.commands.run("true");
  out.create_first.push(now() - t0);
  await s.kill();
  const nid = `bench-native-${i}`;
  t0 = now();
  await fetch(`${url}/v1/sessions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ id: nid }),
  }).then((r) => r.arrayBuffer());
  await nativeExec(nid, bashArgv);
  out.native_create_first.push(now() - t0);
  await fetch(`${url}/v1/sessions/${nid}`, { method: "DELETE" }).then((r) => r.arrayBuffer());
}
console.log(JSON.stringify(out));
