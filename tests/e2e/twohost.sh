#!/usr/bin/env bash
# Runs one two-host e2e script (ctest label twohost) on the host:
#
#   tests/e2e/twohost.sh twohost_upgrade.sh
#
# boots the two guests of `deploy/vm/rxe-vm --two-host` (node on "server"
# 10.77.0.1, clients on "client" 10.77.0.2, one virtual link), runs the
# script on both (each picks its part by RXE_VM_ROLE), and passes when both
# exit 0. The guests meet in build/twohost/NAME/ (TH_DIR; logs of a failed
# run stay there). Prints the rxe0 counter lines the script recorded.
# RXE_VM_CACHE selects the VM cache as for deploy/vm/rxe-vm; TH_VM_TIMEOUT (s)
# bounds the guests (default 900). TH_LONG=1 selects the long variants.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$(dirname "$here")")
build=$(realpath "${KVNODE_BUILD_DIR:?KVNODE_BUILD_DIR must point at the build directory}")
script=${1:?usage: twohost.sh SCRIPT}
name=$(basename "$script" .sh)
dir=$build/twohost/$name
rm -rf "$dir"
mkdir -p "$dir"

t0=$SECONDS
for attempt in 1 2; do
  rc=0
  (cd "$repo" && deploy/vm/rxe-vm --two-host --timeout "${TH_VM_TIMEOUT:-900}" --rw "$build" \
    --results "$dir" --rc-file "$dir/rc" -- env TH_DIR="$dir" KVNODE_BUILD_DIR="$build" \
    "$here/$script") || rc=$?
  # 125: a guest failed before its command could report (deploy/vm/rxe-vm's
  # boot watchdog, a guest that died), or found the link between the guests
  # dead (twohost_lib.sh's th_exit): the test bed's failure, not the
  # test's. Tried once more from a clean directory.
  ((attempt == 1)) && grep -q ' 125$' "$dir/rc" 2>/dev/null || break
  echo "twohost: $name: the test bed failed ($(tr '\n' ' ' <"$dir/rc")); once more"
  rm -rf "$dir"
  mkdir -p "$dir"
done
[[ -f $dir/counters.txt ]] && sed 's/^/twohost counters: /' "$dir/counters.txt"
echo "twohost: $name: $(tr '\n' ' ' <"$dir/rc" 2>/dev/null)in $((SECONDS - t0)) s (logs: $dir)"
exit "$rc"
