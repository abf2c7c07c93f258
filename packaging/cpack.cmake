# packaging/cpack.cmake: what `cmake --install` puts outside bin/ and the plugin directory (example
# configuration, man pages, the tmpfiles entry for /run/gantry, package docs) and the CPack settings
# that turn an install into a .deb and an .rpm. Included at the end of the top-level CMakeLists.txt.
#
# Packages are meant to be configured with -DCMAKE_INSTALL_PREFIX=/usr (packaging/build-packages.sh
# does): the plugin looks for the CLI at the compiled-in ${CMAKE_INSTALL_FULL_BINDIR}/gantry, so the
# prefix used at build time must be the one the package installs to.
include_guard(GLOBAL)

# Sites whose Slurm is not Debian's (ParallelCluster's /opt/slurm, SchedMD's slurm-smd packages in
# Slinky images) cannot satisfy a dependency on Debian's slurm-wlm-basic-plugins; they turn this off
# and rely on the plugin's own load-time version check instead.
option(GANTRY_PACKAGE_SLURM_DEPENDS "Make the packages depend on the Slurm release the plugin was built for" ON)
# gantry.conf and plugstack.conf.d are read from fixed paths under /etc by the code and by Slurm, so
# they do not follow the install prefix.
set(GANTRY_INSTALL_SYSCONFDIR "/etc" CACHE PATH "Where /etc/gantry and /etc/slurm/plugstack.conf.d are installed")

set(_pkg ${CMAKE_CURRENT_LIST_DIR})
set(_pkg_out ${CMAKE_BINARY_DIR}/packaging)
file(MAKE_DIRECTORY ${_pkg_out})

# Slurm release the plugin is built for: GANTRY_SLURM_MAJOR, _MINOR, _RELEASE ("22.05"), set in the
# top-level CMakeLists.txt from slurm_version.h.
math(EXPR _next_minor "${GANTRY_SLURM_MINOR} + 1")
# Slurm numbers releases YY.MM: any later month sorts after every 22.05.x, so "<< 22.06~" bounds it.
if(_next_minor LESS 10)
  set(_slurm_next "${GANTRY_SLURM_MAJOR}.0${_next_minor}")
else()
  set(_slurm_next "${GANTRY_SLURM_MAJOR}.${_next_minor}")
endif()

# ---------------------------------------------------------------- install rules

# Example configuration. /etc/gantry/gantry.conf is the file the CLI and the plugin read by default;
# every key in it is commented out, so installing changes no behaviour.
install(FILES ${PROJECT_SOURCE_DIR}/conf/gantry.conf DESTINATION ${GANTRY_INSTALL_SYSCONFDIR}/gantry
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
# Debian's plugstack.conf includes plugstack.conf.d/*.conf, so this file is live the moment it lands:
# its `required` line stays commented until the admin enables it (installing never enables the plugin).
# The example names Debian's plugin directory; a build for another one gets its own path written in.
if(IS_ABSOLUTE "${GANTRY_SLURM_PLUGIN_DIR}")
  set(_plugin_dir "${GANTRY_SLURM_PLUGIN_DIR}")
else()
  set(_plugin_dir "${CMAKE_INSTALL_PREFIX}/${GANTRY_SLURM_PLUGIN_DIR}")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/conf/plugstack.conf)
