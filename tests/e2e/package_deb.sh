#!/usr/bin/env bash
# The Debian package (label unit, host, no root needed): deploy/package.sh
# builds kvnode_<version>_amd64.deb; its control declares the shared
# libraries' packages (dpkg-shlibdeps: libibverbs1, Abseil, glog, ...;
# RocksDB is linked statically) and adduser, the env file is a conffile, the
# maintainer scripts are there; `dpkg -x` into build/package/root (where
# e2e_deb_unit finds the packaged unit) shows the binaries, libkvclient with
# its SONAME, the CMake package and kvnode.pc in the multiarch
# /usr/lib/x86_64-linux-gnu, the client headers, the unit pointing at
# /usr/bin/kvnode and /etc/kvnode/kvnode.env and running as User=kvnode, and
# the extracted kvnode runs. Then, as root, in an overlay root: dpkg -i (the
# kvnode system user; /etc/kvnode root:kvnode 0750; the token kvnode's, 0600,
# readable by kvnode and by no other user), reinstall (token kept), remove
# (the database, the token and the user stay), purge (database, token, the
# enable link go; the user stays).
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
# Debian's multiarch library directory, as GNUInstallDirs gives it for /usr.
ml=usr/lib/x86_64-linux-gnu
for f in usr/bin/kvnode usr/bin/kvload usr/bin/kvctl usr/bin/kvfill $ml/libkvclient.a \
  usr/include/kvnode/client/client.h $ml/cmake/kvnode/kvnodeConfig.cmake \
  $ml/pkgconfig/kvnode.pc usr/lib/systemd/system/kvnode.service etc/kvnode/kvnode.env; do
  [[ -e $root/$f ]] || fail "$f not in the package"
