// The runner protocol library against the byte-exact frames of shared/PROTOCOLS.md part 1.
#include "runner/protocol.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

namespace agentbox::runner::proto {
namespace {

TEST(RunnerProtocol, RegisterFrameIsXbotsBytes) {
  RegisterBody b{.user_id = "U", .auth_token = "T", .workspace = "/abs/ws", .shell = "/bin/bash"};
  Envelope e{.id = "", .type = "register", .user_id = "U", .body = to_json(b)};
  EXPECT_EQ(
      encode(e),
      R"({"type":"register","user_id":"U","body":{"user_id":"U","auth_token":"T","workspace":"/abs/ws","shell":"/bin/bash"}})");
  b.version = kChunkedVersion;
  e.body = to_json(b);
  EXPECT_EQ(
      encode(e),
      R"({"type":"register","user_id":"U","body":{"user_id":"U","auth_token":"T","workspace":"/abs/ws","shell":"/bin/bash","version":1}})");
}

TEST(RunnerProtocol, RegisterOkAndErrorAreXbotsBytes) {
  EXPECT_EQ(frame("", type::kRegisterOk, to_json(RegisterOk{})),
            R"({"type":"register_ok","body":{"status":"ok"}})");
  EXPECT_EQ(error_frame("", "AUTH_FAILED", "authentication failed"),
            R"({"type":"error","body":{"message":"authentication failed","code":"AUTH_FAILED"}})");
  EXPECT_EQ(error_frame("req_1", "", "x"),
            R"({"id":"req_1","type":"error","body":{"message":"x"}})");
}

TEST(RunnerProtocol, DecodesXbotsRegisterOkWithoutVersion) {
  auto e = decode(R"({"type":"register_ok","body":{"status":"ok"}})");
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->type, "register_ok");
  EXPECT_TRUE(e->id.empty());
  auto ok = body_as<RegisterOk>(*e);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, "ok");
  EXPECT_EQ(ok->version, 0);
}

TEST(RunnerProtocol, DecodesXbotsPtyStdinErrorReply) {
  auto e = decode(
      R"({"type":"error","body":{"code":"EINVAL","message":"unknown request type: pty_stdin"}})");
  ASSERT_TRUE(e);
  auto b = body_as<ErrorBody>(*e);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->code, "EINVAL");
  EXPECT_EQ(b->message, "unknown request type: pty_stdin");
}

TEST(RunnerProtocol, ExecRequestBothWays) {
  const char* text =
      R"({"id":"req_00112233aabbccdd","type":"exec","user_id":"alice","body":{"command":"/bin/bash","args":["/bin/bash","-l","-c","echo hi"],"shell":false,"dir":"/ws","env":["A=1"],"stdin":"in","timeout":60,"run_as_user":"bob"}})";
  auto e = decode(text);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->id, "req_00112233aabbccdd");
  EXPECT_EQ(e->user_id, "alice");
  auto r = body_as<ExecRequest>(*e);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->command, "/bin/bash");
  EXPECT_EQ(r->args, (std::vector<std::string>{"/bin/bash", "-l", "-c", "echo hi"}));
  EXPECT_FALSE(r->shell);
  EXPECT_EQ(r->dir, "/ws");
  EXPECT_EQ(r->env, std::vector<std::string>{"A=1"});
  EXPECT_EQ(r->stdin_data, "in");
  EXPECT_EQ(r->timeout, 60);
  EXPECT_EQ(r->run_as_user, "bob");
  Envelope back{.id = e->id, .type = "exec", .user_id = "alice", .body = to_json(*r)};
  EXPECT_EQ(encode(back), text);
  // omitempty fields vanish
  ExecRequest min{.command = "ls", .shell = true, .timeout = 5};
  EXPECT_EQ(frame("req_1", type::kExec, to_json(min)),
            R"({"id":"req_1","type":"exec","body":{"command":"ls","shell":true,"timeout":5}})");
}

TEST(RunnerProtocol, ExecResultHasAllFourFields) {
  EXPECT_EQ(
      frame("req_1", type::kExecResult, to_json(ExecResult{})),
      R"({"id":"req_1","type":"exec_result","body":{"stdout":"","stderr":"","exit_code":0,"timed_out":false}})");
}

