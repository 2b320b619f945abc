#!/usr/bin/env bash
# Builds the Debian package with CPack's DEB generator:
#   deploy/package.sh [BUILD_DIR]   -> BUILD_DIR/package/kvnode_<version>_amd64.deb
# Contents: what `cmake --install` installs, under /usr (kvnode, kvload,
# kvctl, kvfill; libkvclient.so/.a, the CMake package and kvnode.pc in the
# multiarch /usr/lib/x86_64-linux-gnu; the client's headers; the systemd
# unit, which runs the node as the kvnode user) and /etc/kvnode/kvnode.env (a
# conffile). deploy/debian/postinst creates the kvnode system user and, on
# first install, /etc/kvnode/token (kvnode's, mode 0600); postrm purge removes
# the database and the token. Depends: from dpkg-shlibdeps.
# BUILD_DIR (default build) is configured if it is not yet; only the
# packaged targets are built. For the package it is configured with
# CMAKE_INSTALL_PREFIX=/usr (GNUInstallDirs then gives Debian's
# lib/x86_64-linux-gnu) and given its own prefix back afterwards (a
# configure step only: the prefix changes no object).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
if [[ $prefix != /usr ]]; then
  trap 'cmake -DCMAKE_INSTALL_PREFIX="$prefix" "$build" >/dev/null' EXIT
  cmake -DCMAKE_INSTALL_PREFIX=/usr "$build" >/dev/null
fi
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
[[ $libdir == lib/* ]] || echo "package.sh: warning: libraries go to /usr/$libdir, not multiarch" >&2
cmake --build "$build" -j2 --target kvnode kvload kvctl kvfill kvclient_shared kvclient_static
rm -f "$build"/package/kvnode_*.deb
(cd "$build" && cpack -G DEB --config CPackConfig.cmake >package.log) ||
  { cat "$build/package.log"; exit 1; }
ls "$build"/package/kvnode_*_amd64.deb
