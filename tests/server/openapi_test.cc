// docs/openapi.yaml and the server's route table must describe the same API: every documented
// (method, path) is served, every served route is documented, and the document is well formed
// enough for a client generator (refs resolve, path parameters declared, errors use Error).

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "server/routes.h"

namespace agentbox::server {
namespace {

namespace fs = std::filesystem;

// The source tree: $AGENTBOX_SOURCE_DIR, else the one this test was built from.
fs::path source_dir() {
  if (const char* env = std::getenv("AGENTBOX_SOURCE_DIR"); env && *env) return env;
  return AGENTBOX_SOURCE_TREE;
}

const std::set<std::string> kMethods = {"get", "put", "post", "delete", "patch", "head", "options"};

using RouteKey = std::pair<std::string, std::string>;  // (METHOD, /path/{template})

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

class OpenApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::path p = source_dir() / "docs" / "openapi.yaml";
    ASSERT_TRUE(fs::exists(p)) << p << " (set AGENTBOX_SOURCE_DIR to the source tree)";
    try {
      doc_ = YAML::LoadFile(p.string());
    } catch (const YAML::Exception& e) {
      FAIL() << p << ": " << e.what();
    }
    ASSERT_TRUE(doc_["paths"].IsMap()) << "no paths in " << p;
  }

  std::set<RouteKey> documented() const {
    std::set<RouteKey> out;
    for (const auto& path : doc_["paths"]) {
      for (const auto& op : path.second) {
        std::string m = op.first.as<std::string>();
        if (kMethods.count(m)) out.emplace(upper(m), path.first.as<std::string>());
      }
    }
    return out;
  }

  YAML::Node doc_;
};

TEST_F(OpenApiTest, IsOpenApi3WithBearerAuth) {
  EXPECT_EQ(doc_["openapi"].as<std::string>().rfind("3.0", 0), 0u);
  auto bearer = doc_["components"]["securitySchemes"]["bearer"];
  ASSERT_TRUE(bearer.IsMap());
  EXPECT_EQ(bearer["type"].as<std::string>(), "http");
  EXPECT_EQ(bearer["scheme"].as<std::string>(), "bearer");
  ASSERT_TRUE(doc_["security"].IsSequence());
  EXPECT_TRUE(doc_["security"][0]["bearer"].IsDefined());
  // /healthz is the one route that needs no token (API.md).
  auto healthz_security = doc_["paths"]["/healthz"]["get"]["security"];
  ASSERT_TRUE(healthz_security.IsSequence());
  EXPECT_EQ(healthz_security.size(), 0u);
}

// Operations marked `x-agentbox-not-built: true`: in the contract, answering 501 ENOTSUP.
std::set<RouteKey> not_built(const YAML::Node& doc) {
  std::set<RouteKey> out;
  for (const auto& path : doc["paths"]) {
    for (const auto& op : path.second) {
      std::string m = op.first.as<std::string>();
      if (kMethods.count(m) && op.second["x-agentbox-not-built"].as<bool>(false)) {
        out.emplace(upper(m), path.first.as<std::string>());
      }
    }
  }
  return out;
}

// Every documented route is in the route table, the not-built ones too (they answer 501).
TEST_F(OpenApiTest, EveryDocumentedRouteIsServed) {
  std::set<RouteKey> served;
  for (const auto& r : route_table()) served.emplace(r.method, r.path);
  for (const auto& [method, path] : documented()) {
    EXPECT_TRUE(served.count({method, path}))
        << method << " " << path << " is in docs/openapi.yaml but not served";
  }
}

