#!/usr/bin/env bash
# Device half of the install test: the INSTALLED kvnode (install_example_build,
# label unit, installed it and built examples/hello_client against the
# installed package on the host) serves hello_client, which PUTs and GETs and
# then keeps going across a live upgrade between two builds (build ids
# build-a -> build-b): it must follow the Move without a failed operation.
# The installed kvctl's ping reports the node's version, and both processes
# log the upgrade as "version build-a -> build-b".
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device

out=$KV_BUILD/install-example
hello=$out/build/hello_client
[[ -x $hello && -x $out/prefix/bin/kvnode ]] ||
  kv_fail "$hello or $out/prefix/bin/kvnode missing: run ctest -R install_example_build on the host first"
KV_KVCTL=$out/prefix/bin/kvctl
kv_tmpdir install-builds
builds=$KV_TMP
KV_NODE_BIN_REAL=$out/prefix/bin/kvnode up_make_builds "$builds"
KV_NODE_BIN=$builds/kvnode-a
kv_start_node
UP_FIRST_PID=$KV_PID

"$hello" "$KV_ADDR" "$KV_TOKEN" 1 >"$KV_DIR/hello.out" 2>&1 &
hello_pid=$!
said_hello() { grep -q '^hello -> world' "$KV_DIR/hello.out"; }
kv_wait_for 60 said_hello || { cat "$KV_DIR/hello.out"; kv_fail "hello_client: no PUT/GET"; }
kv_ok "hello_client (installed package) PUT and GET"
ping=$("$KV_KVCTL" --admin_socket "$KV_ADMIN" ping)
[[ $ping == *" version build-a"* ]] || kv_fail "kvctl ping shows no version: $ping"

up_upgrade kvctl
rc=0
wait "$hello_pid" || rc=$?
cat "$KV_DIR/hello.out"
[[ $rc -eq 0 ]] || kv_fail "hello_client exited $rc across the upgrade"
grep -q '^moves 1, .*failed ops 0$' "$KV_DIR/hello.out" || kv_fail "hello_client did not follow the Move"
kv_ok "hello_client followed the live upgrade"
ping=$("$KV_KVCTL" --admin_socket "$KV_ADMIN" ping)
[[ $ping == *" version build-b"* ]] || kv_fail "kvctl ping after the upgrade: $ping"
n=$(grep -c 'upgrade: .*version build-a -> build-b' "$KV_LOG" || true)
[[ $n -ge 2 ]] || kv_fail "old and new process did not both log 'version build-a -> build-b' ($n lines)"
kv_ok "ping and both sides' logs report the versions"
up_stop_node
