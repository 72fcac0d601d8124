// The files side of the E2B dialect (shared/E2B-MCP.md 3.3, 3.4): the stock `e2b` SDK
// (tests/node/e2b_files.mjs) through every files call it makes, and by hand (curl) what the SDK
// does not show: gzip replies, chunked multipart bodies, uploads that fail half-way, bad input
// in E2B's conventions (never a 5xx), refusals by name, and paths that try to leave the box.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

constexpr const char* kToken = "t0k";

std::string node_dir() { return AGENTBOX_NODE_DIR; }

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Raw {
  int status = 0;
  std::string body;
  std::string headers;  // lower-cased
  json j;
};

class E2bFilesRest : public ::testing::Test {
 protected:
  E2bFilesRest() : d_({"--token", kToken}), api_(d_, kToken) {
    Raw r = curl("-X POST -H 'X-API-KEY: " + std::string(kToken) +
                     "' -H 'Content-Type: application/json' --data-binary '{\"templateID\":\"base\"}'",
                 "/v2/sandboxes", false);
    EXPECT_EQ(r.status, 201) << r.body << d_.log();
    id_ = r.j.value("sandboxID", "");
    token_ = r.j.value("envdAccessToken", "");
  }

  // curl against /e2b<path>; `envd` adds the sandbox's routing and access headers.
  Raw curl(const std::string& args, const std::string& path, bool envd = true) {
    std::string hdr = d_.temp_dir() + "/h";
    std::string body = d_.temp_dir() + "/b";
    std::string cmd = "curl -s -D " + hdr + " -o " + body + " -w '%{http_code}' " + args;
    if (envd) {
      cmd += " -H 'E2b-Sandbox-Id: " + id_ + "' -H 'X-Access-Token: " + token_ + "'";
    }
    cmd += " " + quote(d_.url() + "/e2b" + path);
    int st = 0;
    Raw r;
    r.status = std::atoi(run_shell(cmd, &st).c_str());
    r.body = slurp(body);
    r.headers = slurp(hdr);
    for (char& c : r.headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.j = json::parse(r.body, nullptr, false);
    std::filesystem::remove(hdr);
    std::filesystem::remove(body);
    return r;
  }

  // A Connect unary call of filesystem.Filesystem.
  Raw rpc(const std::string& method, const std::string& message) {
    return curl("-X POST -H 'Content-Type: application/json' -H 'Connect-Protocol-Version: 1' "
                "--data-binary " + quote(message),
                "/filesystem.Filesystem/" + method);
  }

  // What the session user sees in its workspace (through the native API).
  std::string read(const std::string& path) {
    auto r = api_.get(files_target(id_, path));
    return r.status == 200 ? r.raw : "<HTTP " + std::to_string(r.status) + ">";
  }

  Daemon d_;
  Api api_;
  std::string id_;
  std::string token_;
};

TEST(E2bFilesSdk, TheStockSdkUsesEveryFileCall) {
  ASSERT_TRUE(std::filesystem::exists(node_dir() + "/node_modules/e2b/package.json"))
      << "the e2b SDK is not installed: run scripts/bootstrap";
  Daemon d({"--token", kToken});
  std::string url = d.url() + "/e2b";
  int status = -1;
  std::string out = run_shell("cd " + node_dir() + " && E2B_API_URL=" + url + " E2B_SANDBOX_URL=" +
                            url + " E2B_API_KEY=" + kToken + " node e2b_files.mjs 2>&1",
                        &status);
  for (const char* c : {"write_and_read_text", "write_and_read_bytes", "write_multiple_files",
                        "write_gzip_and_octet_stream", "list_with_depth", "make_dir_and_exists",
                        "rename", "get_info", "remove", "watch_dir",
                        "bad_input_in_e2b_conventions"}) {
    EXPECT_NE(out.find(std::string("ok ") + c + "\n"), std::string::npos) << c << "\n" << out;
  }
  EXPECT_EQ(status, 0) << out << "\n" << d.log();
}

TEST_F(E2bFilesRest, GzipUploadsAndGzipReplies) {
  ASSERT_FALSE(id_.empty());
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "line " + std::to_string(i) + "\n";
  ASSERT_TRUE(spit(d_.temp_dir() + "/plain", text));
  int st = 0;
  run_shell("gzip -c " + d_.temp_dir() + "/plain > " + d_.temp_dir() + "/plain.gz", &st);
  ASSERT_EQ(st, 0);
  // A chunked, gzip-encoded octet-stream body, as the SDK sends with {gzip: true}.
  Raw up = curl("-X POST -H 'Content-Type: application/octet-stream' -H 'Content-Encoding: gzip' "
                "-H 'Transfer-Encoding: chunked' --data-binary @" + d_.temp_dir() + "/plain.gz",
                "/files?path=gz/plain.txt");
  ASSERT_EQ(up.status, 200) << up.body;
  ASSERT_TRUE(up.j.is_array() && up.j.size() == 1) << up.body;
  EXPECT_EQ(up.j[0]["path"], "/workspace/gz/plain.txt");
  EXPECT_EQ(up.j[0]["type"], "file");
  EXPECT_EQ(read("gz/plain.txt"), text);

  // Asked for gzip, the reply is gzip; curl --compressed inflates it back.
  Raw gz = curl("-H 'Accept-Encoding: gzip'", "/files?path=gz/plain.txt");
  EXPECT_EQ(gz.status, 200);
  EXPECT_NE(gz.headers.find("content-encoding: gzip"), std::string::npos) << gz.headers;
  ASSERT_GE(gz.body.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(gz.body[0]), 0x1f);
  EXPECT_LT(gz.body.size(), text.size() / 3);
  EXPECT_EQ(curl("--compressed", "/files?path=gz/plain.txt").body, text);
  // Not asked: plain bytes with a Content-Length.
  Raw plain = curl("", "/files?path=gz/plain.txt");
  EXPECT_EQ(plain.body, text);
  EXPECT_EQ(plain.headers.find("content-encoding"), std::string::npos);
  EXPECT_NE(plain.headers.find("content-length: " + std::to_string(text.size())),
            std::string::npos);
  // An empty file is Content-Length: 0 even to a gzip client (the SDK special-cases it).
  ASSERT_EQ(curl("-X POST -H 'Content-Type: application/octet-stream' --data-binary ''",
                 "/files?path=empty").status,
            200);
  Raw empty = curl("-H 'Accept-Encoding: gzip'", "/files?path=empty");
  EXPECT_EQ(empty.status, 200);
  EXPECT_NE(empty.headers.find("content-length: 0"), std::string::npos) << empty.headers;
}

TEST_F(E2bFilesRest, ChunkedMultipartWithManyFiles) {
  ASSERT_FALSE(id_.empty());
  ASSERT_TRUE(spit(d_.temp_dir() + "/one", "first"));
  std::string big(3u << 20, 'b');
  ASSERT_TRUE(spit(d_.temp_dir() + "/two", big));
  Raw r = curl("-H 'Transfer-Encoding: chunked' -F 'note=ignored' "
               "-F 'file=@" + d_.temp_dir() + "/one;filename=m/one.txt' "
               "-F 'file=@" + d_.temp_dir() + "/two;filename=/workspace/m/deep/two.bin'",
               "/files");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j.size(), 2u) << r.body;
  EXPECT_EQ(r.j[0]["path"], "/workspace/m/one.txt");
  EXPECT_EQ(r.j[1]["path"], "/workspace/m/deep/two.bin");
  EXPECT_EQ(r.j[1]["name"], "two.bin");
  EXPECT_EQ(read("m/one.txt"), "first");
  EXPECT_EQ(read("m/deep/two.bin").size(), big.size());
  // ?path= names the destination of a single-file form.
  Raw one = curl("-F 'file=@" + d_.temp_dir() + "/one;filename=ignored'", "/files?path=named.txt");
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(read("named.txt"), "first");
}

