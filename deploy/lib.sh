# Shared helpers for the deploy/ scripts. Source it; it defines functions only.

# Prints the name of the first verbs device with an ACTIVE port 1 (or
# $KVNODE_TEST_DEVICE's name when set); returns 1 when there is none.
kv_active_device() {
  local want=${KVNODE_TEST_DEVICE:-} dev
  want=${want%%:*}
  for dev in /sys/class/infiniband/*; do
    [[ -e $dev/ports/1/state ]] || continue
    [[ -z $want || $want == "${dev##*/}" ]] || continue
    if grep -q ACTIVE "$dev/ports/1/state"; then
      echo "${dev##*/}"
      return 0
    fi
  done
  return 1
}

# Prints the GID index to use on DEVICE port 1: the IPv4-mapped RoCE v2 GID
# (::ffff:a.b.c.d) where there is one (rxe needs it), else 0.
kv_gid_index() {
  local dev=$1 g idx
  for g in /sys/class/infiniband/"$dev"/ports/1/gids/*; do
    idx=${g##*/}
    if grep -q '^0000:0000:0000:0000:0000:ffff:' "$g" 2>/dev/null &&
      grep -q 'RoCE v2' "/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$idx" 2>/dev/null; then
      echo "$idx"
      return 0
    fi
  done
  echo 0
}

# Prints DEVICE port 1's counters (`rdma statistic`: rxe's sent_pkts,
# rcvd_pkts, duplicate_request, ...) as "name value" lines.
kv_port_counters() { # DEVICE
  rdma statistic show link "$1/1" 2>/dev/null | tr ' ' '\n' | awk 'NF' |
    awk 'prev != "" && $0 ~ /^[0-9]+$/ {print prev, $0} {prev = $0}'
}

# True while a TCP port is listening (IPv4 or IPv6). Reads /proc, no fork:
# under TCG an `ss | grep` costs 0.1 s of CPU or more. Each file is read whole
# (mapfile): a `read` loop left early keeps the rest in bash's input buffer.
kv_port_listening() { # PORT
  local hex loc st f l lines
  printf -v hex '%04X' "$1"
  for f in /proc/net/tcp /proc/net/tcp6; do
    [[ -r $f ]] || continue
    mapfile -t lines <"$f"
    for l in "${lines[@]}"; do
      read -r _ loc _ st _ <<<"$l"
      [[ $st == 0A && $loc == *":$hex" ]] && return 0
    done
  done
  return 1
}

# Waits until a TCP port is listening, up to SECONDS.
kv_wait_listen() { kv_await "$2" kv_port_listening "$1"; } # PORT SECONDS

# True once process PID has exited (gone, or a zombie its parent has not
# reaped yet). Shell builtins only: benchmarks poll it while they measure.
kv_gone() {
  local key state
  [[ -e /proc/$1 ]] || return 0
  while read -r key state _; do
    [[ $key == State: ]] && { [[ $state == Z ]]; return; }
  done 2>/dev/null <"/proc/$1/status" || return 0 # vanished while read
  return 0
}

# Sleeps S seconds without an exec: read -t on a FIFO nobody writes, opened
# read-write on first use (so the open does not block) and unlinked at once
# (nothing left to clean up; children inherit the fd, and nobody writes it). In the TCG guest a `sleep 0.001` costs ~50 ms
# of CPU (fork, exec, dynamic linking); a benchmark polling every 50 ms with
# `sleep` spent about half a vCPU beside the load it measured.
kv_nap() { # S
  if [[ -z ${KV_NAP_FD:-} ]]; then
    local f
    f=$(mktemp -u "${TMPDIR:-/tmp}/kv-nap.$$.XXXXXX")
    mkfifo -m 600 "$f"
    exec {KV_NAP_FD}<>"$f"
    rm -f "$f"
  fi
  read -r -t "$1" -u "$KV_NAP_FD" || true
}

# Polls CMD every KV_AWAIT_INTERVAL seconds (default 0.05) until it
# succeeds; returns 1 after SECONDS. A benchmark polling a command that
# execs a program slows what it measures (an exec is ~0.1 s of CPU in the
# TCG guest): it polls such commands with a longer interval.
kv_await() { # SECONDS CMD...
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    kv_nap "${KV_AWAIT_INTERVAL:-0.05}" # polling a condition under a deadline, not synchronising by time
  done
}

# kvload threads for a load that should keep the machine busy: one per CPU, at
# most 4. More threads than CPUs only switch between each other: in the
# 2-vCPU TCG guest a soak's kvload with 4 threads did 2.5k ops/s, with 2
# threads 3.5k, and each upgrade took a third less time beside it.
kv_load_threads() {
  local n
  n=$(nproc)
  echo $((n < 4 ? n : 4))
}