done
[[ ! -e $root/usr/lib/libkvclient.so ]] || fail "libkvclient.so in /usr/lib, not $ml"
so=$(readelf -d "$root/$ml/libkvclient.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ -e $root/$ml/$so ]] || fail "SONAME $so not in the package"
grep -qx 'libdir=${prefix}/lib/x86_64-linux-gnu' "$root/$ml/pkgconfig/kvnode.pc" ||
  fail "kvnode.pc libdir: $(grep libdir= "$root/$ml/pkgconfig/kvnode.pc")"
unit=$root/usr/lib/systemd/system/kvnode.service
grep -qx 'ExecStart=/usr/bin/kvnode \\' "$unit" || fail "unit ExecStart: $(grep ExecStart "$unit")"
grep -q '^ExecReload=/usr/bin/kvctl ' "$unit" || fail "unit ExecReload: $(grep ExecReload "$unit")"
grep -qx 'EnvironmentFile=/etc/kvnode/kvnode.env' "$unit" || fail "unit EnvironmentFile"
# The service's user, and what systemd must give it (checked running in the
# VM by e2e_deb_unit).
for l in User=kvnode Group=kvnode StateDirectory=kvnode StateDirectoryMode=0700 \
  RuntimeDirectory=kvnode RuntimeDirectoryMode=0700 LimitMEMLOCK=infinity; do
  grep -qx "$l" "$unit" || fail "unit lacks $l"
done
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
! in_root getent passwd kvnode >/dev/null || fail "the throwaway root has a kvnode user before install"
in_root dpkg -i /tmp/kvnode.deb >"$d/dpkg-i.log" 2>&1 || { cat "$d/dpkg-i.log"; fail "dpkg -i"; }
# A system user (uid below 1000, no login shell, no home made) and its group.
IFS=: read -r _ _ uid gid _ home shell < <(in_root getent passwd kvnode) || fail "no kvnode user after install"
[[ $uid -gt 0 && $uid -lt 1000 ]] || fail "kvnode uid $uid is not a system uid"
[[ $(in_root getent group kvnode | cut -d: -f3) == "$gid" ]] || fail "kvnode's group is not kvnode"
[[ $shell == */nologin && $home == /var/lib/kvnode ]] || fail "kvnode: home $home, shell $shell"
[[ $(in_root stat -c '%a %U:%G' /etc/kvnode/token) == "600 kvnode:kvnode" ]] ||
  fail "token: $(in_root stat -c '%a %U:%G' /etc/kvnode/token)"
[[ $(in_root stat -c '%a %U:%G' /etc/kvnode) == "750 root:kvnode" ]] ||
  fail "/etc/kvnode: $(in_root stat -c '%a %U:%G' /etc/kvnode)"
token=$(cat "$r/etc/kvnode/token")
[[ $token =~ ^[0-9a-f]{64}$ ]] || fail "token is not 32 random bytes in hex"
# The service's user reads the token (as the node will); another user cannot.
[[ $(in_root setpriv --reuid=kvnode --regid=kvnode --init-groups cat /etc/kvnode/token) == "$token" ]] ||
  fail "the kvnode user cannot read /etc/kvnode/token"
! in_root setpriv --reuid=nobody --regid=nogroup --clear-groups cat /etc/kvnode/token >/dev/null 2>&1 ||
  fail "user nobody can read /etc/kvnode/token"
in_root /usr/bin/kvnode --version >/dev/null || fail "installed kvnode does not run"
# A reinstall (an upgrade of the package) keeps the token and the user.
in_root dpkg -i /tmp/kvnode.deb >"$d/dpkg-i2.log" 2>&1 || { cat "$d/dpkg-i2.log"; fail "reinstall"; }
[[ $(cat "$r/etc/kvnode/token") == "$token" ]] || fail "reinstall replaced the token"
[[ $(in_root id -u kvnode) == "$uid" ]] || fail "reinstall changed kvnode's uid"
# State as a running service would leave it: a database in the state
# directory (kvnode's) and `systemctl enable`'s link.
in_root install -d -m 700 -o kvnode -g kvnode /var/lib/kvnode /var/lib/kvnode/db
echo data >"$r/var/lib/kvnode/db/CURRENT"
mkdir -p "$r/etc/systemd/system/multi-user.target.wants"
ln -s /usr/lib/systemd/system/kvnode.service "$r/etc/systemd/system/multi-user.target.wants/kvnode.service"
# remove: the package's files go, the state stays.
in_root dpkg --remove kvnode >"$d/remove.log" 2>&1 || { cat "$d/remove.log"; fail "dpkg --remove"; }
for f in /usr/bin/kvnode /usr/lib/x86_64-linux-gnu/libkvclient.so /usr/lib/systemd/system/kvnode.service; do
  [[ ! -e $r$f ]] || fail "$f left after remove"
done
for f in /var/lib/kvnode/db/CURRENT /etc/kvnode/token /etc/kvnode/kvnode.env; do
  [[ -e $r$f ]] || fail "remove (not purge) deleted $f"
done
# purge: the state goes too; the user stays (Debian policy).
in_root dpkg --purge kvnode >"$d/purge.log" 2>&1 || { cat "$d/purge.log"; fail "dpkg --purge"; }
for f in /var/lib/kvnode /etc/kvnode/kvnode.env /etc/kvnode/token /etc/kvnode \
  /etc/systemd/system/multi-user.target.wants/kvnode.service; do
  [[ ! -e $r$f && ! -L $r$f ]] || fail "$f left after purge"
done
[[ $(in_root id -u kvnode) == "$uid" ]] || fail "purge removed the kvnode user"
[[ -z $(in_root dpkg-query -W -f '${db:Status-Abbrev}' kvnode 2>/dev/null) ]] ||
  fail "dpkg still knows kvnode after purge"
echo "package_deb: dpkg -i (system user kvnode uid $uid, /etc/kvnode 0750 root:kvnode, token 0600 kvnode), reinstall (token kept), remove (state kept), purge (state gone, user kept): ok"
OVERLAY
echo "package_deb: ok: $deb (Depends: $depends)"
