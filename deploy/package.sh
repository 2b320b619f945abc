#!/usr/bin/env bash
# Builds the Debian package with CPack's DEB generator:
#   deploy/package.sh [BUILD_DIR]   -> BUILD_DIR/package/kvnode_<version>_amd64.deb
# Contents: what `cmake --install` installs, under /usr (kvnode, kvload,
# kvctl, kvfill; libkvclient.so/.a, its headers, the CMake package and
# kvnode.pc; the systemd unit) and /etc/kvnode/kvnode.env (a conffile).
# deploy/debian/postinst creates the kvnode system user and, on first
# install, /etc/kvnode/token (mode 0600). Depends: from dpkg-shlibdeps.
# BUILD_DIR (default build) is configured if it is not yet; only the
# packaged targets are built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$build" -j2 --target kvnode kvload kvctl kvfill kvclient_shared kvclient_static
rm -f "$build"/package/kvnode_*.deb
(cd "$build" && cpack -G DEB --config CPackConfig.cmake >package.log) ||
  { cat "$build/package.log"; exit 1; }
ls "$build"/package/kvnode_*_amd64.deb
