#!/usr/bin/env bash
# The Debian package (label unit, host, no root needed): deploy/package.sh
# builds kvnode_<version>_amd64.deb; its control declares the shared
# libraries' packages (dpkg-shlibdeps: libibverbs1, Abseil, glog, ...;
# RocksDB is linked statically) and adduser, the env file is a conffile, the
# maintainer scripts are there; `dpkg -x` into build/package/root (where
# e2e_deb_unit finds the packaged unit) shows the binaries, libkvclient with
# its SONAME, the client headers, the CMake package, the unit pointing at
# /usr/bin/kvnode and /etc/kvnode/kvnode.env, and the extracted kvnode runs.
# Then, as root, a real dpkg -i, reinstall and purge in an overlay root.
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
# Unpacked where e2e_deb_unit (in the VM) finds the packaged unit and binary.
root=$build/package/root
rm -rf "$root"
mkdir -p "$root"
ovl=$(mktemp -d /tmp/kvnode-deb-ovl.XXXXXX)
trap 'rm -rf "$ctl"; rmdir "$ovl" 2>/dev/null || true' EXIT
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
echo "package_deb: dpkg -x: ok"

# Full dpkg -i / reinstall / --purge in a throwaway root: an overlay over
# the host's root (whose libraries satisfy Depends) in a private mount
# namespace, upper layer on a tmpfs; nothing reaches the host's dpkg
# database or /etc. Needs root (mount); skipped with a reason otherwise.
if [[ $(id -u) -ne 0 ]] || ! command -v unshare >/dev/null; then
  echo "package_deb: dpkg -i in an overlay root skipped: needs root and unshare"
  echo "package_deb: ok: $deb (Depends: $depends)"
  exit 0
fi
unshare -m --propagation private bash -s "$deb" "$ovl" <<'OVERLAY' || fail "dpkg -i in an overlay root (see above)"
set -euo pipefail
deb=$1
fail() { echo "package_deb (overlay root): FAIL: $*" >&2; exit 1; }
d=$2
mount -t tmpfs tmpfs "$d"
mkdir "$d/upper" "$d/work" "$d/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$d/upper,workdir=$d/work" "$d/root"
r=$d/root
mount -t proc proc "$r/proc"
mount --rbind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
cp "$deb" "$r/tmp/kvnode.deb"
in_root() { chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
in_root dpkg -i /tmp/kvnode.deb >"$d/dpkg-i.log" 2>&1 || { cat "$d/dpkg-i.log"; fail "dpkg -i"; }
in_root getent passwd kvnode | grep -q '^kvnode:' || fail "no kvnode user after install"
[[ $(in_root stat -c '%a %U' /etc/kvnode/token) == "600 kvnode" ]] ||
  fail "token: $(in_root stat -c '%a %U' /etc/kvnode/token)"
[[ $(in_root stat -c '%a' /etc/kvnode) == 700 ]] || fail "/etc/kvnode is not 0700"
token=$(cat "$r/etc/kvnode/token")
[[ $token =~ ^[0-9a-f]{64}$ ]] || fail "token is not 32 random bytes in hex"
in_root /usr/bin/kvnode --version >/dev/null || fail "installed kvnode does not run"
# A reinstall (an upgrade of the package) keeps the token and the user.
in_root dpkg -i /tmp/kvnode.deb >"$d/dpkg-i2.log" 2>&1 || { cat "$d/dpkg-i2.log"; fail "reinstall"; }
[[ $(cat "$r/etc/kvnode/token") == "$token" ]] || fail "reinstall replaced the token"
in_root dpkg --purge kvnode >"$d/purge.log" 2>&1 || { cat "$d/purge.log"; fail "dpkg --purge"; }
for f in /usr/bin/kvnode /usr/lib/libkvclient.so /usr/lib/systemd/system/kvnode.service \
  /etc/kvnode/kvnode.env /etc/kvnode/token; do
  [[ ! -e $r$f ]] || fail "$f left after purge"
done
echo "package_deb: dpkg -i (user kvnode, token 0600), reinstall (token kept), purge: ok"
OVERLAY
echo "package_deb: ok: $deb (Depends: $depends)"
