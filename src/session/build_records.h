#pragma once
// A template build's record on disk (data_dir/build_records/<id>.json, its log beside it as
// <id>.log), so GET /v1/templates/{name}/builds/{id} and its log answer after a daemon restart.
// Written when the build starts and when it ends; a record still "running" when the daemon
// starts again is a build the daemon died in: it is loaded as failed.

#include <string>
#include <vector>

#include "common/error.h"
#include "session/template_manager.h"

namespace agentbox::session {

struct BuildRecord {
  BuildInfo info;
  std::vector<std::string> log;
};

// Writes `info` (and, when the build ended, `log`) into `dir` (temp file, fsync, rename).
Status save_build_record(const std::string& dir, const BuildInfo& info,
                         const std::vector<std::string>& log);
// Every record in `dir`, oldest first; one left running is turned failed (and saved so).
std::vector<BuildRecord> load_build_records(const std::string& dir);
// Deletes build `id`'s record and log.
void remove_build_record(const std::string& dir, const std::string& id);

}  // namespace agentbox::session