TEST(RunnerProtocol, GoEscapesHtmlAndReplacesInvalidUtf8) {
  ExecResult r{.stdout_data = "a<b>&c\xe2\x80\xa8 \xff", .exit_code = -1};
  EXPECT_EQ(frame("", type::kExecResult, to_json(r)),
            "{\"type\":\"exec_result\",\"body\":{\"stdout\":\"a\\u003cb\\u003e\\u0026c\\u2028 "
            "\xef\xbf\xbd\",\"stderr\":\"\",\"exit_code\":-1,\"timed_out\":false}}");
}

TEST(RunnerProtocol, OkRepliesWithAndWithoutBody) {
  EXPECT_EQ(frame("req_1", type::kOk, std::nullopt), R"({"id":"req_1","type":"ok"})");
  EXPECT_EQ(frame("req_2", type::kOk, to_json(StreamRequest{"s1"})),
            R"({"id":"req_2","type":"ok","body":{"stream_id":"s1"}})");
  EXPECT_EQ(frame("req_3", type::kOk, to_json(SizeBody{42})),
            R"({"id":"req_3","type":"ok","body":{"size":42}})");
  auto e = decode(R"({"id":"req_1","type":"ok"})");
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->body.has_value());
}

TEST(RunnerProtocol, FileBodies) {
  auto e = decode(
      R"({"id":"req_1","type":"write_file","user_id":"u","body":{"path":"/ws/a.txt","data":"aGVsbG8=","perm":420}})");
  ASSERT_TRUE(e);
  auto w = body_as<WriteFileRequest>(*e);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->path, "/ws/a.txt");
  EXPECT_EQ(w->data, "hello");
  EXPECT_EQ(w->perm, 420u);
  EXPECT_EQ(
      encode(Envelope{"req_1", "write_file", "u", to_json(*w)}),
      R"({"id":"req_1","type":"write_file","user_id":"u","body":{"path":"/ws/a.txt","data":"aGVsbG8=","perm":420}})");
  // bad base64 in write_file is EIO, as xbot's os error mapping gives
  auto bad = decode(R"({"id":"r","type":"write_file","body":{"path":"a","data":"!!"}})");
  auto wb = body_as<WriteFileRequest>(*bad);
  ASSERT_FALSE(wb);
  EXPECT_EQ(wb.error().code, Code::kInternal);

  EXPECT_EQ(frame("r", type::kFileContent, to_json(FileContent{"hello"})),
            R"({"id":"r","type":"file_content","body":{"data":"aGVsbG8="}})");
  FileInfo fi{.name = "d",
              .size = 4096,
              .mode = 2147484141u,
              .mod_time = "2026-08-23T10:00:00Z",
              .is_dir = true};
  EXPECT_EQ(
      frame("r", type::kFileInfo, to_json(fi)),
      R"({"id":"r","type":"file_info","body":{"name":"d","size":4096,"mode":2147484141,"mod_time":"2026-08-23T10:00:00Z","is_dir":true}})");
  EXPECT_EQ(frame("r", type::kDirEntries, to_json(DirEntries{})),
            R"({"id":"r","type":"dir_entries","body":{"entries":[]}})");
  DirEntries de{{{"a", false, 3}, {"b", true, 4096}}};
  std::string t = frame("r", type::kDirEntries, to_json(de));
  EXPECT_EQ(
      t,
      R"({"id":"r","type":"dir_entries","body":{"entries":[{"name":"a","is_dir":false,"size":3},{"name":"b","is_dir":true,"size":4096}]}})");
  auto de2 = body_as<DirEntries>(*decode(t));
  ASSERT_TRUE(de2);
  ASSERT_EQ(de2->entries.size(), 2u);
  EXPECT_EQ(de2->entries[1].name, "b");
  EXPECT_TRUE(de2->entries[1].is_dir);
  EXPECT_EQ(frame("r", type::kMkdirAll, to_json(MkdirAllRequest{"/ws/d", 0})),
            R"({"id":"r","type":"mkdir_all","body":{"path":"/ws/d"}})");
  EXPECT_EQ(frame("r", type::kMkdirAll, to_json(MkdirAllRequest{"/ws/d", 0755})),
            R"({"id":"r","type":"mkdir_all","body":{"path":"/ws/d","perm":493}})");
  EXPECT_EQ(
      frame("r", type::kDownloadFile, to_json(DownloadRequest{"http://127.0.0.1:1/x", "o"})),
      R"({"id":"r","type":"download_file","body":{"url":"http://127.0.0.1:1/x","output_path":"o"}})");
}

