#!/usr/bin/env python3
"""Builds the seed corpora of tests/fuzz/corpus/<harness>/ from the messages the tests send.

Run from the repository root: python3 tests/fuzz/make_seeds.py. Seeds are named seed-<sha1>
(content-addressed, so a rerun adds nothing twice); crash-* files (regressions) are never
touched. The sources: JSON bodies, MCP and runner frames in raw string literals of the unit and
integration tests, the YAML of the template and config tests, the LangBot frames the LangBot
test sends, multipart forms and gzip bodies as the E2B tests build them, and tar archives like
the archive tests' (good trees and hostile ones).
"""
import gzip
import hashlib
import io
import json
import os
import re
import struct
import tarfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def put(harness, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    name = "seed-" + hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


RAW = re.compile(r'R"([A-Za-z]*)\((.*?)\)\1"', re.S)


def raw_strings(rel):
    return [m.group(2) for m in RAW.finditer(read(rel))]


def c_string_runs(text):
    """Adjacent C string literals ("a" "b") joined and unescaped."""
    out = []
    for m in re.finditer(r'(?:"(?:[^"\\\n]|\\.)*"\s*)+', text):
        parts = re.findall(r'"((?:[^"\\\n]|\\.)*)"', m.group(0))
        s = "".join(parts)
        try:
            out.append(bytes(s, "utf-8").decode("unicode_escape").encode("latin-1").decode())
        except (UnicodeDecodeError, UnicodeEncodeError):
            pass
    return out


def json_objects(rel):
    out = []
    for s in raw_strings(rel) + c_string_runs(read(rel)):
        s = s.strip()
        if not s.startswith("{"):
            continue
        try:
            json.loads(s)
        except ValueError:
            continue
        out.append(s)
    return out


def v1_json():
    files = ["tests/server/json_codec_test.cc"] + [
        "tests/integration/" + f for f in sorted(os.listdir(os.path.join(ROOT, "tests/integration")))
        if f.startswith("api_") and f.endswith(".cc")]
    for rel in files:
        for s in json_objects(rel):
            if '"jsonrpc"' in s:
                put("mcp", s)
            else:
                put("v1_json", s)
    put("v1_json", "")
    put("v1_json", '{"command":"echo hi","timeout_sec":5,"env":{"A":"1"},"cwd":"/workspace"}')
    put("v1_json", '{"argv":["ls","-la"],"max_output_bytes":1024,"stdin":"x"}')
    put("v1_json", '{"id":"s1","limits":{"memory_mb":256,"cpu_percent":50,"max_pids":64,'
                   '"disk_mb":100,"tmp_mb":64},"network":{"mode":"allowlist","allow":["a.b"]},'
                   '"ttl_sec":60,"labels":{"k":"v"},"mounts":[{"host_path":"/srv","mount_path":'
                   '"/data","mode":"ro"}],"skills":["/s"],"skill_mode":"ro"}')
    put("v1_json", '{"manager":"pip","packages":["requests==2"],"persist":true,"no_index":true,'
                   '"find_links":"/w","timeout_sec":30}')
    put("v1_json", '{"signal":"SIGTERM","cols":80,"rows":24,"from":"a","to":"b","path":"d"}')
    put("v1_json", '{"command":"sleep 9","tag":"web","pty":{"cols":80,"rows":24},'
                   '"restart":"on-failure","stdin":true}')
    put("v1_json", '{"agent_id":"a","command":"ls","cgroup":{"memory_mb":128},"path":"f",'
                   '"content":"x","artifact_dir":"out"}')


def mcp():
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    put("mcp", json.dumps(init))
    init["params"]["protocolVersion"] = 20250618  # a number: once an exception in mcp_post
    put("mcp", json.dumps(init))
    put("mcp", '{"jsonrpc":"2.0","method":"notifications/initialized"}')
    put("mcp", '[{"jsonrpc":"2.0","id":1,"method":"ping"}]')
    for name, args in [("exec", {"command": "echo hi", "timeout_sec": 5}),
                       ("read_file", {"path": "f", "encoding": "base64", "offset": 0}),
                       ("write_file", {"path": "f", "content": "aGk=", "encoding": "base64"}),
                       ("edit_file", {"path": "f", "old_string": "a", "new_string": "b"}),
                       ("start_process", {"command": "sleep 5", "tag": "t"}),
                       ("kill_process", {"ref": "t", "signal": "SIGKILL"})]:
        put("mcp", json.dumps({"jsonrpc": "2.0", "id": "x", "method": "tools/call",
                               "params": {"name": name, "arguments": args}}))


def runner_frames():
    for s in json_objects("tests/runner/protocol_test.cc"):
        put("runner_frames", b"\x00" + s.encode())
    for s in json_objects("tests/integration/api_runners_test.cc"):
        put("runner_frames", b"\x00" + s.encode())
    put("runner_frames", b'\x00{"type":"register","body":{"user_id":"u","auth_token":"t",'
        b'"workspace":"/w","shell":"/bin/sh","version":3,"enforces":["memory","pids"]}}')
    put("runner_frames", b'\x00{"id":"r1","type":"stdio_data","body":{"stream_id":"s","data":'
        b'"aGk=","stream":"stderr"}}')
    put("runner_frames", b'\x00{"id":"r1","type":"file_end","size":12,"sha256":"00"}')
    for rid, off, data in [(b"req_0123456789abcdef", 0, b"hello"), (b"r", 1 << 20, b""),
                           (b"x" * 255, 7, b"\x00\xff" * 8)]:
        put("runner_frames", b"\x01" + bytes([1, len(rid)]) + rid + struct.pack(">Q", off) + data)


def template_yaml():
    for s in raw_strings("tests/workspace/templates_test.cc"):
        put("template_yaml", s)
    for rel in ["tests/integration/api_templates_test.cc",
                "tests/integration/api_templates_seed_test.cc"]:
        for s in raw_strings(rel) + c_string_runs(read(rel)):
            if "\n" in s and ":" in s and not s.lstrip().startswith("{"):
                put("template_yaml", s)


def config_yaml():
    for s in c_string_runs(read("tests/server/config_test.cc")):
        if "\n" in s and ":" in s:
            put("config_yaml", s)
    put("config_yaml", "listen: 127.0.0.1:0\ndata_dir: /nonexistent\nbackend: host\n"
        "tokens: [a, b]\nmax_running_boxes: 4\nevict_idle: true\nui: false\nlog_level: debug\n")


def langbot():
    ctx = {"instance_uuid": "i-1", "workspace_uuid": "w1", "placement_generation": 1}
    spec = {"cmd": "echo hi", "workdir": "/workspace", "timeout_sec": 30, "network": "off",
            "session_id": "person_42", "env": {"N": "5"},
            "image": "rockchin/langbot-sandbox:latest", "memory_mb": 512, "cpus": 1.0,
            "pids_limit": 128, "read_only_rootfs": False, "host_path": None,
            "host_path_mode": "rw", "mount_path": "/workspace", "persistent": False}
    for i, (action, data) in enumerate([
            ("__ping", {}), ("box_init", {}), ("box_health", {}),
            ("box_create_session", spec), ("box_exec", spec),
            ("box_get_session", {"session_id": "person_42"}),
            ("box_start_managed_process", {"session_id": "s", "spec": {
                "process_id": "web", "command": "python3", "args": ["-m", "http.server"],
                "env": {"A": "1"}, "cwd": "/workspace"}}),
            ("box_get_managed_process", {"session_id": "s", "process_id": "web"})]):
        put("langbot", json.dumps({"seq_id": i, "action": action, "data": data, "context": ctx}))
    put("langbot", '{"seq_id": "7", "action": 1}')
    put("langbot", '{"code": 0, "seq_id": 1, "data": {}}')


def multipart():
    def form(boundary, parts):
        out = b""
        for name, filename, body in parts:
            out += b"--" + boundary + b"\r\n"
            disp = b'Content-Disposition: form-data; name="' + name + b'"'
            if filename is not None:
                disp += b'; filename="' + filename + b'"'
            out += disp + b"\r\nContent-Type: application/octet-stream\r\n\r\n" + body + b"\r\n"
        return out + b"--" + boundary + b"--\r\n"
    ct = b"multipart/form-data; boundary="
    for step in (0, 1, 7):
        b = b"----formdata-undici-0"
        put("multipart", bytes([step]) + ct + b + b"\n" + form(b, [(b"file", b"a.txt", b"hi")]))
        put("multipart", bytes([step]) + ct + b'"a b:c"\n' + form(b"a b:c", [
            (b"file", b"x/y.bin", b"\r\n--a b:" + bytes(range(256))),
            (b"file", None, b"")]))
    put("multipart", b"\x03" + ct + b"q\nPREAMBLE\r\n--q\r\nContent-Disposition: form-data; "
        b"name=\"f\"; filename*=UTF-8''%C3%A9.txt\r\n\r\nbody\r\n--q--\r\nEPILOGUE")


def gzip_bodies():
    for data in [b"", b"hello world\n" * 10, bytes(range(256)) * 4]:
        gz = gzip.compress(data)
        put("gzip", b"\x00" + gz)  # gzip, one piece per byte... step from the top bits
        put("gzip", b"\xfc" + gz + gz)  # two members
        put("gzip", b"\x02" + zlib.compress(data))  # deflate
    put("gzip", b"\x00" + gzip.compress(b"\x00" * (2 << 20)))  # a small bomb past the cap
    put("gzip", b"\x00" + gzip.compress(b"truncated")[:-6])


def connect():
    msg = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                                  "envs": {"A": "1"}, "cwd": "/home/user"}, "stdin": False})
    put("connect", "application/json|5000|1\n" + msg)
    put("connect", "application/json; charset=utf-8||\n" + json.dumps({"path": "/home/user"}))
    env = struct.pack(">BI", 0, len(msg)) + msg.encode()
    put("connect", b"application/connect+json|60000|1\n" + env)
    put("connect", b"application/connect+json\n" + struct.pack(">BI", 1, 2) + b"{}")
    put("connect", b"application/connect+json\n" + struct.pack(">BI", 2, 2) + b"{}")
    put("connect", b"application/proto\n\x0a\x00")


