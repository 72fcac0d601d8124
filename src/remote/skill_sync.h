#pragma once
// Seed 000: the daemon's global skills and agents go to every runner on its (re)registration:
// each skill dir (one with a SKILL.md) to {workspace}/.skills/<name>/, the agents dir to
// {workspace}/.agents/, through the runner protocol's mkdir_all and write_file.

#include <memory>
#include <string>

#include "remote/runner_hub.h"

namespace agentbox::remote {

// Copies what there is; symlinks, special files and files over 16 MiB are skipped. A failure is
// logged and ends the copy (the next registration copies again). Blocking (the pool).
void sync_to_runner(const std::shared_ptr<RunnerConn>& conn, const std::string& skills_dir,
                    const std::string& agents_dir);

}  // namespace agentbox::remote