TEST(RunnerProtocol, BackgroundAndStreamBodies) {
  BgOutput o{.task_id = "t1", .status = "running", .stdout_data = "x"};
  EXPECT_EQ(
      frame("r", type::kBgOutput, to_json(o)),
      R"({"id":"r","type":"bg_output","body":{"task_id":"t1","status":"running","stdout":"x","stderr":""}})");
  o.status = "completed";
  o.exit_code = 3;
  EXPECT_EQ(
      frame("r", type::kBgOutput, to_json(o)),
      R"({"id":"r","type":"bg_output","body":{"task_id":"t1","status":"completed","exit_code":3,"stdout":"x","stderr":""}})");
  EXPECT_EQ(frame("r", type::kBgStarted, to_json(TaskRequest{"t1"})),
            R"({"id":"r","type":"bg_started","body":{"task_id":"t1"}})");
  // stdio_write comes without an id
  auto w = decode(R"({"type":"stdio_write","user_id":"u","body":{"stream_id":"s","data":"aGk="}})");
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->id.empty());
  auto sd = body_as<StreamData>(*w);
  ASSERT_TRUE(sd);
  EXPECT_EQ(sd->data, "hi");
  EXPECT_EQ(frame("", type::kStdioData, to_json(StreamData{"s", "hi"})),
            R"({"type":"stdio_data","body":{"stream_id":"s","data":"aGk="}})");
  EXPECT_EQ(frame("", type::kStdioExit, to_json(StreamExit{"s", 0, ""})),
            R"({"type":"stdio_exit","body":{"stream_id":"s","exit_code":0}})");
  EXPECT_EQ(
      frame("", type::kPtyExit, to_json(StreamExit{"p", -1, "signal: killed"})),
      R"({"type":"pty_exit","body":{"stream_id":"p","exit_code":-1,"error":"signal: killed"}})");
  auto pc = body_as<PtyCreate>(*decode(
      R"({"id":"r","type":"pty_create","body":{"stream_id":"p","command":"bash","cols":100,"rows":30}})"));
  ASSERT_TRUE(pc);
  EXPECT_EQ(pc->cols, 100);
  EXPECT_EQ(pc->rows, 30);
  auto big =
      body_as<PtyResize>(*decode(R"({"type":"pty_resize","body":{"stream_id":"p","cols":70000}})"));
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().message.find("'cols'"), std::string::npos);
  EXPECT_TRUE(is_push("stdio_data"));
  EXPECT_TRUE(is_push("pty_exit"));
  EXPECT_FALSE(is_push("ok"));
}

TEST(RunnerProtocol, BodiesDecodeAsGoUnmarshals) {
  // missing body: EINVAL; null body: zero values; unknown fields ignored; wrong type: EINVAL
  auto missing = body_as<PathRequest>(*decode(R"({"id":"r","type":"stat"})"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Code::kInvalid);
  auto null = body_as<ExecRequest>(*decode(R"({"id":"r","type":"exec","body":null})"));
  ASSERT_TRUE(null);
  EXPECT_EQ(null->command, "");
  EXPECT_EQ(null->timeout, 0);
  auto extra = body_as<PathRequest>(
      *decode(R"({"id":"r","type":"remove","body":{"path":"p","perm":0,"zzz":[1]}})"));
  ASSERT_TRUE(extra);
  EXPECT_EQ(extra->path, "p");
  auto wrong = body_as<ExecRequest>(*decode(R"({"id":"r","type":"exec","body":{"command":5}})"));
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code, Code::kInvalid);
  EXPECT_NE(wrong.error().message.find("'command'"), std::string::npos);
  auto frac = body_as<ExecRequest>(*decode(R"({"id":"r","type":"exec","body":{"timeout":1.5}})"));
  EXPECT_FALSE(frac);
  auto arr = body_as<ExecRequest>(*decode(R"({"id":"r","type":"exec","body":{"args":"ls"}})"));
  EXPECT_FALSE(arr);
  EXPECT_FALSE(decode("not json"));
  EXPECT_FALSE(decode("[1]"));
  EXPECT_FALSE(decode(R"({"id":"r"})"));
  EXPECT_FALSE(decode(R"({"id":5,"type":"x"})"));
}

