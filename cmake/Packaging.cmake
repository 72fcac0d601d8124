# `make package`: agentbox_<version>_<arch>.deb (CPack DEB). What it holds:
#   /usr/bin/{agentboxd,agentbox,agentbox-runner,agentbox-init}  (agentboxd finds agentbox-init
#                                                                  beside itself)
#   /lib/systemd/system/{agentboxd.service,agentbox-runner@.service}
#   /etc/agentbox/agentboxd.yaml   (a conffile: kept over upgrades, removed on purge)
#   /usr/share/man/man{1,8}/...     (from --help, by help2man, when it is installed)
# The data dir /var/lib/agentbox is made by the postinst (deploy/debian/postinst says what the
# maintainer scripts do on install, upgrade, remove and purge).
set(AGENTBOX_VERSION 0.2.0)
set(_deb ${PROJECT_SOURCE_DIR}/deploy/debian)

install(TARGETS agentboxd agentbox agentbox-runner agentbox-init RUNTIME DESTINATION bin)
install(FILES ${_deb}/agentboxd.service ${_deb}/agentbox-runner@.service
        DESTINATION /lib/systemd/system)
install(FILES ${_deb}/agentboxd.yaml DESTINATION /etc/agentbox)

# The Debian changelog (a native package) and lintian's overrides (deploy/debian says why).
add_custom_command(
  OUTPUT ${CMAKE_BINARY_DIR}/changelog.gz
  COMMAND sh -c "gzip -9n -c '${_deb}/changelog' > '${CMAKE_BINARY_DIR}/changelog.gz'"
  DEPENDS ${_deb}/changelog
  VERBATIM)
add_custom_target(deb_changelog ALL DEPENDS ${CMAKE_BINARY_DIR}/changelog.gz)
install(FILES ${CMAKE_BINARY_DIR}/changelog.gz DESTINATION share/doc/agentbox)
install(FILES ${_deb}/lintian-overrides DESTINATION share/lintian/overrides RENAME agentbox)

# Man pages from each program's --help (help2man; scripts/bootstrap installs it).
find_program(AGENTBOX_HELP2MAN help2man)
if(AGENTBOX_HELP2MAN)
  set(_man_dir ${CMAKE_BINARY_DIR}/man)
  set(_man_pages)
  foreach(spec "agentboxd:8:the agentbox daemon" "agentbox:1:the agentbox command-line client"
          "agentbox-runner:1:serves a workspace on this machine to agentboxd")
    string(REPLACE ":" ";" spec "${spec}")
    list(GET spec 0 prog)
    list(GET spec 1 section)
    list(GET spec 2 name)
    set(page ${_man_dir}/${prog}.${section})
    add_custom_command(
      OUTPUT ${page}.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${_man_dir}
      COMMAND ${AGENTBOX_HELP2MAN} --no-info --no-discard-stderr --section=${section}
              --version-string=${AGENTBOX_VERSION} --name=${name} --output=${page}
              $<TARGET_FILE:${prog}>
      COMMAND gzip -9nf ${page}
      DEPENDS ${prog}
      VERBATIM)
    list(APPEND _man_pages ${page}.gz)
    install(FILES ${page}.gz DESTINATION share/man/man${section})
  endforeach()
  add_custom_target(man_pages ALL DEPENDS ${_man_pages})
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME agentbox)
set(CPACK_PACKAGE_VERSION ${AGENTBOX_VERSION})
set(CPACK_PACKAGE_CONTACT "agentbox maintainers <agentbox@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "isolated, persistent workspaces for AI agents")
set(CPACK_PACKAGE_DESCRIPTION
    "agentboxd gives AI agents isolated, persistent workspaces (Linux namespaces,\n cgroups, overlayfs, seccomp) behind an HTTP API; agentbox is its command-line\n client and agentbox-runner serves a workspace on another machine to it.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # agentbox_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # the runtime libraries, by dpkg-shlibdeps
# deb-systemd-helper/-invoke (the maintainer scripts); nftables for the `open` network mode.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "init-system-helpers (>= 1.54~)")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "nftables")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${_deb}/conffiles ${_deb}/postinst ${_deb}/prerm
    ${_deb}/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
include(CPack)
