#pragma once
// A small file of the daemon's own state (a template's record, a build record), replaced whole:
// the data goes to `path`.tmp (0600, O_NOFOLLOW), is fsynced and renamed over `path`.

#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::linux {

Status write_state_file(const std::string& path, std::string_view data);

}  // namespace agentbox::linux