TEST(RunnerProtocol, ChunkedTransferBodies) {
  EXPECT_EQ(
      frame("r", type::kFileBegin, to_json(FileBegin{"/ws/big", 0644, 5000000})),
      R"({"id":"r","type":"file_begin","body":{"path":"/ws/big","perm":420,"size":5000000}})");
  EXPECT_EQ(frame("r", type::kFileBegin, to_json(FileBegin{"", 0, 5000000})),
            R"({"id":"r","type":"file_begin","body":{"size":5000000}})");
  EXPECT_EQ(frame("r", type::kFileChunk, to_json(FileChunk{1048576, "abc"})),
            R"({"id":"r","type":"file_chunk","body":{"offset":1048576,"data":"YWJj"}})");
  // The fast chunk encoder writes the same bytes as the Json path, user_id and escaping included.
  EXPECT_EQ(chunk_frame("r", "", 1048576, "abc"),
            frame("r", type::kFileChunk, to_json(FileChunk{1048576, "abc"})));
  std::string bin(3000, '\0');
  for (std::size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<char>(i * 7);
  EXPECT_EQ(chunk_frame("id<\"&>", "u1", 0, bin),
            encode(Envelope{"id<\"&>", std::string(type::kFileChunk), "u1",
                            to_json(FileChunk{0, bin})}));
  EXPECT_EQ(chunk_frame("r", "", 0, ""),
            R"({"id":"r","type":"file_chunk","body":{"offset":0,"data":""}})");
  EXPECT_EQ(frame("r", type::kFileEnd, to_json(FileEnd{5000000})),
            R"({"id":"r","type":"file_end","body":{"size":5000000}})");
  EXPECT_EQ(frame("r", type::kAck, to_json(Ack{2097152})),
            R"({"id":"r","type":"ack","body":{"offset":2097152}})");
  auto neg = body_as<FileChunk>(
      *decode(R"({"id":"r","type":"file_chunk","body":{"offset":-1,"data":""}})"));
  EXPECT_FALSE(neg);
}

// Version 2 (docs/runner-protocol.md "Process streams"): optional fields, omitted at their zero
// value so that the frames of xbot's protocol stay byte for byte the same.
TEST(RunnerProtocol, ProcessStreamBodies) {
  StdioStart st{"s", "/bin/sh", {"-c", "x"}, {}, "/ws"};
  EXPECT_EQ(
      frame("r", type::kStdioStart, to_json(st)),
      R"({"id":"r","type":"stdio_start","body":{"stream_id":"s","command":"/bin/sh","args":["-c","x"],"dir":"/ws"}})");
  st.stderr_pipe = true;
  auto back = body_as<StdioStart>(*decode(frame("r", type::kStdioStart, to_json(st))));
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->stderr_pipe);
  StreamData d{"s", "hi"};
  d.is_stderr = true;
  EXPECT_EQ(frame("", type::kStdioData, to_json(d)),
            R"({"type":"stdio_data","body":{"stream_id":"s","data":"aGk=","stderr":true}})");
  StreamData eof{"s", ""};
  eof.eof = true;
  auto e = body_as<StreamData>(*decode(frame("", type::kStdioWrite, to_json(eof))));
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->eof);
  EXPECT_FALSE(e->is_stderr);
  EXPECT_EQ(frame("r", type::kOk, to_json(StreamRequest{"s"})),
            R"({"id":"r","type":"ok","body":{"stream_id":"s"}})");
  EXPECT_EQ(frame("r", type::kOk, to_json(StreamRequest{"s", 4242})),
            R"({"id":"r","type":"ok","body":{"stream_id":"s","pid":4242}})");
  StreamExit x{"s", -1, "signal: killed"};
  x.signal = 9;
  EXPECT_EQ(
      frame("", type::kStdioExit, to_json(x)),
      R"({"type":"stdio_exit","body":{"stream_id":"s","exit_code":-1,"error":"signal: killed","signal":9}})");
  EXPECT_EQ(frame("r", type::kStdioSignal, to_json(StreamSignal{"s", 15, true})),
            R"({"id":"r","type":"stdio_signal","body":{"stream_id":"s","signal":15,"group":true}})");
  auto sig = body_as<StreamSignal>(
      *decode(R"({"id":"r","type":"stdio_signal","body":{"stream_id":"s","signal":2}})"));
  ASSERT_TRUE(sig);
  EXPECT_EQ(sig->signal, 2);
  EXPECT_FALSE(sig->group);
  auto bad = body_as<StreamSignal>(
      *decode(R"({"id":"r","type":"stdio_signal","body":{"stream_id":"s","signal":"TERM"}})"));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("'signal'"), std::string::npos);
  EXPECT_FALSE(is_push("stdio_signal"));
}

