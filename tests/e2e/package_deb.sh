#!/usr/bin/env bash
# The Debian package (label unit, host, no root needed): deploy/package.sh
# builds kvnode_<version>_amd64.deb; its control declares the shared
# libraries' packages (dpkg-shlibdeps: libibverbs1, Abseil, glog, ...; RocksDB is linked statically) and
# adduser, the env file is a conffile, the maintainer scripts are there;
# `dpkg -x` into a throwaway root shows the binaries, libkvclient with its
# SONAME, the client headers, the CMake package, the unit pointing at
# /usr/bin/kvnode and /etc/kvnode/kvnode.env, and the extracted kvnode runs.
set -euo pipefail
build=${KVNODE_BUILD_DIR:?KVNODE_BUILD_DIR must point at the build directory}
src=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "package_deb: FAIL: $*" >&2; exit 1; }

deb=$("$src/deploy/package.sh" "$build" | tail -1)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[[ $(basename "$deb") == "kvnode_${version}_amd64.deb" ]] || fail "package named $(basename "$deb")"
info=$(dpkg-deb -I "$deb")
depends=$(sed -n 's/^ Depends: //p' <<<"$info")
for d in adduser libibverbs1 libgflags libgoogle-glog libabsl libc6; do
  [[ $depends == *"$d"* ]] || fail "Depends lacks $d: $depends"
done
[[ $(dpkg-deb -f "$deb" Package) == kvnode && $(dpkg-deb -f "$deb" Architecture) == amd64 ]] ||
  fail "control: $info"
ctl=$(mktemp -d /tmp/kvnode-deb-ctl.XXXXXX)
root=$(mktemp -d /tmp/kvnode-deb-root.XXXXXX)
trap 'rm -rf "$ctl" "$root"' EXIT
dpkg-deb -e "$deb" "$ctl"
[[ $(cat "$ctl/conffiles") == /etc/kvnode/kvnode.env ]] || fail "conffiles: $(cat "$ctl/conffiles")"
for s in postinst prerm postrm; do
  [[ -x $ctl/$s ]] || fail "no executable $s"
  sh -n "$ctl/$s" || fail "$s does not parse"
done
grep -q 'adduser --system' "$ctl/postinst" || fail "postinst creates no system user"

dpkg -x "$deb" "$root"
for f in usr/bin/kvnode usr/bin/kvload usr/bin/kvctl usr/bin/kvfill usr/lib/libkvclient.a \
  usr/include/kvnode/client/client.h usr/lib/cmake/kvnode/kvnodeConfig.cmake \
  usr/lib/pkgconfig/kvnode.pc usr/lib/systemd/system/kvnode.service etc/kvnode/kvnode.env; do
  [[ -e $root/$f ]] || fail "$f not in the package"
done
so=$(readelf -d "$root/usr/lib/libkvclient.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ -e $root/usr/lib/$so ]] || fail "SONAME $so not in the package"
unit=$root/usr/lib/systemd/system/kvnode.service
grep -qx 'ExecStart=/usr/bin/kvnode \\' "$unit" || fail "unit ExecStart: $(grep ExecStart "$unit")"
grep -qx 'EnvironmentFile=/etc/kvnode/kvnode.env' "$unit" || fail "unit EnvironmentFile"
v=$("$root/usr/bin/kvnode" --version 2>&1)
[[ $v == *"kvnode version $version (build "* ]] || fail "extracted kvnode --version: $v"
echo "package_deb: ok: $deb (Depends: $depends)"
