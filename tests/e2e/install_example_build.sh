#!/usr/bin/env bash
# Host half of the install test (label unit, no device): `cmake --install`
# into a fresh prefix under the build directory, check what it installed
# (binaries, libkvclient.so with its SONAME and .a, only the client's
# headers and each compiles on its own, the CMake package, kvnode.pc, the unit
# rewritten for the prefix, the env file), then build examples/hello_client
# against that prefix twice: with find_package(kvnode) and with pkg-config.
# e2e_install_example (install_example.sh, in the VM) runs what this built.
set -euo pipefail
build=${KVNODE_BUILD_DIR:?KVNODE_BUILD_DIR must point at the build directory}
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$build/install-example
prefix=$out/prefix
fail() { echo "install_example_build: FAIL: $*" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
cmake --install "$build" --prefix "$prefix" >"$out/install.log" || { cat "$out/install.log"; fail "cmake --install"; }
libdir=$(cd "$prefix" && find lib* -name libkvclient.a -printf '%h\n' -quit)
[[ -n $libdir ]] || fail "no libkvclient.a under $prefix/lib*"
for f in bin/kvnode bin/kvload bin/kvctl bin/kvfill "$libdir/libkvclient.a" \
  "$libdir/cmake/kvnode/kvnodeConfig.cmake" "$libdir/cmake/kvnode/kvnodeConfigVersion.cmake" \
  "$libdir/pkgconfig/kvnode.pc" lib/systemd/system/kvnode.service etc/kvnode/kvnode.env; do
  [[ -e $prefix/$f ]] || fail "$f not installed"
done
so=$(readelf -d "$prefix/$libdir/libkvclient.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $so =~ ^libkvclient\.so\.[0-9]+\.[0-9]+$ && -e $prefix/$libdir/$so ]] ||
  fail "libkvclient.so SONAME '$so' (expected libkvclient.so.MAJOR.MINOR, installed)"
# Only the client's headers, and each one compiles alone.
others=$(cd "$prefix/include" && find . -type f ! -path './kvnode/client/*')
[[ -z $others ]] || fail "headers other than kvnode/client/ installed: $others"
for h in "$prefix"/include/kvnode/client/*.h; do
  echo "#include \"kvnode/client/$(basename "$h")\"" |
    g++ -std=c++20 -fsyntax-only -I"$prefix/include" -x c++ - || fail "$h does not compile alone"
done
grep -qx "ExecStart=$prefix/bin/kvnode \\\\" "$prefix/lib/systemd/system/kvnode.service" ||
  fail "unit's ExecStart does not name $prefix/bin/kvnode"
grep -qx "EnvironmentFile=$prefix/etc/kvnode/kvnode.env" "$prefix/lib/systemd/system/kvnode.service" ||
  fail "unit's EnvironmentFile does not name $prefix/etc/kvnode/kvnode.env"
for b in kvnode kvctl; do
  v=$("$prefix/bin/$b" --version 2>&1 | head -1)
  [[ $v =~ ^$b\ version\ [0-9]+\.[0-9]+\.[0-9]+\ \(build\ [^\)]+\)$ ]] || fail "$b --version: $v"
  echo "$v"
done

# The example, as an application outside the tree would build it.
cmake -S "$src/examples/hello_client" -B "$out/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo $(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache) \
  >"$out/configure.log" || { cat "$out/configure.log"; fail "example: configure"; }
cmake --build "$out/build" >"$out/build.log" || { cat "$out/build.log"; fail "example: build"; }
# Whole outputs first: grep -q in a pipe would cut the writer off (pipefail).
libs=$(ldd "$out/build/hello_client")
[[ $libs == *"$prefix/$libdir/libkvclient.so"* ]] ||
  fail "hello_client does not use the installed libkvclient.so: $libs"
# pkg-config users: the same program, static library (Libs.private counts).
PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
export PKG_CONFIG_PATH
# shellcheck disable=SC2046 # word splitting of pkg-config's flags is wanted
g++ -o "$out/hello_client_pc" "$src/examples/hello_client/hello_client.cc" \
  $(pkg-config --cflags kvnode) "$prefix/$libdir/libkvclient.a" $(pkg-config --libs --static kvnode | sed 's/-lkvclient//') ||
  fail "example: build with pkg-config"
echo "install_example_build: ok: $prefix ($so), example built with find_package and pkg-config"