TEST(RunnerProtocol, GoFileModeBits) {
  EXPECT_EQ(go_mode_from_st_mode(S_IFDIR | 0755), 2147484141u);
  EXPECT_EQ(go_mode_from_st_mode(S_IFREG | 0644), 420u);
  EXPECT_EQ(go_mode_from_st_mode(S_IFLNK | 0777), gomode::kSymlink | 0777);
  EXPECT_EQ(go_mode_from_st_mode(S_IFCHR | 0666), gomode::kDevice | gomode::kCharDevice | 0666);
  EXPECT_EQ(go_mode_from_st_mode(S_IFDIR | S_ISVTX | 0777), gomode::kDir | gomode::kSticky | 0777);
  EXPECT_EQ(go_mode_from_st_mode(S_IFREG | S_ISUID | 0755), gomode::kSetuid | 0755);
  EXPECT_EQ(st_mode_from_go_mode(2147484141u), static_cast<mode_t>(S_IFDIR | 0755));
  EXPECT_EQ(st_mode_from_go_mode(420u), static_cast<mode_t>(S_IFREG | 0644));
  EXPECT_EQ(st_mode_from_go_mode(gomode::kDevice | gomode::kCharDevice | 0600),
            static_cast<mode_t>(S_IFCHR | 0600));
  EXPECT_EQ(perm_from_go(gomode::kDir | gomode::kSetgid | 0750),
            static_cast<mode_t>(S_ISGID | 0750));
  EXPECT_EQ(go_perm_from_mode(S_ISVTX | 01777), gomode::kSticky | 0777);
}

TEST(RunnerProtocol, ErrorCodesAsXbotMapsThem) {
  EXPECT_EQ(code_for_errno(ENOENT), "ENOENT");
  EXPECT_EQ(code_for_errno(EEXIST), "EEXIST");
  EXPECT_EQ(code_for_errno(ENOTEMPTY), "EEXIST");
  EXPECT_EQ(code_for_errno(EACCES), "EPERM");
  EXPECT_EQ(code_for_errno(EPERM), "EPERM");
  EXPECT_EQ(code_for_errno(EXDEV), "EPERM");
  EXPECT_EQ(code_for_errno(EISDIR), "EIO");
  EXPECT_EQ(code_for_errno(ENOTDIR), "EIO");
  EXPECT_EQ(to_code("ENOENT"), Code::kNotFound);
  EXPECT_EQ(to_code("EPERM"), Code::kAccess);
  EXPECT_EQ(to_code("ENOTSUP"), Code::kNotSupported);
  EXPECT_EQ(to_code("EIO"), Code::kInternal);
  EXPECT_EQ(to_code("internal_error"), Code::kInternal);
}

