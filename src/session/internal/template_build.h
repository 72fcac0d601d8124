#pragma once
// A template build's state (session/template_manager.h): template_manager.cc runs builds,
// template_images.cc keeps a running build's root layer from the GC.

#include <memory>
#include <string>
#include <vector>

#include "sandbox/sandbox.h"
#include "session/template_manager.h"

namespace agentbox::session {

struct TemplateManager::Build {
  BuildInfo info;
  std::vector<std::string> log;
  std::string partial[2];                 // unfinished stdout / stderr line
  std::shared_ptr<sandbox::Sandbox> box;  // while it runs; under mu_
  std::uint64_t as_version = 0;           // BuildAs::version
};

}  // namespace agentbox::session
