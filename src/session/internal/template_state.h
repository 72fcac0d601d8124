#pragma once
// A template's state file, data_dir/templates/<name>.json (session/template_manager.h): its
// YAML, snapshot versions and which one is current.

#include <string>

#include "common/error.h"
#include "session/template_manager.h"

namespace agentbox::session {

std::string encode_template_state(const TemplateInfo& t);
Result<TemplateInfo> decode_template_state(const std::string& text);

}  // namespace agentbox::session