TEST(RunnerProtocol, Base64AsGoStdEncoding) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode(std::string("\x00\xff\xfe", 3)), "AP/+");
  EXPECT_EQ(base64_decode("Zm9vYg==").value(), "foob");
  EXPECT_EQ(base64_decode("Zm9v\r\nYmE=").value(), "fooba");
  EXPECT_EQ(base64_decode("").value(), "");
  EXPECT_FALSE(base64_decode("Zm9"));
  EXPECT_FALSE(base64_decode("Zm9v!A=="));
  EXPECT_FALSE(base64_decode("Zg==Zg=="));
  EXPECT_FALSE(base64_decode("Z==="));
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  EXPECT_EQ(base64_decode(base64_encode(all)).value(), all);
}

TEST(RunnerProtocol, ModTimeIsRfc3339LocalSeconds) {
  const char* old = getenv("TZ");
  std::string saved = old ? old : "";
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(format_mod_time(1787479200), "2026-08-23T10:00:00Z");
  setenv("TZ", "CET-1CEST,M3.5.0,M10.5.0/3", 1);
  tzset();
  EXPECT_EQ(format_mod_time(1787479200), "2026-08-23T12:00:00+02:00");
  if (old)
    setenv("TZ", saved.c_str(), 1);
  else
    unsetenv("TZ");
  tzset();
  EXPECT_EQ(parse_mod_time("2026-08-23T12:00:00+02:00").value(), 1787479200);
  EXPECT_EQ(parse_mod_time("2026-08-23T10:00:00.123456Z").value(), 1787479200);
  EXPECT_FALSE(parse_mod_time("2026-08-23 10:00:00"));
}

TEST(RunnerProtocol, GeneratedIdsLookLikeXbots) {
  std::string a = generate_id(), b = generate_id();
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(a.rfind("req_", 0), 0u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 4), std::string::npos);
  EXPECT_NE(a, b);
}

// docs/runner-protocol.md "Limits": `enforces` after `version` (omitted when empty, so an xbot
// peer sees xbot's frame), and a request's `box` and `limits`.
TEST(RunnerProtocol, EnforcesAndBoxLimits) {
  RegisterBody b{.user_id = "U",
                 .auth_token = "T",
                 .workspace = "/w",
                 .shell = "/bin/sh",
                 .version = 3,
                 .enforces = {"timeout", "memory_mb"}};
  const std::string text = frame("", type::kRegister, to_json(b));
  EXPECT_EQ(
      text,
      R"({"type":"register","body":{"user_id":"U","auth_token":"T","workspace":"/w","shell":"/bin/sh","version":3,"enforces":["timeout","memory_mb"]}})");
  auto back = body_as<RegisterBody>(*decode(text));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->enforces, (std::vector<std::string>{"timeout", "memory_mb"}));
  Json body = to_json(StdioStart{.stream_id = "s", .command = "sh"});
  add_box_limits(body, BoxLimits{});
  EXPECT_EQ(body.dump(), R"({"stream_id":"s","command":"sh"})");
  add_box_limits(body, BoxLimits{"sess-1", {{"memory_mb", 64}, {"max_pids", 8}}});
  EXPECT_EQ(
      body.dump(),
      R"({"stream_id":"s","command":"sh","box":"sess-1","limits":{"max_pids":8,"memory_mb":64}})");
  auto l = body_as<BoxLimits>(Envelope{"r", "stdio_start", "", body, std::nullopt});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->box, "sess-1");
  EXPECT_EQ(l->limits.at("memory_mb"), 64u);
  EXPECT_TRUE(body_as<BoxLimits>(Envelope{"r", "exec", "", Json::object(), std::nullopt}));
  for (const char* bad :
       {R"({"box":"../x","limits":{"memory_mb":1}})", R"({"box":"b","limits":{"memory_mb":0}})",
        R"({"box":"b","limits":{"memory_mb":"lots"}})", R"({"box":"b","limits":[1]})"}) {
    auto r = body_as<BoxLimits>(Envelope{"r", "exec", "", Json::parse(bad), std::nullopt});
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, Code::kInvalid) << bad;
  }
}

