#!/usr/bin/env bash
# libkvclient's location cache (docs/format.md, "Reading through a cached
# location"): one client reads heap values through its cache while another
# overwrites, deletes, re-creates and resizes them; every GET must return
# exactly the last value written (kvnode_cache_client). Then kvload --verify
# with 4 clients, YCSB A on 1 KiB values (heap, so cached): zero verification
# errors, zero stale reads.
source "$(dirname "$0")/lib.sh"
kv_require_device
kv_start_node
"$KV_BUILD/tests/e2e/kvnode_cache_client" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" ||
  kv_fail "kvnode_cache_client: a stale location returned a wrong value (see above)"
kv_ok "no wrong value through a stale cached location"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 4 \
  --threads 1 --depth 4 --keys 200 --value_size 1024 --preload --duration "${KV_CACHE_DURATION:-8}" \
  --verify --progress=false --report "$KV_DIR/report.json" || kv_fail "kvload --verify failed"
kv_ok "kvload --verify on cached heap values: no verification error"
kv_stop_node
