#pragma once
// The MCP surface's tool list (shared/E2B-MCP.md 7.4), as tools/list returns it. Every tool
// declares an outputSchema; the stock client validates structuredContent against it. A value
// that may be null has no "type" (the client's validator is strict about union types).

namespace agentbox::server::detail {

inline constexpr const char* kToolsJson = R"json([
{"name":"exec","title":"Run a shell command",
 "description":"Runs a command with /bin/sh -c in the session's workspace and returns its output and exit code once it ends. A non-zero exit code or a timeout is a result, not an error. For servers and watchers use start_process.",
 "inputSchema":{"type":"object","required":["command"],"properties":{
   "command":{"type":"string"},"cwd":{"type":"string"},
   "env":{"type":"object","additionalProperties":{"type":"string"}},
   "stdin":{"type":"string","description":"fed to the command, then closed"},
   "timeout_sec":{"type":"integer","minimum":1,"maximum":3600,"description":"default 120"}}},
 "outputSchema":{"type":"object","required":["stdout","stderr","exit_code","timed_out"],"properties":{
   "stdout":{"type":"string"},"stderr":{"type":"string"},"exit_code":{"type":"integer"},
   "timed_out":{"type":"boolean"},"duration_ms":{"type":"integer"},
   "stdout_truncated":{"type":"boolean"},"stderr_truncated":{"type":"boolean"}}},
 "annotations":{"readOnlyHint":false,"destructiveHint":true,"idempotentHint":false,"openWorldHint":true}},
{"name":"read_file","title":"Read a file",
 "description":"Reads a file (absolute in-box path, or relative to the workspace). Text by default; binary files need encoding base64. Reads at most limit bytes from offset.",
 "inputSchema":{"type":"object","required":["path"],"properties":{
   "path":{"type":"string"},"encoding":{"type":"string","enum":["utf-8","base64"]},
   "offset":{"type":"integer","minimum":0},
   "limit":{"type":"integer","minimum":1,"maximum":4194304,"description":"bytes, default 262144"}}},
 "outputSchema":{"type":"object","required":["path","content","encoding","size","truncated"],"properties":{
   "path":{"type":"string"},"content":{"type":"string"},"encoding":{"type":"string"},
   "size":{"type":"integer","description":"of the whole file"},"truncated":{"type":"boolean"}}},
 "annotations":{"readOnlyHint":true,"destructiveHint":false,"idempotentHint":true,"openWorldHint":false}},
{"name":"write_file","title":"Write a file",
 "description":"Writes a whole file atomically (creating parent directories unless mkdirs is false).",
 "inputSchema":{"type":"object","required":["path","content"],"properties":{
   "path":{"type":"string"},"content":{"type":"string"},
   "encoding":{"type":"string","enum":["utf-8","base64"]},"mkdirs":{"type":"boolean"}}},
 "outputSchema":{"type":"object","required":["path","size"],"properties":{
   "path":{"type":"string"},"size":{"type":"integer"}}},
 "annotations":{"readOnlyHint":false,"destructiveHint":true,"idempotentHint":true,"openWorldHint":false}},
{"name":"edit_file","title":"Replace text in a file",
 "description":"Replaces old_string with new_string in a text file. old_string must occur exactly once unless replace_all is set; otherwise the file is left untouched.",
 "inputSchema":{"type":"object","required":["path","old_string","new_string"],"properties":{
   "path":{"type":"string"},"old_string":{"type":"string"},"new_string":{"type":"string"},
   "replace_all":{"type":"boolean"}}},
 "outputSchema":{"type":"object","required":["path","replacements"],"properties":{
   "path":{"type":"string"},"replacements":{"type":"integer"}}},
 "annotations":{"readOnlyHint":false,"destructiveHint":true,"idempotentHint":false,"openWorldHint":false}},
{"name":"list_dir","title":"List a directory",
 "description":"Lists a directory (default: the workspace), sorted by name.",
 "inputSchema":{"type":"object","properties":{"path":{"type":"string"}}},
 "outputSchema":{"type":"object","required":["path","entries"],"properties":{
   "path":{"type":"string"},
   "entries":{"type":"array","items":{"type":"object","required":["name","is_dir"],"properties":{
     "name":{"type":"string"},"is_dir":{"type":"boolean"},"is_symlink":{"type":"boolean"},
     "size":{"type":"integer"},"mode":{"type":"integer"},"mod_time":{"type":"string"}}}}}},
 "annotations":{"readOnlyHint":true,"destructiveHint":false,"idempotentHint":true,"openWorldHint":false}},
{"name":"stat","title":"File information",
 "description":"Size, mode, modification time and type of a path.",
 "inputSchema":{"type":"object","required":["path"],"properties":{"path":{"type":"string"}}},
 "outputSchema":{"type":"object","required":["name","path","size","is_dir"],"properties":{
   "name":{"type":"string"},"path":{"type":"string"},"size":{"type":"integer"},
   "mode":{"type":"integer"},"mod_time":{"type":"string"},"is_dir":{"type":"boolean"},
   "is_symlink":{"type":"boolean"}}},
 "annotations":{"readOnlyHint":true,"destructiveHint":false,"idempotentHint":true,"openWorldHint":false}},
{"name":"mkdir","title":"Make a directory",
 "description":"Creates a directory and its parents; an existing one is fine.",
 "inputSchema":{"type":"object","required":["path"],"properties":{"path":{"type":"string"}}},
 "outputSchema":{"type":"object","required":["path"],"properties":{"path":{"type":"string"}}},
 "annotations":{"readOnlyHint":false,"destructiveHint":false,"idempotentHint":true,"openWorldHint":false}},
{"name":"rename","title":"Move or rename",
 "description":"Moves a file or directory, replacing a file at the destination.",
 "inputSchema":{"type":"object","required":["from","to"],"properties":{
   "from":{"type":"string"},"to":{"type":"string"}}},
 "outputSchema":{"type":"object","required":["from","to"],"properties":{
   "from":{"type":"string"},"to":{"type":"string"}}},
 "annotations":{"readOnlyHint":false,"destructiveHint":true,"idempotentHint":false,"openWorldHint":false}},
{"name":"remove","title":"Delete a file or directory",
 "description":"Deletes a file or an empty directory; a non-empty one needs recursive.",
 "inputSchema":{"type":"object","required":["path"],"properties":{
   "path":{"type":"string"},"recursive":{"type":"boolean"}}},
 "outputSchema":{"type":"object","required":["path"],"properties":{"path":{"type":"string"}}},
 "annotations":{"readOnlyHint":false,"destructiveHint":true,"idempotentHint":true,"openWorldHint":false}},
{"name":"start_process","title":"Start a background process",
 "description":"Starts a command (/bin/sh -c) in the background: servers, watchers, long builds. Read its output with process_output, end it with kill_process. ref = its tag or pid.",
 "inputSchema":{"type":"object","required":["command"],"properties":{
   "command":{"type":"string"},"cwd":{"type":"string"},
   "env":{"type":"object","additionalProperties":{"type":"string"}},
   "tag":{"type":"string","description":"a name to find it by; unique among live processes"}}},
 "outputSchema":{"type":"object","required":["pid","state"],"properties":{
   "pid":{"type":"integer"},"tag":{},"state":{"type":"string"},"exit_code":{}}},
 "annotations":{"readOnlyHint":false,"destructiveHint":true,"idempotentHint":false,"openWorldHint":true}},
{"name":"process_output","title":"Output of a background process",
 "description":"The output a process produced from byte offset since (default: the oldest kept), its state and exit code. Pass next as since to continue.",
 "inputSchema":{"type":"object","required":["ref"],"properties":{
   "ref":{"type":"string","description":"tag or pid"},"since":{"type":"integer","minimum":0}}},
 "outputSchema":{"type":"object","required":["stdout","stderr","next","state"],"properties":{
   "stdout":{"type":"string"},"stderr":{"type":"string"},"next":{"type":"integer"},
   "state":{"type":"string"},"exit_code":{}}},
 "annotations":{"readOnlyHint":true,"destructiveHint":false,"idempotentHint":true,"openWorldHint":false}},
{"name":"kill_process","title":"Kill a background process",
 "description":"Kills a process and everything it started; returns its final state.",
 "inputSchema":{"type":"object","required":["ref"],"properties":{
   "ref":{"type":"string","description":"tag or pid"}}},
 "outputSchema":{"type":"object","required":["pid","state"],"properties":{
   "pid":{"type":"integer"},"tag":{},"state":{"type":"string"},"exit_code":{}}},
 "annotations":{"readOnlyHint":false,"destructiveHint":true,"idempotentHint":true,"openWorldHint":false}}
])json";

}  // namespace agentbox::server::detail
