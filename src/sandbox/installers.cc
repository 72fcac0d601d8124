#include "sandbox/installers.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>

namespace agentbox::sandbox {
namespace {

using sandbox::ExecResult;
using sandbox::ExecSpec;
using sandbox::Sandbox;

// ---- A small TOML reader: what pyproject.toml needs, with the spans render_pyproject edits ----

struct Span {
  std::size_t begin = 0;
  std::size_t end = 0;
};

struct TomlScan {
  PythonManifest m;
  std::optional<Span> deps_value;                // [project] dependencies' value
  std::optional<std::size_t> project_body;       // just after the [project] header line
  std::optional<Span> agentbox_table;            // [tool.agentbox], header to next header
};

class TomlReader {
 public:
  explicit TomlReader(std::string_view s) : s_(s) {}

  Result<TomlScan> scan() {
    TomlScan out;
    std::string table;
    while (true) {
      skip_blank();
      if (i_ >= s_.size()) break;
      char c = s_[i_];
      if (c == '\n' || c == '\r') {
        ++i_;
        continue;
      }
      if (c == '#') {
        skip_to_eol();
        continue;
      }
      std::size_t line_start = i_;
      while (line_start > 0 && s_[line_start - 1] != '\n') --line_start;
      if (c == '[') {
        bool array_table = i_ + 1 < s_.size() && s_[i_ + 1] == '[';
        std::size_t close = s_.find(']', i_);
        std::size_t eol = s_.find('\n', i_);
        if (close == std::string_view::npos || (eol != std::string_view::npos && close > eol)) {
          return error("a table header without ']'");
        }
        std::string name;
        for (char h : s_.substr(i_, close - i_)) {
          if (h != '[' && h != ' ' && h != '\t' && h != '"') name += h;
        }
        if (table == "tool.agentbox" && out.agentbox_table) out.agentbox_table->end = line_start;
        table = array_table ? "[[" + name : name;
        i_ = close + 1;
        if (array_table && i_ < s_.size() && s_[i_] == ']') ++i_;
        if (auto st = end_of_line(); !st) return std::unexpected(st.error());
        if (table == "project") out.project_body = i_;
        if (table == "tool.agentbox") out.agentbox_table = Span{line_start, s_.size()};
        continue;
      }
      auto key = read_key();
      if (!key) return std::unexpected(key.error());
      skip_blank();
      if (i_ >= s_.size() || s_[i_] != '=') return error("expected '=' after key '" + *key + "'");
      ++i_;
      skip_blank();
      std::size_t value_begin = i_;
      if (table == "project" && *key == "dependencies") {
        auto deps = read_string_array("[project] dependencies");
        if (!deps) return std::unexpected(deps.error());
        out.m.dependencies = std::move(*deps);
        out.deps_value = Span{value_begin, i_};
      } else if (table == "tool.agentbox" && *key == "index_url") {
        auto v = read_string("[tool.agentbox] index_url");
        if (!v) return std::unexpected(v.error());
        out.m.source.index_url = std::move(*v);
      } else if (table == "tool.agentbox" && *key == "find_links") {
        auto v = read_string_array("[tool.agentbox] find_links");
        if (!v) return std::unexpected(v.error());
        out.m.source.find_links = std::move(*v);
      } else if (table == "tool.agentbox" && *key == "no_index") {
        if (s_.substr(i_, 4) == "true") {
          out.m.source.no_index = true;
          i_ += 4;
        } else if (s_.substr(i_, 5) == "false") {
          i_ += 5;
        } else {
          return error("[tool.agentbox] no_index must be true or false");
        }
      } else if (auto st = skip_value(); !st) {
        return std::unexpected(st.error());
      }
      if (auto st = end_of_line(); !st) return std::unexpected(st.error());
    }
    return out;
  }