// Fail closed (API.md "General"): a contract route this version does not build would be in the
// document, marked, with its 501 ENOTSUP answer. Wave 2 builds every route of API.md: none is
// marked, and none of the served routes is a not-built one.
TEST_F(OpenApiTest, NotBuiltRoutesAreMarkedAndAnswer501) {
  std::set<RouteKey> unbuilt = not_built(doc_);
  EXPECT_TRUE(unbuilt.empty()) << unbuilt.size() << " routes marked not-built";
  for (const auto& [method, path] : unbuilt) {
    std::string m = method;
    for (char& c : m) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_TRUE(doc_["paths"][path][m]["responses"]["501"].IsMap())
        << method << " " << path << ": not-built without a 501 response";
  }
  for (const RouteSpec& r : route_specs()) {
    EXPECT_NE(r.id, RouteId::kNotBuilt) << r.method << " " << r.path << " is still not built";
  }
}

TEST_F(OpenApiTest, EveryServedRouteIsDocumented) {
  std::set<RouteKey> docs = documented();
  ASSERT_FALSE(route_table().empty());
  for (const auto& r : route_table()) {
    EXPECT_TRUE(docs.count({r.method, r.path}))
        << r.method << " " << r.path << " is served but missing from docs/openapi.yaml";
  }
}

// The document marks exactly the routes the server answers 501 (RouteKind::kNotBuilt).
TEST_F(OpenApiTest, NotBuiltRoutesAreMarkedAsSuch) {
  for (const RouteSpec& r : route_specs()) {
    std::string m(r.method);
    for (char& c : m) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    auto op = doc_["paths"][std::string(r.path)][m];
    ASSERT_TRUE(op.IsMap()) << r.method << " " << r.path;
    EXPECT_EQ(op["x-agentbox-not-built"].as<bool>(false), r.kind == RouteKind::kNotBuilt)
        << r.method << " " << r.path;
  }
}

TEST_F(OpenApiTest, ErrorSchemaIsTheApiShape) {
  auto err = doc_["components"]["schemas"]["Error"];
  ASSERT_TRUE(err.IsMap());
  auto inner = err["properties"]["error"];
  ASSERT_TRUE(inner.IsMap());
  EXPECT_TRUE(inner["properties"]["code"].IsMap());
  EXPECT_TRUE(inner["properties"]["message"].IsMap());
  std::set<std::string> codes;
  for (const auto& c : inner["properties"]["code"]["enum"]) codes.insert(c.as<std::string>());
  for (const char* c : {"EINVAL", "EUNAUTHORIZED", "EACCES", "ENOENT", "EEXIST", "ENOTDIR",
                        "EISDIR", "ENOTEMPTY", "ETOOBIG", "EQUOTA", "EINTERNAL", "EUNAVAILABLE",
                        "ENOTSUP"}) {
    EXPECT_TRUE(codes.count(c)) << c << " missing from the Error code enum";
  }
}

// 405 and 504 are outside the contract's table, 501 ENOTSUP is fail-closed's answer: the
// document says where they come from (http_error.cc and the router are the code side;
// http_error_test and api_ops_test check it).
TEST_F(OpenApiTest, StatusesBeyondTheApiTableAreDocumented) {
  auto responses = doc_["components"]["responses"];
  for (const char* r : {"MethodNotAllowed", "NotSupported", "Timeout"}) {
    EXPECT_TRUE(responses[r].IsMap()) << r << " missing from components/responses";
  }
  EXPECT_TRUE(responses["MethodNotAllowed"]["headers"]["Allow"].IsMap());
  const std::string info = doc_["info"]["description"].as<std::string>("");
  for (const char* s : {"405 EINVAL", "501 ENOTSUP", "504 ETIMEDOUT"}) {
    EXPECT_NE(info.find(s), std::string::npos) << s << " not described in info.description";
  }
  auto status_of = [&](const char* path, const char* method, const char* status) {
    return doc_["paths"][path][method]["responses"][status].IsMap();
  };
  for (auto [path, method] :
       {std::pair{"/v1/sessions", "post"}, std::pair{"/exec", "post"},
        std::pair{"/v1/sessions/{id}/network", "post"}, std::pair{"/v1/sessions/{id}/pty", "get"}}) {
    EXPECT_TRUE(status_of(path, method, "501")) << method << " " << path << ": no 501";
  }
  for (auto [path, method] :
       {std::pair{"/v1/sessions", "post"}, std::pair{"/v1/sessions/{id}/exec", "post"},
        std::pair{"/v1/sessions/{id}/exec/stream", "post"}}) {
    EXPECT_TRUE(status_of(path, method, "504")) << method << " " << path << ": no 504";
  }
}