file(READ ${PROJECT_SOURCE_DIR}/conf/plugstack.conf _plugstack)
string(REPLACE "/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so" "${_plugin_dir}/spank_gantry.so" _plugstack "${_plugstack}")
string(REPLACE "gantry=/usr/bin/gantry" "gantry=${CMAKE_INSTALL_FULL_BINDIR}/gantry" _plugstack "${_plugstack}")
file(WRITE ${_pkg_out}/plugstack.conf "${_plugstack}")
install(FILES ${_pkg_out}/plugstack.conf DESTINATION ${GANTRY_INSTALL_SYSCONFDIR}/slurm/plugstack.conf.d
        RENAME gantry.conf PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

# The AppArmor profile of gantry-holder (packaging/apparmor/gantry): Ubuntu 24.04 gives a user namespace
# capabilities only to programs a profile with a `userns` rule covers. A build for another libexec
# directory gets its own holder path written in.
file(READ ${_pkg}/apparmor/gantry _apparmor)
string(REPLACE "/usr/libexec/gantry/gantry-holder" "${CMAKE_INSTALL_FULL_LIBEXECDIR}/gantry/gantry-holder" _apparmor "${_apparmor}")
file(WRITE ${_pkg_out}/apparmor-gantry "${_apparmor}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_pkg}/apparmor/gantry)
install(FILES ${_pkg_out}/apparmor-gantry DESTINATION ${GANTRY_INSTALL_SYSCONFDIR}/apparmor.d RENAME gantry
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

# /run/gantry (runtime_path) is created at boot by systemd-tmpfiles, and by the package scripts.
install(FILES ${_pkg}/tmpfiles/gantry.conf DESTINATION lib/tmpfiles.d
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

# The login nodes' stage server for a trusted store (docs/admin.md, "Staging into a trusted store"): a
# socket and a service unit, never enabled by the package (the admin enables the socket on login nodes).
# A build for another bindir gets its own CLI path written in.
file(READ ${_pkg}/systemd/gantry-stage.service _stage_service)
string(REPLACE "/usr/bin/gantry" "${CMAKE_INSTALL_FULL_BINDIR}/gantry" _stage_service "${_stage_service}")
file(WRITE ${_pkg_out}/gantry-stage.service "${_stage_service}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_pkg}/systemd/gantry-stage.service)
install(FILES ${_pkg_out}/gantry-stage.service ${_pkg}/systemd/gantry-stage.socket DESTINATION lib/systemd/system
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

# bash completion (verbs, options, stored images), where bash-completion loads it on first use.
install(FILES ${_pkg}/completion/gantry DESTINATION share/bash-completion/completions
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

# Man pages and package docs, gzipped reproducibly (-n: no name or time stamp) as Debian policy asks.
set(_gz_files)
foreach(pair "man/gantry.1:share/man/man1" "man/enroot.1:share/man/man1" "man/gantry.conf.5:share/man/man5"
             "debian/changelog:share/doc/gantry")
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 src)
  list(GET pair 1 dest)
  get_filename_component(name ${src} NAME)
  if(name STREQUAL "changelog")
    set(name changelog.gz)  # a native package's changelog name, where lintian looks for it
  else()
    set(name ${name}.gz)
  endif()
  add_custom_command(OUTPUT ${_pkg_out}/${name}
                     COMMAND gzip -9nc ${_pkg}/${src} > ${_pkg_out}/${name}
                     DEPENDS ${_pkg}/${src} VERBATIM)
  list(APPEND _gz_files ${_pkg_out}/${name})
  install(FILES ${_pkg_out}/${name} DESTINATION ${dest} PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endforeach()
add_custom_target(gantry_package_docs ALL DEPENDS ${_gz_files})
# Lintian tags that are deliberate (each with its reason in the file).
install(FILES ${_pkg}/debian/lintian-overrides DESTINATION share/lintian/overrides RENAME gantry
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
install(FILES ${_pkg}/debian/copyright ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/admin.md
              ${PROJECT_SOURCE_DIR}/docs/user.md
        DESTINATION share/doc/gantry PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

# ---------------------------------------------------------------- CPack

set(CPACK_PACKAGE_NAME gantry)
set(CPACK_PACKAGE_VENDOR "Gantry authors")
set(GANTRY_PACKAGE_CONTACT "Gantry maintainers <gantry-maintainers@lists.example.org>"
    CACHE STRING "Maintainer field of the packages")
set(CPACK_PACKAGE_CONTACT "${GANTRY_PACKAGE_CONTACT}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Slurm SPANK plugin and container runtime for GPU clusters")
# Wrapped below 80 columns: dpkg shows the extended description as written (lintian checks it).
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "Gantry runs Slurm job steps in unprivileged containers started from squashfs\n"
  "images kept in a shared, content-addressed store. It accepts the Pyxis\n"
  "command-line options (--container-image, --container-mounts, ...), pulls each\n"
  "image once per cluster and converts it in a single streaming pass.\n"
  "\n"
  "This package holds the SPANK plugin spank_gantry.so, the gantry command and\n"
  "example configuration. The plugin stays disabled until the admin uncomments\n"
  "its line in /etc/slurm/plugstack.conf.d/gantry.conf.")
set(CPACK_GENERATOR "DEB;RPM" CACHE STRING "CPack generators")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_SOURCE_GENERATOR "")

# Debian. Library dependencies come from dpkg-shlibdeps; what the code runs or dlopens is named here.
set(_deb_depends "squashfuse, fuse3")
if(GANTRY_PACKAGE_SLURM_DEPENDS)
  # slurmd and slurm-client both depend on exactly their own version of slurm-wlm-basic-plugins, which
  # also owns the plugin directory: bounding it pins the Slurm release on login and compute nodes.
  string(APPEND _deb_depends ", slurm-wlm-basic-plugins (>= ${GANTRY_SLURM_RELEASE}~), slurm-wlm-basic-plugins (<< ${_slurm_next}~)")
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${_deb_depends}")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "squashfs-tools, ca-certificates")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "amazon-ecr-credential-helper")
# /usr/bin/enroot is Gantry's (runtime/cli/enroot.cpp): the package takes the place of Enroot's, which
# must go first (docs/admin.md, "Upgrading from Pyxis + Enroot": Pyxis runs Enroot's own enroot).
set(CPACK_DEBIAN_PACKAGE_CONFLICTS "enroot, enroot+caps")
set(CPACK_DEBIAN_PACKAGE_REPLACES "enroot, enroot+caps")
set(CPACK_DEBIAN_PACKAGE_PROVIDES "enroot")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
configure_file(${_pkg}/debian/postinst.in ${_pkg_out}/deb/postinst @ONLY)
configure_file(${_pkg}/debian/conffiles.in ${_pkg_out}/deb/conffiles @ONLY)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${_pkg_out}/deb/postinst;${_pkg_out}/deb/conffiles")

# RPM (built with Debian's rpm package here; for RHEL/AL2023 build on the target, see docs/admin.md).
set(CPACK_RPM_PACKAGE_LICENSE "Proprietary")
set(CPACK_RPM_PACKAGE_GROUP "System Environment/Base")
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
set(_rpm_requires "squashfuse, fuse3")
if(GANTRY_PACKAGE_SLURM_DEPENDS)
  string(APPEND _rpm_requires ", slurm >= ${GANTRY_SLURM_RELEASE}, slurm < ${_slurm_next}")
endif()
set(CPACK_RPM_PACKAGE_REQUIRES "${_rpm_requires}")
set(CPACK_RPM_PACKAGE_CONFLICTS "enroot, enroot+caps")  # /usr/bin/enroot, as for the .deb
set(CPACK_RPM_PACKAGE_PROVIDES "enroot")
set(CPACK_RPM_POST_INSTALL_SCRIPT_FILE ${_pkg_out}/rpm/post)
configure_file(${_pkg}/rpm/post.in ${_pkg_out}/rpm/post @ONLY)
set(CPACK_RPM_USER_FILELIST
    "%config(noreplace) ${GANTRY_INSTALL_SYSCONFDIR}/gantry/gantry.conf"
    "%config(noreplace) ${GANTRY_INSTALL_SYSCONFDIR}/slurm/plugstack.conf.d/gantry.conf"
    "%config(noreplace) ${GANTRY_INSTALL_SYSCONFDIR}/apparmor.d/gantry")
# Directories other packages own: the RPM must not claim them.
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION
    ${GANTRY_INSTALL_SYSCONFDIR}/slurm ${GANTRY_INSTALL_SYSCONFDIR}/slurm/plugstack.conf.d ${GANTRY_INSTALL_SYSCONFDIR}/apparmor.d
    ${CMAKE_INSTALL_PREFIX}/lib/tmpfiles.d ${CMAKE_INSTALL_PREFIX}/lib/systemd ${CMAKE_INSTALL_PREFIX}/lib/systemd/system
    ${CMAKE_INSTALL_FULL_LIBDIR} ${_plugin_dir}
    ${CMAKE_INSTALL_FULL_LIBEXECDIR} ${CMAKE_INSTALL_FULL_MANDIR} ${CMAKE_INSTALL_FULL_MANDIR}/man1
    ${CMAKE_INSTALL_FULL_MANDIR}/man5 ${CMAKE_INSTALL_FULL_DATAROOTDIR}/doc)

include(CPack)
