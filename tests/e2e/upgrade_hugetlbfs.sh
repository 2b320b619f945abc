#!/usr/bin/env bash
# The arena in a file on hugetlbfs (--arena_path), as a deployment with huge
# pages runs it (registration at ~40 ms per GiB of CPU, against ~445 ms per
# GiB for /dev/shm's 4 KiB pages: docs/rdma.md). Runs
# upgrade_live.sh (KV_UPGRADES, default 1: verified YCSB A load across a live
# upgrade, the ack-log audit, the verbs objects) with the node's arena there,
# then checks that the arena was that file, that it is gone after the
# node's SIGTERM, and that every huge page it took is free again. Needs
# root (a mount, vm.nr_hugepages); skipped (77) without it.
source "$(dirname "$0")/lib.sh"
kv_require_device
if [[ $EUID -ne 0 ]]; then
  kv_log "skipped: needs root to mount hugetlbfs and reserve huge pages"
  exit 77
fi
huge=$(mktemp -d /tmp/kv-e2e-hugetlbfs.XXXXXX)
pages_before=$(cat /proc/sys/vm/nr_hugepages)
cleanup() {
  umount "$huge" 2>/dev/null && rmdir "$huge"
  echo "$pages_before" >/proc/sys/vm/nr_hugepages
}
trap cleanup EXIT
# The e2e arena is 32 MiB: 16 pages of 2 MiB, and room to spare.
echo $((pages_before + 24)) >/proc/sys/vm/nr_hugepages
(($(cat /proc/sys/vm/nr_hugepages) >= pages_before + 24)) || kv_fail "cannot reserve 24 huge pages"
mount -t hugetlbfs -o pagesize=2M none "$huge" || kv_fail "cannot mount hugetlbfs on $huge"
free_pages() { awk '$1 == "HugePages_Free:" {print $2}' /proc/meminfo; }
free_before=$(free_pages)

out=$(mktemp /tmp/kv-e2e-hugetlbfs-live.XXXXXX)
KV_UP_NODE_FLAGS="--arena_path $huge/arena" KV_UPGRADES=${KV_UPGRADES:-1} \
  "$(dirname "$0")/upgrade_live.sh" 2>&1 | tee "$out"
((PIPESTATUS[0] == 0)) || kv_fail "upgrade_live.sh failed with the arena on hugetlbfs"
grep -q "arena $huge/arena " "$out" || kv_fail "the node's arena was not $huge/arena"
kv_ok "a live upgrade under verified load with the arena on hugetlbfs"
[[ ! -e $huge/arena ]] || kv_fail "arena file $huge/arena left behind after SIGTERM"
(($(free_pages) == free_before)) || kv_fail "huge pages free: $(free_pages), before the node: $free_before"
kv_ok "arena file removed after SIGTERM, all $free_before free huge pages free again"
rm -f "$out"
echo "upgrade_hugetlbfs: PASS"
