#pragma once
// `--section cluster` (cluster_section.cc): three nodes on one etcd vs the owner / one daemon.

#include <cstdint>
#include <string>

namespace bench {

void section_cluster(const std::string& bin, const std::string& backend, int iterations,
                     std::uint64_t file_mb, int sessions);

}  // namespace bench