 private:
  std::unexpected<Error> error(const std::string& what) const {
    std::size_t line = 1 + std::count(s_.begin(), s_.begin() + std::min(i_, s_.size()), '\n');
    return fail(Code::kInvalid, std::string(kPyproject) + " line " + std::to_string(line) + ": " +
                                    what);
  }
  void skip_blank() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  void skip_to_eol() {
    while (i_ < s_.size() && s_[i_] != '\n') ++i_;
  }
  // Blanks, newlines and comments (inside arrays).
  void skip_space() {
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        skip_to_eol();
      } else {
        break;
      }
    }
  }
  Status end_of_line() {
    skip_blank();
    if (i_ < s_.size() && s_[i_] == '#') skip_to_eol();
    if (i_ < s_.size() && s_[i_] == '\r') ++i_;
    if (i_ < s_.size() && s_[i_] != '\n') return error("expected the end of the line");
    if (i_ < s_.size()) ++i_;
    return {};
  }
  Result<std::string> read_key() {
    std::string key;
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') {
        key += c;
        ++i_;
      } else if (c == '"' || c == '\'') {
        auto q = read_string("a key");
        if (!q) return std::unexpected(q.error());
        key += *q;
      } else {
        break;
      }
    }
    if (key.empty()) return error("expected a key");
    return key;
  }
  Result<std::string> read_string(const std::string& what) {
    if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) {
      return error(what + " must be a string");
    }
    if (s_.substr(i_, 3) == "\"\"\"" || s_.substr(i_, 3) == "'''") {
      return error(what + ": multi-line strings are not supported here");
    }
    char q = s_[i_++];
    std::string out;
    while (i_ < s_.size() && s_[i_] != q) {
      char c = s_[i_++];
      if (c == '\n') return error(what + ": unterminated string");
      if (q == '"' && c == '\\') {
        if (i_ >= s_.size()) break;
        char e = s_[i_++];
        switch (e) {
          case 'b': out += '\b'; break;
          case 't': out += '\t'; break;
          case 'n': out += '\n'; break;
          case 'f': out += '\f'; break;
          case 'r': out += '\r'; break;
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case 'u':
          case 'U': {
            std::size_t len = e == 'u' ? 4 : 8;
            if (i_ + len > s_.size()) return error(what + ": bad \\u escape");
            unsigned long cp = 0;
            for (std::size_t k = 0; k < len; ++k) {
              char h = s_[i_ + k];
              if (!std::isxdigit(static_cast<unsigned char>(h))) {
                return error(what + ": bad \\u escape");
              }
              cp = cp * 16 + (std::isdigit(static_cast<unsigned char>(h))
                                  ? h - '0'
                                  : (std::tolower(static_cast<unsigned char>(h)) - 'a' + 10));
            }
            i_ += len;
            if (cp < 0x80) {
              out += static_cast<char>(cp);
            } else if (cp < 0x800) {
              out += static_cast<char>(0xC0 | (cp >> 6));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
              out += static_cast<char>(0xE0 | (cp >> 12));
              out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            } else {
              out += static_cast<char>(0xF0 | (cp >> 18));
              out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
              out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            }
            break;
          }
          default: return error(what + ": bad escape \\" + std::string(1, e));
        }
      } else {
        out += c;
      }
    }
    if (i_ >= s_.size()) return error(what + ": unterminated string");
    ++i_;  // the closing quote
    return out;
  }
  Result<std::vector<std::string>> read_string_array(const std::string& what) {
    if (i_ >= s_.size() || s_[i_] != '[') return error(what + " must be an array of strings");
    ++i_;
    std::vector<std::string> out;
    while (true) {
      skip_space();
      if (i_ >= s_.size()) return error(what + ": unterminated array");
      if (s_[i_] == ']') {
        ++i_;
        return out;
      }
      auto v = read_string(what + "[" + std::to_string(out.size()) + "]");
      if (!v) return std::unexpected(v.error());
      out.push_back(std::move(*v));
      skip_space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
      } else if (i_ >= s_.size() || s_[i_] != ']') {
        return error(what + ": expected ',' or ']'");
      }
    }
  }
  // Any other value: strings, arrays and inline tables (nested), or a bare token.
  Status skip_value() {
    if (i_ >= s_.size()) return error("expected a value");
    char c = s_[i_];
    if (c == '"' || c == '\'') {
      std::string_view triple = c == '"' ? "\"\"\"" : "'''";
      if (s_.substr(i_, 3) == triple) {
        std::size_t k = i_ + 3;
        while (true) {
          k = s_.find(triple, k);
          if (k == std::string_view::npos) return error("unterminated multi-line string");
          if (c == '"' && k > 0 && s_[k - 1] == '\\') {
            ++k;
            continue;
          }
          break;
        }
        i_ = k + 3;
        while (i_ < s_.size() && s_[i_] == c) ++i_;  // up to two quotes may close it
        return {};
      }
      auto v = read_string("a value");
      if (!v) return std::unexpected(v.error());
      return {};
    }
    if (c == '[' || c == '{') {
      char close = c == '[' ? ']' : '}';
      ++i_;
      while (true) {
        skip_space();
        if (i_ >= s_.size()) return error("unterminated " + std::string(1, c));
        if (s_[i_] == close) {
          ++i_;
          return {};
        }
        if (s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (c == '{') {
          auto k = read_key();
          if (!k) return std::unexpected(k.error());
          skip_blank();
          if (i_ >= s_.size() || s_[i_] != '=') return error("expected '=' in an inline table");
          ++i_;
          skip_blank();
        }
        if (auto st = skip_value(); !st) return st;
      }
    }
    std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] != '\n' && s_[i_] != '\r' && s_[i_] != ',' &&
           s_[i_] != ']' && s_[i_] != '}' && s_[i_] != '#' && s_[i_] != ' ' && s_[i_] != '\t') {
      ++i_;
    }
    if (i_ == start) return error("expected a value");
    return {};
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

