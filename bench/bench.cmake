if(TARGET agentbox_client)
  add_executable(agentbox-bench ${CMAKE_CURRENT_SOURCE_DIR}/agentbox_bench.cc
                                ${CMAKE_CURRENT_SOURCE_DIR}/cluster_section.cc)
  # The cluster section starts real etcd members with the tests' support (tests/support/etcd.h).
  target_link_libraries(agentbox-bench PRIVATE agentbox_client agentbox_test_support
                        nlohmann_json::nlohmann_json CLI11::CLI11)
  agentbox_target(agentbox-bench)
  # The e2b section runs the stock SDK from tests/node (installed by scripts/bootstrap).
  target_compile_definitions(agentbox-bench PRIVATE
                             AGENTBOX_NODE_DIR="${PROJECT_SOURCE_DIR}/tests/node")
endif()
