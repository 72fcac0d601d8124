#pragma once
// The figures of `make bench` (agentbox_bench.cc): each printed as one row, with its p99 beside
// the median (p50) where the figure is a latency measured many times, and kept for --json FILE
// (compared with scripts/bench-compare A.json B.json).

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace bench {

inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}
inline double median(std::vector<double> v) {
  return percentile(std::move(v), 0.5);
}

struct Row {
  std::string section;
  std::string what;
  double value = 0;  // the median where it is one of many measurements
  std::string unit;
  std::optional<double> p99;
  std::string note;
};

struct Report {
  std::string section;  // the section running now
  std::vector<Row> rows;
};

inline Report& report() {
  static Report r;
  return r;
}

inline void row(const char* what, double value, const char* unit, const std::string& note = "",
                std::optional<double> p99 = std::nullopt) {
  char p99_text[32] = "";
  if (p99) std::snprintf(p99_text, sizeof p99_text, "p99 %9.3f", *p99);
  std::printf("  %-58s %10.3f %-6s %-13s %s\n", what, value, unit, p99_text, note.c_str());
  report().rows.push_back({report().section, what, value, unit, p99, note});
}

// A figure measured many times: its median, with its p99 beside it.
inline void row_m(const char* what, const std::vector<double>& v, const char* unit,
                  const std::string& note = "") {
  row(what, median(v), unit, note, percentile(v, 0.99));
}

inline bool write_json(const std::string& path, const nlohmann::json& meta) {
  nlohmann::json out = meta;
  out["rows"] = nlohmann::json::array();
  for (const Row& r : report().rows) {
    nlohmann::json j = {{"section", r.section},
                        {"name", r.what},
                        {"value", r.value},
                        {"unit", r.unit},
                        {"note", r.note}};
    if (r.p99) j["p99"] = *r.p99;
    out["rows"].push_back(std::move(j));
  }
  std::ofstream f(path);
  f << out.dump(1) << "\n";
  return static_cast<bool>(f);
}

}  // namespace bench