TEST_F(E2bFilesRest, AnUploadThatFailsHalfWayWritesNothing) {
  ASSERT_FALSE(id_.empty());
  ASSERT_EQ(curl("-X POST -H 'Content-Type: application/octet-stream' --data-binary 'old'",
                 "/files?path=keep.txt").status,
            200);
  // The first file is complete, the second part never ends: neither file changes.
  std::string body =
      "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"keep.txt\"\r\n\r\nnew"
      "\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"other.txt\"\r\n\r\n"
      "cut off here";
  ASSERT_TRUE(spit(d_.temp_dir() + "/cut", body));
  Raw r = curl("-X POST -H 'Content-Type: multipart/form-data; boundary=XX' --data-binary @" +
                   d_.temp_dir() + "/cut",
               "/files");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j.value("code", 0), 400) << r.body;
  EXPECT_NE(r.j.value("message", "").find("no closing boundary"), std::string::npos) << r.body;
  EXPECT_EQ(read("keep.txt"), "old");
  EXPECT_EQ(read("other.txt"), "<HTTP 404>");
  // The same path twice in one request: refused, and nothing written.
  std::string twice =
      "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"keep.txt\"\r\n\r\n1"
      "\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/workspace/keep.txt\""
      "\r\n\r\n2\r\n--XX--\r\n";
  ASSERT_TRUE(spit(d_.temp_dir() + "/twice", twice));
  Raw dup = curl("-X POST -H 'Content-Type: multipart/form-data; boundary=XX' --data-binary @" +
                     d_.temp_dir() + "/twice",
                 "/files");
  EXPECT_EQ(dup.status, 400) << dup.body;
  EXPECT_EQ(read("keep.txt"), "old");
}