// Seed 003's flat form: the fields beside id and type become the body; an envelope stays one.
TEST(RunnerProtocol, FlatFormDecodesAsTheEnvelope) {
  auto flat = decode_flat_or_envelope(
      R"({"id":"req_1","type":"exec_result","stdout":"hi\n","stderr":"","exit_code":3,"timed_out":false})");
  ASSERT_TRUE(flat);
  EXPECT_EQ(flat->id, "req_1");
  auto r = body_as<ExecResult>(*flat);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stdout_data, "hi\n");
  EXPECT_EQ(r->exit_code, 3);
  auto err = decode_flat_or_envelope(
      R"({"id":"req_2","type":"error","message":"file not found","code":"ENOENT"})");
  ASSERT_TRUE(err);
  auto eb = body_as<ErrorBody>(*err);
  ASSERT_TRUE(eb);
  EXPECT_EQ(eb->code, "ENOENT");
  EXPECT_EQ(eb->message, "file not found");
  // Nothing beside id/type/user_id: no body, as decode() says.
  auto ok = decode_flat_or_envelope(R"({"id":"req_3","type":"ok"})");
  ASSERT_TRUE(ok);
  EXPECT_FALSE(ok->body.has_value());
  // An envelope is read as it is (its top-level extras ignored).
  auto env =
      decode_flat_or_envelope(R"({"id":"i","type":"file_content","body":{"data":"YQ=="},"x":1})");
  ASSERT_TRUE(env);
  EXPECT_EQ(env->body->dump(), R"({"data":"YQ=="})");
  EXPECT_FALSE(decode_flat_or_envelope("not json"));
}

// Version 3 (docs/runner-protocol.md): the register frame says 3, register_ok answers the
// highest version both speak, and a chunk's bytes travel in a binary frame.
TEST(RunnerProtocol, Version3RegisterAndNegotiation) {
  RegisterBody b{.user_id = "U", .auth_token = "T", .workspace = "/w", .shell = "/bin/sh",
                 .version = kProtocolVersion};
  EXPECT_EQ(
      frame("", type::kRegister, to_json(b)),
      R"({"type":"register","body":{"user_id":"U","auth_token":"T","workspace":"/w","shell":"/bin/sh","version":3}})");
  EXPECT_EQ(frame("", type::kRegisterOk, to_json(RegisterOk{"ok", 3})),
            R"({"type":"register_ok","body":{"status":"ok","version":3}})");
  EXPECT_EQ(negotiate(0), 0);  // xbot's runner: the plain form
  EXPECT_EQ(negotiate(1), 1);  // older agentbox-runners: text chunks
  EXPECT_EQ(negotiate(2), 2);
  EXPECT_EQ(negotiate(3), 3);
  EXPECT_EQ(negotiate(7), 3);  // a newer one: what we speak
  EXPECT_EQ(negotiate(-3), 0);
  EXPECT_EQ(negotiate(3, 2), 2);  // a runner of 3 told 2 by an older server
  EXPECT_EQ(negotiate(0, 3), 0);  // xbot's server answers no version
  // An upload of a size not known yet (version 3 only) decodes; other negative sizes do not.
  auto unknown = body_as<FileBegin>(
      *decode(R"({"id":"r","type":"file_begin","body":{"path":"/w/f","perm":420,"size":-1}})"));
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->size, kSizeUnknown);
  EXPECT_EQ(frame("r", type::kFileBegin, to_json(FileBegin{"/w/f", 0644, kSizeUnknown})),
            R"({"id":"r","type":"file_begin","body":{"path":"/w/f","perm":420,"size":-1}})");
  EXPECT_FALSE(body_as<FileBegin>(*decode(R"({"id":"r","type":"file_begin","body":{"size":-2}})")));
}

