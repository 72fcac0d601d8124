// Drives `agentbox mcp SESSION` (the stdio bridge) with the stock @modelcontextprotocol/sdk
// client's stdio transport, the way a desktop agent starts a local MCP server, and prints what it
// saw as one JSON object (api_mcp_test.cc asserts on it).
// Usage: node mcp_stdio_client.mjs AGENTBOX_BINARY SERVER_URL TOKEN SESSION
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [binary, server, token, session] = process.argv.slice(2);
const out = {};

const transport = new StdioClientTransport({
  command: binary,
  args: ["--server", server, "mcp", session],
  env: { ...process.env, AGENTBOX_TOKEN: token },
  stderr: "pipe",
});
let stderr = "";
transport.stderr.on("data", (d) => (stderr += d));
const client = new Client({ name: "agentbox-stdio-test", version: "1.0.0" });
await client.connect(transport);
out.server = client.getServerVersion();
out.tools = (await client.listTools()).tools.map((t) => t.name);

const call = (name, args) => client.callTool({ name, arguments: args });
out.exec = (await call("exec", { command: "echo hi; echo err >&2; exit 3" })).structuredContent;
out.write = (await call("write_file", { path: "notes/a.txt", content: "over stdio\n" })).structuredContent;
out.read = (await call("read_file", { path: "notes/a.txt" })).structuredContent;

// Requests run side by side: a ping and a quick exec answer while a slow exec is still running.
const order = [];
const slow = call("exec", { command: "sleep 2; echo slow" }).then((r) => {
  order.push("slow");
  return r.structuredContent;
});
await new Promise((r) => setTimeout(r, 200));
await client.ping().then(() => order.push("ping"));
await call("exec", { command: "echo quick" }).then(() => order.push("quick"));
out.slow = await slow;
out.order = order;

const unknown = await call("exec", { command: "true", user: "root" });
out.unknown_arg = { isError: unknown.isError, text: unknown.content.map((c) => c.text).join("") };

await client.close();
out.stderr = stderr;
console.log(JSON.stringify(out));