std::string toml_string(std::string_view v) {
  std::string out = "\"";
  for (char c : v) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string toml_array(const std::vector<std::string>& v, bool multiline) {
  if (v.empty()) return "[]";
  std::string out = "[";
  for (std::size_t k = 0; k < v.size(); ++k) {
    if (multiline) {
      out += "\n    " + toml_string(v[k]) + ",";
    } else {
      out += (k ? ", " : "") + toml_string(v[k]);
    }
  }
  return out + (multiline ? "\n]" : "]");
}

std::string agentbox_table(const PythonSource& s) {
  std::string out =
      "[tool.agentbox]\n"
      "# Where agentbox installs look (repair and rebuilds install from here again).\n";
  if (!s.index_url.empty()) out += "index_url = " + toml_string(s.index_url) + "\n";
  if (!s.find_links.empty()) out += "find_links = " + toml_array(s.find_links, false) + "\n";
  if (s.no_index) out += "no_index = true\n";
  return out;
}

// ---- Running the tools in the box ----

// $1 = workspace, then pip's options and the requirements. A venv made here is removed again
// when the install fails (nothing half-made stays behind).
constexpr char kPipScript[] = R"sh(ws="$1"; shift
venv="$ws/.venv"
made=0
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" || { echo "agentbox: python3 -m venv $venv failed" >&2; rm -rf "$venv"; exit 1; }
  made=1
fi
if command -v uv >/dev/null 2>&1; then
  VIRTUAL_ENV="$venv" uv pip install --python "$venv/bin/python" "$@"
else
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input "$@"
fi
rc=$?
if [ "$rc" -ne 0 ] && [ "$made" = 1 ]; then rm -rf "$venv"; fi
exit "$rc"
)sh";

// $1 = workspace, $2 = save|nosave|manifest, then the packages.
constexpr char kNodeScript[] = R"sh(cd "$1" || exit 1
mode="$2"; shift 2
if command -v bun >/dev/null 2>&1; then
  case "$mode" in
    manifest) exec bun install ;;
    save) exec bun add "$@" ;;
    *) exec bun add --no-save "$@" ;;
  esac
fi
case "$mode" in
  manifest) exec npm install --no-audit --no-fund ;;
  save) exec npm install --no-audit --no-fund --save "$@" ;;
  *) exec npm install --no-audit --no-fund --no-save "$@" ;;
esac
)sh";