TEST_F(OpenApiTest, EveryOperationIsComplete) {
  for (const auto& path : doc_["paths"]) {
    std::string p = path.first.as<std::string>();
    // Template parameters declared at the path level or on the operation.
    std::set<std::string> templated;
    for (std::size_t i = 0; (i = p.find('{', i)) != std::string::npos; ++i) {
      templated.insert(p.substr(i + 1, p.find('}', i) - i - 1));
    }
    auto path_params = [&](const YAML::Node& params, std::set<std::string>& found) {
      if (!params.IsDefined() || !params.IsSequence()) return;
      for (const auto& prm : params) {
        if (prm["$ref"]) {
          // "#/components/parameters/X"
          std::string ref = prm["$ref"].as<std::string>();
          auto resolved = doc_["components"]["parameters"][ref.substr(ref.rfind('/') + 1)];
          if (resolved["in"].as<std::string>("") == "path") {
            found.insert(resolved["name"].as<std::string>());
          }
        } else if (prm["in"].as<std::string>("") == "path") {
          found.insert(prm["name"].as<std::string>());
        }
      }
    };
    for (const auto& op : path.second) {
      std::string m = op.first.as<std::string>();
      if (!kMethods.count(m)) continue;
      SCOPED_TRACE(upper(m) + " " + p);
      EXPECT_TRUE(op.second["summary"].IsDefined());
      ASSERT_TRUE(op.second["responses"].IsMap());
      bool has_success = false;
      for (const auto& resp : op.second["responses"]) {
        std::string code = resp.first.as<std::string>();
        // A redirect (GET /ui -> /ui/) is its route's success.
        if (code[0] == '2' || code[0] == '3' || code == "101") has_success = true;
      }
      if (op.second["x-agentbox-not-built"].as<bool>(false)) {
        EXPECT_TRUE(op.second["responses"]["501"].IsMap()) << "not built, but no 501";
      } else {
        EXPECT_TRUE(has_success) << "no success response";
      }
      std::set<std::string> found;
      path_params(path.second["parameters"], found);
      path_params(op.second["parameters"], found);
      EXPECT_EQ(found, templated) << "path parameters not declared";
    }
  }
}

TEST_F(OpenApiTest, EveryRefResolves) {
  std::vector<std::string> broken;
  std::function<void(const YAML::Node&)> walk = [&](const YAML::Node& n) {
    if (n.IsMap()) {
      for (const auto& kv : n) {
        if (kv.first.as<std::string>() == "$ref") {
          std::string ref = kv.second.as<std::string>();
          if (ref.rfind("#/", 0) != 0) {
            broken.push_back(ref);
            continue;
          }
          // Node::operator= would assign through to the document; reset() only rebinds.
          YAML::Node cur;
          cur.reset(doc_);
          std::string rest = ref.substr(2);
          bool ok = true;
          while (ok && !rest.empty()) {
            auto slash = rest.find('/');
            std::string part = rest.substr(0, slash);
            rest = slash == std::string::npos ? "" : rest.substr(slash + 1);
            YAML::Node next = cur[part];
            ok = next.IsDefined() && !next.IsNull();
            if (ok) cur.reset(next);
          }
          if (!ok) broken.push_back(ref);
        } else {
          walk(kv.second);
        }
      }
    } else if (n.IsSequence()) {
      for (const auto& c : n) walk(c);
    }
  };
  walk(doc_);
  EXPECT_TRUE(broken.empty()) << "unresolved $ref: " << ::testing::PrintToString(broken);
}

}  // namespace
}  // namespace agentbox::server
