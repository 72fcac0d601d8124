// Drives agentboxd's MCP endpoint with the stock @modelcontextprotocol/sdk client, the way an
// agent framework does, and prints what it saw as one JSON object (api_mcp_test.cc asserts on
// it). Usage: node mcp_client.mjs URL [TOKEN]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token] = process.argv.slice(2);
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const out = {};

const client = new Client({ name: "agentbox-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
await client.connect(transport);
out.session_id = transport.sessionId;
out.server = client.getServerVersion();
out.protocol = transport.protocolVersion;

out.tools = (await client.listTools()).tools.map((t) => t.name);

const call = (name, args) => client.callTool({ name, arguments: args });
const text = (r) => r.content.map((c) => c.text).join("");

out.exec = (await call("exec", { command: "echo hi; echo err >&2; exit 3" })).structuredContent;
out.exec_stdin = (await call("exec", { command: "tr a-z A-Z", stdin: "shout" })).structuredContent;
out.exec_timeout = (await call("exec", { command: "sleep 30", timeout_sec: 1 })).structuredContent;
const unknownArg = await call("exec", { command: "true", user: "root" });
out.exec_unknown_arg = { isError: unknownArg.isError, text: text(unknownArg) };

out.write = (await call("write_file", { path: "notes/a.txt", content: "hello world\nbye world\n" }))
  .structuredContent;
out.read = (await call("read_file", { path: "notes/a.txt" })).structuredContent;
const ambiguous = await call("edit_file", { path: "notes/a.txt", old_string: "world", new_string: "box" });
out.edit_ambiguous = { isError: ambiguous.isError, text: text(ambiguous) };
out.edit = (await call("edit_file", { path: "notes/a.txt", old_string: "hello world", new_string: "hello agentbox" }))
  .structuredContent;
const missing = await call("edit_file", { path: "notes/a.txt", old_string: "nowhere", new_string: "x" });
out.edit_missing = { isError: missing.isError, text: text(missing) };
out.read_after_edit = (await call("read_file", { path: "/workspace/notes/a.txt", offset: 6, limit: 8 }))
  .structuredContent;

const bytes = Buffer.from([0, 1, 2, 254, 255]);
await call("write_file", { path: "bin/blob", content: bytes.toString("base64"), encoding: "base64" });
out.read_binary_as_text = text(await call("read_file", { path: "bin/blob" }));
out.read_binary = (await call("read_file", { path: "bin/blob", encoding: "base64" })).structuredContent;

out.mkdir = (await call("mkdir", { path: "a/b/c" })).structuredContent;
out.rename = (await call("rename", { from: "notes/a.txt", to: "a/b/c/moved.txt" })).structuredContent;
out.list = (await call("list_dir", { path: "a/b/c" })).structuredContent;
out.list_default = (await call("list_dir", {})).structuredContent;
out.stat = (await call("stat", { path: "a/b/c/moved.txt" })).structuredContent;
const notEmpty = await call("remove", { path: "a" });
out.remove_not_empty = { isError: notEmpty.isError, text: text(notEmpty) };
out.remove = (await call("remove", { path: "a", recursive: true })).structuredContent;
const gone = await call("stat", { path: "a" });
out.stat_gone = { isError: gone.isError, text: text(gone) };

out.start = (await call("start_process", { command: "echo started; exec sleep 30", tag: "srv" }))
  .structuredContent;
let output;
for (let i = 0; i < 200; i++) {
  output = (await call("process_output", { ref: "srv" })).structuredContent;
  if (output.stdout.includes("started")) break;
  await new Promise((r) => setTimeout(r, 25));
}
out.process_output = output;
out.kill = (await call("kill_process", { ref: "srv" })).structuredContent;

try {
  await call("no_such_tool", {});
  out.unknown_tool = "no error";
} catch (e) {
  out.unknown_tool = { code: e.code, message: e.message };
}

await transport.terminateSession();
out.terminated = transport.sessionId === undefined;
await client.close();
console.log(JSON.stringify(out));