def tar_restore():
    def tar(entries, fmt=tarfile.PAX_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
            for name, kind, arg in entries:
                ti = tarfile.TarInfo(name)
                ti.mtime = 1700000000
                if kind == "file":
                    ti.size = len(arg)
                    ti.mode = 0o644
                    t.addfile(ti, io.BytesIO(arg))
                    continue
                ti.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                           "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}[kind]
                ti.mode = 0o755
                if kind in ("sym", "hard"):
                    ti.linkname = arg
                t.addfile(ti)
        return buf.getvalue()
    good = tar([("./", "dir", None), ("./src", "dir", None), ("./src/a.py", "file", b"print(1)\n"),
                ("./link", "sym", "src/a.py"), ("./" + "d/" * 20 + "deep", "file", b"x"),
                ("./" + "n" * 200, "file", b"long name")])
    put("tar_restore", b"\x01" + good)
    put("tar_restore", b"\x01" + tar([("a", "file", b"1")], tarfile.USTAR_FORMAT))
    put("tar_restore", b"\x01" + tar([("a", "file", b"1")], tarfile.GNU_FORMAT))
    for hostile in [[("../escape", "file", b"x")], [("/abs", "file", b"x")],
                    [("l", "sym", "/etc"), ("l/passwd", "file", b"x")],
                    [("l", "sym", ".."), ("l/x", "file", b"x")],
                    [("h", "hard", "/etc/passwd")], [("f", "fifo", None)], [("c", "chr", None)],
                    [("a", "file", b"1"), ("a", "file", b"2")],
                    [("a", "file", b"1"), ("a/b", "file", b"2")]]:
        put("tar_restore", b"\x01" + tar(hostile))
    put("tar_restore", b"\x00" + b"\x28\xb5\x2f\xfd" + b"\x00" * 16)  # a zstd magic, then junk
    put("tar_restore", b"\x00")


if __name__ == "__main__":
    v1_json()
    mcp()
    runner_frames()
    template_yaml()
    config_yaml()
    langbot()
    multipart()
    gzip_bodies()
    connect()
    tar_restore()
    for h in sorted(os.listdir(CORPUS)):
        print(h, len(os.listdir(os.path.join(CORPUS, h))))