// The last line of `err` that says ERROR, else its last non-empty line.
std::string last_error_line(std::string_view err) {
  std::string last, last_error;
  std::size_t pos = 0;
  while (pos < err.size()) {
    std::size_t nl = err.find('\n', pos);
    std::string_view line = err.substr(pos, nl == std::string_view::npos ? err.npos : nl - pos);
    pos = nl == std::string_view::npos ? err.size() : nl + 1;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) {
      line.remove_suffix(1);
    }
    if (line.empty()) continue;
    last = std::string(line);
    if (line.find("ERROR") != std::string_view::npos || line.find("ERR!") != std::string_view::npos) {
      last_error = last;
    }
  }
  return last_error.empty() ? last : last_error;
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (std::size_t k = 0; k < v.size(); ++k) out += (k ? std::string(sep) : "") + v[k];
  return out;
}

InstallResult to_result(ExecResult r) {
  InstallResult out;
  out.exit_code = r.exit_code;
  out.timed_out = r.timed_out;
  out.stdout_data = std::move(r.stdout_data);
  out.stderr_data = std::move(r.stderr_data);
  return out;
}

void set_error(InstallResult* r, std::string_view tool, const std::vector<std::string>& pkgs) {
  if (r->exit_code == 0) return;
  std::string what = pkgs.empty() ? std::string(tool) + " install from the manifest"
                                  : std::string(tool) + " install of " + join(pkgs, ", ");
  std::string why = r->timed_out ? "timed out" : "exit " + std::to_string(r->exit_code);
  std::string line = last_error_line(r->stderr_data);
  if (line.empty()) line = last_error_line(r->stdout_data);
  r->error = what + " failed (" + why + ")" + (line.empty() ? "" : ": " + line);
}

asio::awaitable<Result<ExecResult>> run_script(Sandbox& box, const char* script,
                                               std::vector<std::string> args,
                                               std::map<std::string, std::string> env,
                                               std::chrono::milliseconds timeout) {
  ExecSpec spec;
  spec.argv = {"/bin/sh", "-c", script, "agentbox-install", box.workspace()};
  for (auto& a : args) spec.argv.push_back(std::move(a));
  spec.env = std::move(env);
  spec.env.emplace("PIP_DISABLE_PIP_VERSION_CHECK", "1");
  spec.env.emplace("npm_config_update_notifier", "false");
  spec.timeout = timeout;
  spec.max_output_bytes = 256 << 10;
  co_return co_await box.exec(std::move(spec), nullptr);
}

std::vector<std::string> pip_options(const PythonSource& s) {
  std::vector<std::string> out;
  if (!s.index_url.empty()) out.insert(out.end(), {"--index-url", s.index_url});
  for (const auto& f : s.find_links) out.insert(out.end(), {"--find-links", f});
  if (s.no_index) out.push_back("--no-index");
  return out;
}