TEST_F(E2bFilesRest, BadInputIsAnsweredInE2bConventionsNever5xx) {
  ASSERT_FALSE(id_.empty());
  struct Case {
    std::string args;
    std::string path;
    int status;
    std::string says;
  };
  ASSERT_TRUE(spit(d_.temp_dir() + "/junk", "this is not gzip"));
  ASSERT_EQ(rpc("MakeDir", R"({"path":"dd"})").status, 200);
  std::vector<Case> cases = {
      {"", "/files", 400, "path query parameter is required"},
      {"", "/files?path=nope.txt", 404, "nope.txt"},
      {"", "/files?path=/workspace", 400, "EISDIR"},
      {"-X POST -H 'Content-Type: application/octet-stream' --data-binary x", "/files", 400,
       "path query parameter is required"},
      {"-X POST -H 'Content-Type: text/plain' --data-binary x", "/files?path=a", 400,
       "unsupported Content-Type"},
      {"-X POST -H 'Content-Type: multipart/form-data' --data-binary x", "/files", 400,
       "no boundary"},
      {"-X POST -H 'Content-Type: multipart/form-data; boundary=B' --data-binary 'garbage'",
       "/files", 400, "no boundary delimiter"},
      {"-X POST -H 'Content-Type: application/octet-stream' -H 'Content-Encoding: gzip' "
       "--data-binary @" + d_.temp_dir() + "/junk",
       "/files?path=a", 400, "malformed gzip"},
      {"-X POST -H 'Content-Type: application/octet-stream' -H 'Content-Encoding: br' "
       "--data-binary x",
       "/files?path=a", 501, "'br' is not supported"},
      {"", "/files?path=a&signature=v1_abc", 501, "signed file URLs"},
      {"-X POST -H 'X-Metadata-Owner: me' -H 'Content-Type: application/octet-stream' "
       "--data-binary x",
       "/files?path=a", 501, "file metadata"},
      {"", "/files?path=a&username=mallory", 401, "'mallory' does not exist"},
      {"-X POST -H 'Content-Type: application/octet-stream' --data-binary x",
       "/files?path=%2Fworkspace%2Fdd", 400, "EISDIR"},
  };
  for (const auto& c : cases) {
    Raw r = curl(c.args, c.path);
    SCOPED_TRACE(c.args + " " + c.path + " -> " + std::to_string(r.status) + " " + r.body);
    EXPECT_EQ(r.status, c.status);
    EXPECT_EQ(r.j.value("code", 0), c.status);
    EXPECT_NE(r.j.value("message", "").find(c.says), std::string::npos);
    EXPECT_NE(r.headers.find("content-type: application/json"), std::string::npos);
  }
  EXPECT_EQ(read("a"), "<HTTP 404>");

  // Connect: codes by name, JSON bodies.
  struct RpcCase {
    std::string method;
    std::string message;
    int status;
    std::string code;
  };
  std::vector<RpcCase> rpcs = {
      {"Stat", R"({"path":7})", 400, "invalid_argument"},
      {"Stat", R"({"path":"nope"})", 404, "not_found"},
      {"Stat", R"({"path":"a\u0000b"})", 400, "invalid_argument"},
      {"ListDir", R"({"path":".","depth":-1})", 400, "invalid_argument"},
      {"Move", R"({"source":"x"})", 400, "invalid_argument"},
      {"MakeDir", R"({"path":"d","future":{"asks":true}})", 501, "unimplemented"},
      {"MakeDir", R"({"path":"d","future":false})", 200, ""},
      {"MakeDir", R"({"path":"d"})", 409, "already_exists"},
      {"WatchDir", R"({"path":"."})", 400, "invalid_argument"},  // a stream called as unary
      {"GetWatcherEvents", R"({"watcherId":"w-nope"})", 404, "not_found"},
      {"Teleport", R"({})", 501, "unimplemented"},
      {"Stat", R"(not json)", 400, "invalid_argument"},
  };
  for (const auto& c : rpcs) {
    Raw r = rpc(c.method, c.message);
    SCOPED_TRACE(c.method + " " + c.message + " -> " + std::to_string(r.status) + " " + r.body);
    EXPECT_EQ(r.status, c.status);
    if (!c.code.empty()) {
      EXPECT_EQ(r.j.value("code", ""), c.code);
    }
    EXPECT_NE(r.headers.find("content-type: application/json"), std::string::npos);
  }
}

