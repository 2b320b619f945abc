#!/usr/bin/env bash
# A node that is still starting refuses connections instead of leaving them
# in the kernel's backlog: a client that connects while the node opens its
# store or registers its arena is refused at once and backs off, rather than
# waiting for a Welcome that comes seconds later and abandoning the
# connection (a storm of dead connections the node then handshakes with).
# The node is stopped (SIGSTOP) after it logged its store open and before it
# logged that it listens; then a TCP connect must be refused, and succeed
# once it is resumed. A stop that lands after the listen line proves
# nothing and is tried again.
source "$(dirname "$0")/lib.sh"
kv_require_device

kv_start_node --arena_size $((256 << 20))
port=${KV_ADDR##*:}
kv_stop_node keep

connects() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
store_opened() { grep -q "^I.*store .* in .* keys (" "$KV_LOG"; }
listening() { grep -q "listening on" "$KV_LOG"; }

for attempt in 1 2 3 4 5; do
  KV_LOG="$KV_DIR/kvnode-$attempt.log"
  "$KV_NODE_BIN" --listen "127.0.0.1:$port" --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
    --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
    --arena_size $((256 << 20)) --sync_writes=false --max_clients 16 >"$KV_LOG" 2>&1 &
  KV_PID=$!
  kv_wait_for 60 store_opened || kv_fail "attempt $attempt: the node never opened its store"
  kill -STOP "$KV_PID"
  if listening; then
    kv_log "attempt $attempt: stopped after it listened; again"
    kill -CONT "$KV_PID"
    kv_wait_for 60 kv_admin ping || kv_fail "attempt $attempt: no ping"
    kv_stop_node keep
    continue
  fi
  if connects; then
    kill -CONT "$KV_PID"
    kv_fail "a node still starting (store open, not serving) accepted a TCP connection on $port"
  fi
  kv_ok "attempt $attempt: a node still starting refused the connection"
  kill -CONT "$KV_PID"
  kv_wait_for 60 kv_admin ping || kv_fail "no ping after SIGCONT"
  connects || kv_fail "the node serves but refused a connection on $port"
  kv_ok "once it serves, the same port accepts"
  kv_stop_node
  echo "server_start_listen: PASS"
  exit 0
done
kv_fail "5 attempts all stopped the node after it listened: the window was never caught"