bool has_control(std::string_view v) {
  return std::any_of(v.begin(), v.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
}

// Reads an in-box file; "" when it does not exist.
Result<std::string> read_optional(Sandbox& box, const std::string& path) {
  auto r = box.read_file(path, 4 << 20);
  if (!r && r.error().code == Code::kNotFound) return std::string();
  return r;
}

std::string normalise_name(std::string_view name) {
  std::string out;
  bool sep = false;
  for (char c : name) {
    if (c == '-' || c == '_' || c == '.') {
      sep = true;
      continue;
    }
    if (sep && !out.empty()) out += '-';
    sep = false;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

}  // namespace

std::string workspace_path(const Sandbox& box, std::string_view name) {
  std::string ws = box.workspace();
  if (!ws.empty() && ws.back() == '/') ws.pop_back();
  return ws + "/" + std::string(name);
}

std::string_view manager_name(PackageManager m) {
  return m == PackageManager::kPip ? "pip" : "npm";
}

Result<PackageManager> parse_manager(std::string_view name, std::string_view field) {
  if (name == "pip") return PackageManager::kPip;
  if (name == "npm") return PackageManager::kNpm;
  return fail(Code::kInvalid, "field '" + std::string(field) + "': unknown package manager '" +
                                  std::string(name) + "' (pip or npm)");
}

Status validate_install(const InstallRequest& req) {
  if (req.packages.empty()) return fail(Code::kInvalid, "field 'packages': give at least one");
  for (std::size_t k = 0; k < req.packages.size(); ++k) {
    const std::string& p = req.packages[k];
    std::string field = "field 'packages[" + std::to_string(k) + "]'";
    if (p.empty()) return fail(Code::kInvalid, field + " is empty");
    if (p.front() == '-') {
      return fail(Code::kInvalid, field + " '" + p + "' starts with '-' (options are not taken)");
    }
    if (has_control(p)) return fail(Code::kInvalid, field + " holds a control character");
    if (p.size() > 4096) return fail(Code::kInvalid, field + " is longer than 4096 bytes");
  }
  if (req.manager == PackageManager::kNpm && !req.python.empty()) {
    return fail(Code::kInvalid, "fields 'index_url', 'find_links' and 'no_index' are for pip");
  }
  auto check = [](const std::string& v, const std::string& field) -> Status {
    if (!v.empty() && v.front() == '-') return fail(Code::kInvalid, field + " starts with '-'");
    if (has_control(v)) return fail(Code::kInvalid, field + " holds a control character");
    return {};
  };
  if (auto st = check(req.python.index_url, "field 'index_url'"); !st) return st;
  for (std::size_t k = 0; k < req.python.find_links.size(); ++k) {
    const std::string field = "field 'find_links[" + std::to_string(k) + "]'";
    if (req.python.find_links[k].empty()) return fail(Code::kInvalid, field + " is empty");
    if (auto st = check(req.python.find_links[k], field); !st) return st;
  }
  return {};
}

std::string requirement_name(std::string_view req) {
  std::string_view r = req;
  while (!r.empty() && std::isspace(static_cast<unsigned char>(r.front()))) r.remove_prefix(1);
  bool pathish = r.find('/') != std::string_view::npos || r.ends_with(".whl") ||
                 r.ends_with(".tar.gz") || r.ends_with(".zip");
  if (pathish && r.find(" @ ") == std::string_view::npos && r.find('@') == std::string_view::npos) {
    std::size_t slash = r.rfind('/');
    std::string_view base = slash == std::string_view::npos ? r : r.substr(slash + 1);
    if (base.ends_with(".whl")) {
      return normalise_name(base.substr(0, base.find('-')));
    }
    for (std::string_view ext : {".tar.gz", ".zip"}) {
      if (base.ends_with(ext)) {
        base.remove_suffix(ext.size());
        std::size_t dash = base.rfind('-');
        return normalise_name(dash == std::string_view::npos ? base : base.substr(0, dash));
      }
    }
    return "";
  }
  std::size_t n = 0;
  while (n < r.size() && (std::isalnum(static_cast<unsigned char>(r[n])) || r[n] == '-' ||
                          r[n] == '_' || r[n] == '.')) {
    ++n;
  }
  return normalise_name(r.substr(0, n));
}

std::vector<std::string> merge_requirements(std::vector<std::string> deps,
                                            const std::vector<std::string>& add) {
  for (const auto& a : add) {
    std::string name = requirement_name(a);
    auto same = std::find_if(deps.begin(), deps.end(), [&](const std::string& d) {
      return d == a || (!name.empty() && requirement_name(d) == name);
    });
    if (same != deps.end()) {
      *same = a;
    } else {
      deps.push_back(a);
    }
  }
  return deps;
}

Result<PythonManifest> parse_pyproject(std::string_view text) {
  auto scan = TomlReader(text).scan();
  if (!scan) return std::unexpected(scan.error());
  return std::move(scan->m);
}

Result<std::string> render_pyproject(std::string_view old_text, const PythonManifest& m) {
  auto scan = TomlReader(old_text).scan();
  if (!scan) return std::unexpected(scan.error());
  struct Edit {
    std::size_t begin, end;
    std::string text;
  };
  std::vector<Edit> edits;
  std::string tail;
  std::string deps = toml_array(m.dependencies, true);
  if (scan->deps_value) {
    edits.push_back({scan->deps_value->begin, scan->deps_value->end, deps});
  } else if (scan->project_body) {
    edits.push_back({*scan->project_body, *scan->project_body, "dependencies = " + deps + "\n"});
  } else {
    tail += "[project]\nname = \"workspace\"\nversion = \"0.1.0\"\ndependencies = " + deps + "\n";
  }
  if (scan->agentbox_table) {
    std::string table = m.source.empty() ? "" : agentbox_table(m.source);
    const Span& t = *scan->agentbox_table;
    if (!table.empty() && t.end < old_text.size()) table += "\n";
    edits.push_back({t.begin, t.end, table});
  } else if (!m.source.empty()) {
    tail += (tail.empty() ? "" : "\n") + agentbox_table(m.source);
  }
  std::sort(edits.begin(), edits.end(),
            [](const Edit& a, const Edit& b) { return a.begin > b.begin; });
  std::string out(old_text);
  for (const auto& e : edits) out.replace(e.begin, e.end - e.begin, e.text);
  if (!tail.empty()) {
    if (!out.empty() && out.back() != '\n') out += '\n';
    if (!out.empty()) out += '\n';
    out += tail;
  }
  return out;
}

Result<std::vector<std::pair<std::string, std::string>>> parse_package_json(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  if (text.empty()) return out;
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return fail(Code::kInvalid, std::string(kPackageJson) + " is not a JSON object");
  }
  auto deps = j.find("dependencies");
  if (deps == j.end() || deps->is_null()) return out;
  if (!deps->is_object()) {
    return fail(Code::kInvalid, std::string(kPackageJson) + ": \"dependencies\" is not an object");
  }
  for (auto it = deps->begin(); it != deps->end(); ++it) {
    if (!it->is_string()) {
      return fail(Code::kInvalid, std::string(kPackageJson) + ": dependencies." + it.key() +
                                      " is not a string");
    }
    out.emplace_back(it.key(), it->get<std::string>());
  }
  return out;
}

Result<std::string> render_package_json(
    std::string_view old_text, const std::vector<std::pair<std::string, std::string>>& deps) {
  nlohmann::ordered_json j;
  if (old_text.empty()) {
    j = {{"name", "workspace"}, {"version", "0.1.0"}, {"private", true}};
  } else {
    j = nlohmann::ordered_json::parse(old_text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return fail(Code::kInvalid, std::string(kPackageJson) + " is not a JSON object");
    }
  }
  nlohmann::ordered_json d = nlohmann::ordered_json::object();
  for (const auto& [name, spec] : deps) d[name] = spec;
  j["dependencies"] = std::move(d);
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

Result<PythonManifest> read_python_manifest(Sandbox& box) {
  auto text = read_optional(box, workspace_path(box, kPyproject));
  if (!text) return std::unexpected(text.error());
  return parse_pyproject(*text);
}

Status write_python_manifest(Sandbox& box, const PythonManifest& m) {
  const std::string path = workspace_path(box, kPyproject);
  auto old = read_optional(box, path);
  if (!old) return std::unexpected(old.error());
  auto text = render_pyproject(*old, m);
  if (!text) return std::unexpected(text.error());
  auto w = box.write_file(path, *text, sandbox::WriteOptions{});
  if (!w) return std::unexpected(w.error());
  return {};
}

Result<std::vector<std::pair<std::string, std::string>>> read_node_manifest(Sandbox& box) {
  auto text = read_optional(box, workspace_path(box, kPackageJson));
  if (!text) return std::unexpected(text.error());
  return parse_package_json(*text);
}

Status write_node_manifest(Sandbox& box,
                           const std::vector<std::pair<std::string, std::string>>& deps) {
  const std::string path = workspace_path(box, kPackageJson);
  auto old = read_optional(box, path);
  if (!old) return std::unexpected(old.error());
  auto text = render_package_json(*old, deps);
  if (!text) return std::unexpected(text.error());
  auto w = box.write_file(path, *text, sandbox::WriteOptions{});
  if (!w) return std::unexpected(w.error());
  return {};
}

Status write_configured_marker(Sandbox& box) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ\n", &tm);
  const std::string path = workspace_path(box, kConfiguredMarker);
  auto w = box.write_file(path, buf, sandbox::WriteOptions{});
  if (!w) return std::unexpected(w.error());
  return {};
}

asio::awaitable<Result<InstallResult>> install_packages(Sandbox& box, InstallRequest req) {
  if (auto st = validate_install(req); !st) co_return std::unexpected(st.error());
  if (req.manager == PackageManager::kPip) {
    // Read first: a manifest we could not update must stop the install before it runs.
    std::optional<PythonManifest> manifest;
    if (req.persist) {
      auto m = read_python_manifest(box);
      if (!m) co_return std::unexpected(m.error());
      manifest = std::move(*m);
    }
    std::vector<std::string> args = pip_options(req.python);
    args.insert(args.end(), req.packages.begin(), req.packages.end());
    auto r = co_await run_script(box, kPipScript, std::move(args), std::move(req.env), req.timeout);
    if (!r) co_return std::unexpected(r.error());
    InstallResult out = to_result(std::move(*r));
    set_error(&out, "pip", req.packages);
    if (out.exit_code != 0 || !manifest) co_return out;
    manifest->dependencies = merge_requirements(std::move(manifest->dependencies), req.packages);
    PythonSource& src = manifest->source;
    if (!req.python.index_url.empty()) src.index_url = req.python.index_url;
    for (const auto& f : req.python.find_links) {
      if (std::find(src.find_links.begin(), src.find_links.end(), f) == src.find_links.end()) {
        src.find_links.push_back(f);
      }
    }
    if (!req.python.empty()) src.no_index = req.python.no_index;
    if (auto st = write_python_manifest(box, *manifest); !st) co_return std::unexpected(st.error());
    if (auto st = write_configured_marker(box); !st) co_return std::unexpected(st.error());
    out.recorded = req.packages;
    co_return out;
  }

  // npm (or bun) writes package.json itself with --save; what changed there is what it recorded.
  auto before = read_node_manifest(box);
  if (!before) co_return std::unexpected(before.error());
  std::vector<std::string> args = {req.persist ? "save" : "nosave"};
  args.insert(args.end(), req.packages.begin(), req.packages.end());
  auto r = co_await run_script(box, kNodeScript, std::move(args), std::move(req.env), req.timeout);
  if (!r) co_return std::unexpected(r.error());
  InstallResult out = to_result(std::move(*r));
  set_error(&out, "npm", req.packages);
  if (out.exit_code != 0 || !req.persist) co_return out;
  auto after = read_node_manifest(box);
  if (!after) co_return std::unexpected(after.error());
  if (auto st = write_configured_marker(box); !st) co_return std::unexpected(st.error());
  for (const auto& dep : *after) {
    if (std::find(before->begin(), before->end(), dep) == before->end()) {
      out.recorded.push_back(dep.first + "@" + dep.second);
    }
  }
  co_return out;
}

asio::awaitable<Result<InstallResult>> install_from_manifest(Sandbox& box, PackageManager manager,
                                                             std::chrono::milliseconds timeout) {
  if (manager == PackageManager::kPip) {
    auto m = read_python_manifest(box);
    if (!m) co_return std::unexpected(m.error());
    if (m->dependencies.empty()) co_return InstallResult{};
    std::vector<std::string> args = pip_options(m->source);
    args.insert(args.end(), m->dependencies.begin(), m->dependencies.end());
    std::map<std::string, std::string> env;
    auto r = co_await run_script(box, kPipScript, std::move(args), std::move(env), timeout);
    if (!r) co_return std::unexpected(r.error());
    InstallResult out = to_result(std::move(*r));
    set_error(&out, "pip", {});
    co_return out;
  }
  auto deps = read_node_manifest(box);
  if (!deps) co_return std::unexpected(deps.error());
  if (deps->empty()) co_return InstallResult{};
  std::vector<std::string> args = {"manifest"};
  std::map<std::string, std::string> env;
  auto r = co_await run_script(box, kNodeScript, std::move(args), std::move(env), timeout);
  if (!r) co_return std::unexpected(r.error());
  InstallResult out = to_result(std::move(*r));
  set_error(&out, "npm", {});
  co_return out;
}

}  // namespace agentbox::sandbox