TEST_F(E2bFilesRest, PollingWatchersSeeWhatHappened) {
  ASSERT_FALSE(id_.empty());
  ASSERT_EQ(rpc("MakeDir", R"({"path":"pw"})").status, 200);
  Raw made = rpc("CreateWatcher", R"({"path":"pw","recursive":true})");
  ASSERT_EQ(made.status, 200) << made.body;
  std::string wid = made.j.value("watcherId", "");
  ASSERT_FALSE(wid.empty());
  ASSERT_EQ(curl("-X POST -H 'Content-Type: application/octet-stream' --data-binary 1",
                 "/files?path=pw/sub/f.txt").status,
            200);
  json events = json::array();
  for (int i = 0; i < 50; ++i) {
    Raw got = rpc("GetWatcherEvents", R"({"watcherId":")" + wid + "\"}");
    ASSERT_EQ(got.status, 200) << got.body;
    for (const auto& e : got.j["events"]) events.push_back(e);
    if (events.dump().find("sub/f.txt") != std::string::npos) break;
    usleep(100000);
  }
  EXPECT_NE(events.dump().find(R"({"name":"sub","type":"EVENT_TYPE_CREATE"})"), std::string::npos)
      << events.dump();
  EXPECT_NE(events.dump().find(R"("name":"sub/f.txt")"), std::string::npos) << events.dump();
  EXPECT_EQ(rpc("RemoveWatcher", R"({"watcherId":")" + wid + "\"}").status, 200);
  EXPECT_EQ(rpc("GetWatcherEvents", R"({"watcherId":")" + wid + "\"}").status, 404);
}

TEST_F(E2bFilesRest, PathsThatTryToLeaveTheBoxReachNothing) {
  ASSERT_FALSE(id_.empty());
  // A file on the host, outside every workspace.
  const std::string secret = d_.temp_dir() + "/host-secret";
  ASSERT_TRUE(spit(secret, "host secret"));
  ASSERT_EQ(api_.sh(id_, "mkdir -p a && ln -s " + d_.temp_dir() + " out && ln -s " + secret +
                             " direct")
                .body["exit_code"],
            0);
  const std::vector<std::string> paths = {secret, "../../../../../../../../" + secret,
                                          "a/../../../" + secret, "out/host-secret", "direct"};
  // Reads first: none reaches the host file (the host backend refuses with 403; in an ns box
  // the host path does not exist: 404).
  for (const std::string& p : paths) {
    Raw get = curl("", "/files?path=" + client::url_encode(p));
    SCOPED_TRACE(p + " -> " + std::to_string(get.status) + " " + get.body);
    EXPECT_TRUE(get.status == 403 || get.status == 404);
    EXPECT_EQ(get.body.find("host secret"), std::string::npos);
    Raw st = rpc("Stat", json({{"path", p}}).dump());
    if (p == "direct") {
      // The link itself (Stat does not follow a final symlink); what it points at stays
      // unknown to the box.
      EXPECT_EQ(st.status, 200) << st.body;
      EXPECT_EQ(st.j["entry"].value("type", ""), "FILE_TYPE_SYMLINK") << st.body;
    } else {
      EXPECT_TRUE(st.status == 403 || st.status == 404) << st.body;
    }
    Raw ls = rpc("ListDir", json({{"path", p + "/.."}}).dump());
    EXPECT_TRUE(ls.status == 403 || ls.status == 404 || ls.status == 400) << ls.body;
    if (ls.status == 200) {
      for (const auto& e : ls.j["entries"]) EXPECT_NE(e.value("name", ""), "host-secret");
    }
  }
  // Writes, moves and removals: refused, or done inside the box (an ns box has its own /tmp);
  // never a 5xx, and the host file stays as it was.
  for (const std::string& p : paths) {
    SCOPED_TRACE(p);
    Raw put = curl("-X POST -H 'Content-Type: application/octet-stream' --data-binary pwned",
                   "/files?path=" + client::url_encode(p));
    EXPECT_LT(put.status, 500) << put.body;
    EXPECT_LT(rpc("Move", json({{"source", "a"}, {"destination", p + ".moved"}}).dump()).status,
              500);
    EXPECT_LT(rpc("MakeDir", json({{"path", p + ".dir"}}).dump()).status, 500);
    EXPECT_LT(rpc("Remove", json({{"path", p}}).dump()).status, 500);
  }
  EXPECT_EQ(slurp(secret), "host secret");
  EXPECT_FALSE(std::filesystem::exists(secret + ".moved"));
  EXPECT_FALSE(std::filesystem::exists(secret + ".dir"));
}

}  // namespace
}  // namespace agentbox::testing
