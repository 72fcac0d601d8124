// Drives agentboxd's E2B dialect with the stock `e2b` SDK, the way an agent does, and prints
// what it saw as one JSON object (api_e2b_test.cc asserts on it).
// Usage: node e2b_client.mjs BASE_URL API_KEY     (BASE_URL = http://127.0.0.1:PORT/e2b)
import { Sandbox } from "e2b";

const [base, apiKey] = process.argv.slice(2);
const opts = { apiKey, apiUrl: base, sandboxUrl: base, requestTimeoutMs: 30000 };
const out = {};
const errorOf = (e) => ({ name: e.constructor.name, message: String(e.message ?? e) });
const attempt = async (key, f) => {
  try {
    out[key] = await f();
  } catch (e) {
    out[key] = { threw: errorOf(e), exitCode: e.exitCode, stdout: e.stdout, error: e.error };
  }
};

// "alive" while the process in the pid file runs (a zombie, killed but not yet reaped, is dead).
const alive = (file) =>
  `s=$(awk '{print $3}' /proc/$(cat ${file})/stat 2>/dev/null); ` +
  `[ -n "$s" ] && [ "$s" != Z ] && echo alive || echo dead`;

const sbx = await Sandbox.create("base", {
  ...opts,
  metadata: { purpose: "e2b-test" },
  envs: { FROM_CREATE: "yes" },
  timeoutMs: 600_000,
});
out.sandbox_id = sbx.sandboxId;
out.running = await sbx.isRunning();

// Foreground: output, the create-time env, the default cwd (the workspace: /workspace in a box,
// its host path on the host backend).
out.home = (await sbx.commands.run("pwd")).stdout.trim();
const r = await sbx.commands.run("echo hi; echo oops >&2; echo $FROM_CREATE; pwd");
out.run = { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode };
await attempt("nonzero", () => sbx.commands.run("echo bad; exit 3"));

// envs and cwd (relative to the workspace, absolute, missing).
out.envs = (await sbx.commands.run("echo $A-$B", { envs: { A: "1", B: "two" } })).stdout;
await sbx.commands.run("mkdir -p sub/dir");
out.cwd_relative = (await sbx.commands.run("pwd", { cwd: "sub/dir" })).stdout;
out.cwd_absolute = (await sbx.commands.run("pwd", { cwd: "/workspace/sub" })).stdout;
await attempt("cwd_missing", () => sbx.commands.run("pwd", { cwd: "/workspace/nope/x" }));

// Streaming callbacks, in order.
const chunks = [];
await sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.05; done; echo done >&2", {
  onStdout: (d) => chunks.push(["out", d]),
  onStderr: (d) => chunks.push(["err", d]),
});
out.stream = chunks;

// stdin: written and closed through the API; without stdin, `cat` sees EOF at once.
const cat = await sbx.commands.run("cat; echo END", { background: true, stdin: true });
await cat.sendStdin("ping\n");
await sbx.commands.sendStdin(cat.pid, "pong\n");
await sbx.commands.closeStdin(cat.pid);
out.stdin = (await cat.wait()).stdout;
out.no_stdin = (await sbx.commands.run("cat; echo EOF")).stdout;

// Timeout: the command is killed, not just abandoned by the client.
const t0 = Date.now();
await attempt("timeout", () =>
  sbx.commands.run("echo $$ > timed.pid; sleep 30", { timeoutMs: 1500 }),
);
out.timeout_ms = Date.now() - t0;
await new Promise((res) => setTimeout(res, 500));
out.timeout_alive = (
  await sbx.commands.run(alive("timed.pid"))
).stdout;

// Background + list + kill: the whole group goes (the child `sleep` too).
const bg = await sbx.commands.run("sleep 100 & echo $! > child.pid; sleep 100", {
  background: true,
});
for (let i = 0; i < 100; i++) {
  const s = (await sbx.commands.run("cat child.pid 2>/dev/null || true")).stdout;
  if (s.trim()) break;
  await new Promise((res) => setTimeout(res, 50));
}
out.list = (await sbx.commands.list()).map((p) => ({ pid: p.pid, cmd: p.cmd, args: p.args }));
out.bg_pid = bg.pid;
out.kill = await bg.kill();
await attempt("bg_wait", () => bg.wait());
out.kill_again = await sbx.commands.kill(bg.pid);
await new Promise((res) => setTimeout(res, 300));
out.child_alive = (
  await sbx.commands.run(alive("child.pid"))
).stdout;

// A dropped stream never kills the process; connect picks it up again.
const ticks = await sbx.commands.run(
  "for i in $(seq 1 20); do echo tick$i; sleep 0.1; done; exit 4",
  { background: true },
);
await ticks.disconnect();
await new Promise((res) => setTimeout(res, 300));
const seen = [];
const again = await sbx.commands.connect(ticks.pid, { onStdout: (d) => seen.push(d) });
await attempt("reconnect", () => again.wait());
out.reconnect_seen = seen.join("");

// A terminal: resize, type, read.
const ptyOut = [];
const pty = await sbx.pty.create({
  cols: 80,
  rows: 24,
  onData: (d) => ptyOut.push(Buffer.from(d).toString()),
});
await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 });
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size; echo PTY$((40+2)); exit\n"));
await attempt("pty_wait", async () => (await pty.wait()).exitCode);
out.pty = ptyOut.join("");

// The control plane: connect, info, list, timeout, pause/resume, kill.
const sbx2 = await Sandbox.connect(sbx.sandboxId, opts);
out.connect_run = (await sbx2.commands.run("echo again")).stdout;
const info = await sbx.getInfo();
out.info = { sandboxId: info.sandboxId, templateId: info.templateId, state: info.state,
             metadata: info.metadata };
const page = await Sandbox.list({ ...opts, query: { metadata: { purpose: "e2b-test" } } }).nextItems();
out.listed = page.map((s) => s.sandboxId);
await sbx.setTimeout(120_000);
out.paused = await sbx.pause();
out.running_paused = await sbx.isRunning();
out.paused_again = await sbx.pause();
const sbx3 = await Sandbox.connect(sbx.sandboxId, opts);
out.resumed_run = (await sbx3.commands.run("cat child.pid >/dev/null && echo kept")).stdout;
out.killed = await sbx.kill();
out.running_killed = await sbx.isRunning();
out.killed_again = await Sandbox.kill(sbx.sandboxId, opts);
await attempt("connect_gone", () => Sandbox.connect(sbx.sandboxId, opts));
await attempt("run_gone", () => sbx.commands.run("true"));
await attempt("bad_template", () => Sandbox.create("no-such-template", opts));

console.log(JSON.stringify(out));