TEST(RunnerProtocol, BinaryChunkFrameBytes) {
  using namespace std::string_literals;
  // kind 1, id length 3, "r_1", offset 0x0000000000100001 big-endian, then the raw bytes.
  EXPECT_EQ(binary_chunk("r_1", 1048577, "ab\0c"s),
            "\x01\x03r_1\x00\x00\x00\x00\x00\x10\x00\x01"s "ab\0c"s);
  EXPECT_EQ(binary_chunk("x", 0, ""), "\x01\x01x\x00\x00\x00\x00\x00\x00\x00\x00"s);
  EXPECT_EQ(binary_chunk_header_size("req_0123456789abcdef"), 2u + 20u + 8u);
  // The header alone has room for the bytes the caller reads into it.
  std::string h = binary_chunk_header("r_1", 1048577, 4);
  ASSERT_EQ(h.size(), 13u + 4u);
  h.replace(13, 4, "ab\0c"s);
  EXPECT_EQ(h, binary_chunk("r_1", 1048577, "ab\0c"s));
  // Round trip, every byte value, a 40-bit offset.
  std::string bytes(256, '\0');
  for (int i = 0; i < 256; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>(i);
  const std::string f = binary_chunk("req_0123456789abcdef", 0x12'3456'789aLL, bytes);
  auto c = decode_binary_chunk(f);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->id, "req_0123456789abcdef");
  EXPECT_EQ(c->offset, 0x12'3456'789aLL);
  EXPECT_EQ(c->data, bytes);
  auto empty = decode_binary_chunk(binary_chunk("x", 5, ""));
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->data.empty());
  // Bad frames are EINVAL, naming what is wrong.
  for (const std::string& bad :
       {""s, "\x01"s, "\x02\x01x\x00\x00\x00\x00\x00\x00\x00\x00"s,
        "\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00"s, "\x01\x05x\x00\x00\x00\x00\x00\x00\x00\x00"s,
        "\x01\x01x\x80\x00\x00\x00\x00\x00\x00\x00"s}) {
    auto r = decode_binary_chunk(bad);
    EXPECT_FALSE(r) << testing::PrintToString(bad);
    if (!r) {
      EXPECT_EQ(r.error().code, Code::kInvalid);
    }
  }
  EXPECT_NE(decode_binary_chunk("\x02\x01x\x00\x00\x00\x00\x00\x00\x00\x00"s)
                .error()
                .message.find("unknown kind 2"),
            std::string::npos);
}

// Error codes: version 3 sends EISDIR/ENOTDIR/ENOTEMPTY as themselves; from xbot's runner (and
// older ones) the EIO/EEXIST message's Go text tells them apart.
TEST(RunnerProtocol, ErrorCodesOfVersion2AndFromGosMessages) {
  EXPECT_EQ(code_for_errno(EISDIR), "EIO");  // xbot's table, unchanged
  EXPECT_EQ(code_for_errno(ENOTDIR), "EIO");
  EXPECT_EQ(code_for_errno(ENOTEMPTY), "EEXIST");
  EXPECT_EQ(code_for_errno_exact(EISDIR), "EISDIR");
  EXPECT_EQ(code_for_errno_exact(ENOTDIR), "ENOTDIR");
  EXPECT_EQ(code_for_errno_exact(ENOTEMPTY), "ENOTEMPTY");
  EXPECT_EQ(code_for_errno_exact(ENOENT), "ENOENT");
  EXPECT_EQ(code_for_errno_exact(EACCES), "EPERM");
  EXPECT_EQ(code_for_errno_exact(ENOSPC), "EIO");
  EXPECT_EQ(to_code("EISDIR", "read /w/d: is a directory"), Code::kIsDir);
  EXPECT_EQ(to_code("ENOTEMPTY", "remove /w/d: directory not empty"), Code::kNotEmpty);
  EXPECT_EQ(to_code("EIO", "read /w/d: is a directory"), Code::kIsDir);
  EXPECT_EQ(to_code("EIO", "open /w/f.txt: not a directory"), Code::kNotDir);
  EXPECT_EQ(to_code("EEXIST", "remove /w/d: directory not empty"), Code::kNotEmpty);
  EXPECT_EQ(to_code("EEXIST", "mkdir /w/d: file exists"), Code::kExists);
  EXPECT_EQ(to_code("EEXIST", "x: is a directory"), Code::kExists);
  EXPECT_EQ(to_code("EIO", "exec error: fork/exec /bin/x: no such file"), Code::kInternal);
  EXPECT_EQ(to_code("ENOENT", "stat /w/x: not a directory"), Code::kNotFound);  // code wins
}

}  // namespace
}  // namespace agentbox::runner::proto
