#pragma once
// The catalog's record of a template (cluster mode; service/template_sync.h keeps it): key
// templates/<name>, one JSON object changed only by compare-and-swap (Cluster::swap_record):
//   {"yaml": the definition, "deleted": true for a deleted template (a tombstone: a node that was
//    down removes its copy when it next syncs), "current": version, "last_version": the highest
//    number ever given under this name (kept across a delete: no number is given twice),
//    "versions": {"<v>": {"state": "building"|"built", "node", "build_id", "yaml", "snapshot",
//                         "bytes", "files", "created_ms"}}}
// and builds/<build_id> {"node", "template"}: where a build ran.

#include <cstdint>
#include <map>
#include <string>

namespace agentbox::cluster {

struct TemplateVersion {
  bool built = false;  // else a build of it is running ("building"), on `node`
  std::string node;
  std::string build_id;
  std::string yaml;  // the definition it is built from
  std::string snapshot;
  std::uint64_t bytes = 0, files = 0;
  std::int64_t created_ms = 0;
};

struct TemplateRecord {
  bool stored = false;   // the catalog has a record (else the rest is empty)
  bool deleted = false;  // a tombstone
  std::string yaml;
  std::uint64_t current = 0;
  std::uint64_t last_version = 0;
  std::map<std::uint64_t, TemplateVersion> versions;

  // The highest number given under this name, versions and last_version alike.
  std::uint64_t highest() const;
  // Version `v` when it is built, else null.
  const TemplateVersion* built(std::uint64_t v) const;
};

// "" (no record) or a malformed one: a record with stored false.
TemplateRecord parse_template_record(const std::string& raw);
std::string encode_template_record(const TemplateRecord& r);

// builds/<id>: the node it ran on ("" when malformed).
std::string parse_build_node(const std::string& raw);
std::string encode_build_record(const std::string& node, const std::string& template_name);

}  // namespace agentbox::cluster
