#!/usr/bin/env bash
# Live upgrade vs naive restart, under the same kvload load, for each key count
# (BENCH_KEYS, default "100000 1000000"), in one run on a verbs device (in
# deploy/vm/rxe-vm when the host has none). Not a test: it prints a table.
#
# Per key count, on one node:
#   preload   kvfill writes every key once straight into the node's RocksDB
#             directory before the node starts (kvload's keys and values, as
#             `kvload --preload` would leave them; seconds for 1e6 keys, where
#             kvload's PUTs take ~20 min under TCG); the node then starts cold
#             and builds its arena from RocksDB. Both are set-up, reported on
#             the "==" line, not figures
#   steady    kvload for BENCH_RUN_S s without disturbance
#   live      kvload with BENCH_EVENTS (default 1) live upgrades (SIGUSR2): the
#             first BENCH_AT_S s in, each next one BENCH_AT_S s after the
#             previous finished (old process gone); the run ends BENCH_AT_S s
#             after the last (kvload stopped by SIGINT, which drains and
#             reports) or after BENCH_RUN_S s if that is later
#   naive     the same schedule of naive restarts: SIGTERM, start the binary
#             again (the arena is rebuilt from RocksDB), clients reconnect
#   steady_c, live_c  steady and live again with GETs only (YCSB C)
# BENCH_RUNS (default "steady live steady_c live_c naive") picks the runs, in
# that order, e.g. "steady_c live_c" for the GET-only pair alone.
# BENCH_ARENA=hugetlbfs (default shm: /dev/shm) puts the arena on a hugetlbfs
# mount the guest makes, with the 2 MiB pages it needs reserved (root only):
# the node's --arena_path, as a deployment with huge pages would run it.
# BENCH_CPUS=NODE:LOAD (e.g. 0:1) pins the node (and so every generation it
# spawns) and kvload to those CPU lists (taskset), as when clients run on
# other machines than the node; default: both share every CPU.
# BENCH_TWO_HOST=1 runs kvload on another machine: the node on the "server"
# guest of `deploy/vm/rxe-vm --two-host` (10.77.0.1, 1 vCPU), kvload on the
# "client" guest (10.77.0.2, 1 vCPU), one virtual link between them; the
# harness stays with the node and starts and stops kvload through files in
# build/bench-twohost/ (kvload's logs and reports stay there).
# A key count may carry its own number of events: BENCH_KEYS="10000:3 100000"
# (three upgrades and three restarts at 1e4 keys, BENCH_EVENTS at 1e5): the
# timeline plot (docs/BENCHMARKS.md) shows three events of one run side by side.
# Reported per run: blackout (longest gap between completed operations, from
# kvload), p99 and max latency of the run (steady vs the run holding the
# events), failed ops, and per event signal -> old process exit (live) /
# signal -> new process answering (naive), joined by '/'; then
# blackout_read / blackout_write (longest gap between completed GETs, resp.
# writes), the GETs completed inside the longest write gap, and stall (the
# longest time the machine stood still under kvload: kvload's stall_ms).
#
#   deploy/bench/bench-upgrade.sh                        build in build/, run (VM if needed)
#   KVNODE_BUILD_DIR=DIR BENCH_KEYS=100000 deploy/bench/bench-upgrade.sh --no-build
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source deploy/lib.sh
build=${KVNODE_BUILD_DIR:-$PWD/build}
mode=${1:-}

if [[ $mode == --inner ]]; then
  keys_list=${BENCH_KEYS:-"100000 1000000"}
  run_s=${BENCH_RUN_S:-40}
  at_s=${BENCH_AT_S:-5}
  events_default=${BENCH_EVENTS:-1}
  runs=" ${BENCH_RUNS:-steady live steady_c live_c naive} "
  arena_kind=${BENCH_ARENA:-shm}
  node_pin=() load_pin=()
  if [[ -n ${BENCH_CPUS:-} ]]; then
    node_pin=(taskset -c "${BENCH_CPUS%%:*}")
    load_pin=(taskset -c "${BENCH_CPUS#*:}")
  fi
  two_host=${BENCH_TWO_HOST:-}
  share=${BENCH_SHARE:-}
  node_host=127.0.0.1
  qp_flags=()
  if [[ -n $two_host ]]; then
    node_host=${RXE_VM_ADDR:?BENCH_TWO_HOST runs under deploy/vm/rxe-vm --two-host}
    node_pin=() load_pin=() # one vCPU per guest
    # RC timers for a link between two TCG guests (tests/e2e/twohost_lib.sh
    # explains them): both ends, or a late ACK fails a QP.
    qp_flags=(--qp_timeout 16 --qp_retry_cnt 3)
  fi
  case $arena_kind in
    shm | hugetlbfs) ;;
    *) echo "bench-upgrade: BENCH_ARENA=$arena_kind: want shm or hugetlbfs" >&2 && exit 2 ;;
  esac
  # The node and kvload run from copies in /tmp (the guest's tmpfs), as
  # installed binaries run from a local disk: in deploy/vm/rxe-vm the build
  # directory is a 9p share without a page cache, where each page of code a
  # process touches first is a round trip to the host: kvnode's on the way
  # to the writer switch, kvload's when its clients first move (a scheduler
  # trace showed kvload's threads in 9p reads there).
  bindir=$(mktemp -d /tmp/bench-upgrade-bin.XXXXXX)
  cp "$build/node/kvnode" "$build/tools/kvload" "$bindir/"
  node=$bindir/kvnode
  kvload=$bindir/kvload
  # The client guest of BENCH_TWO_HOST runs each kvload the server's harness
  # asks for: load.N in the share holds the log's path and the command (one
  # word per line); stop.N asks for the drain (SIGTERM, kvload reports);
  # done.N holds kvload's exit code. The polls are 9p stats, 0.2 s apart
  # while kvload runs.
  if [[ -n $two_host && $RXE_VM_ROLE == client ]]; then
    n=1
    for (( ; ; n++)); do
      until [[ -e $share/load.$n ]]; do
        [[ -e $share/finished ]] && exit 0
        [[ -s $RXE_VM_PEER_RC ]] && { echo "bench-upgrade: the server guest exited first"; exit 1; }
        kv_nap 0.05 # polling a condition: the server's next run
      done
      mapfile -t words <"$share/load.$n"
      words[1]=$kvload # this guest's copy
      "${words[@]:1}" >"${words[0]}" 2>&1 &
      pid=$!
      until [[ -e $share/stop.$n ]] || kv_gone "$pid"; do kv_nap 0.2; done
      kill -TERM "$pid" 2>/dev/null || true
      rc=0
      wait "$pid" || rc=$?
      echo "$rc" >"$share/.done.$n" && mv "$share/.done.$n" "$share/done.$n"
    done
  fi
  kvfill=$build/tools/kvfill
  results=$(mktemp /tmp/bench-upgrade.XXXXXX.txt)
  nclients=4 # kvload's clients (control connections, QPs)
  node_pid=""
  child_pid=""
  last_ms=0
  huge_dir=""
  cleanup() {
    [[ -n $node_pid ]] && kill -KILL "$node_pid" 2>/dev/null
    [[ -z $two_host ]] || : >"$share/finished" # the client guest's agent ends
    rm -rf "$bindir"
    [[ -z $huge_dir ]] || { umount "$huge_dir" && rmdir "$huge_dir"; } || true
    return 0
  }
  trap cleanup EXIT
  die() {
    echo "bench-upgrade: $*; last lines of kvnode's log:"
    tail -20 "$dir/kvnode.log"
    exit 1
  }
  # The node's log (every generation appends to it), followed with builtins:
  # the harness learns what the node did (listening, sessions ready, Owned,
  # an upgrade complete with its phases) without an exec while the load
  # runs. A kvctl exec is ~0.15 s of CPU in the TCG guest: polled every
  # 0.2 s it cut a GET-only kvload's rate by a quarter and raised its p99
  # 2.5x, and the live runs, which polled, were compared with steady runs,
  # which did not. log_open: a descriptor at the log's end.
  log_open() {
    [[ -z ${logfd:-} ]] || exec {logfd}<&-
    exec {logfd}<"$dir/kvnode.log"
    log_part=""
    log_skip
  }
  # log_skip: past every line written so far.
  log_skip() { while log_line; do :; done; }
  # log_line: the next complete line into `line`; false at the end (a
  # partial last line is kept for the next call).
  log_line() {
    if IFS= read -r -u "$logfd" line; then
      line=$log_part$line
      log_part=""
      return 0
    fi
    log_part+=$line
    return 1
  }
  # log_await SECONDS REGEX [INTERVAL]: reads on (polling every INTERVAL s,
  # default 0.05) until a line matches REGEX (BASH_REMATCH holds its
  # groups); false at the deadline.
  log_await() {
    local deadline=$((SECONDS + $1)) re=$2
    for (( ; ; )); do
      while log_line; do
        [[ $line =~ $re ]] && return 0
      done
      ((SECONDS < deadline)) || return 1
      kv_nap "${3:-0.05}" # polling a condition under a deadline
    done
  }
  # huge_pages_for BYTES: a hugetlbfs mount (huge_dir) with enough 2 MiB
  # pages reserved for an arena of BYTES; arena_flag names the arena's file.
  arena_flag=()
  huge_pages_for() {
    local want=$((($1 >> 21) + 2))
    if [[ -z $huge_dir ]]; then
      huge_dir=$(mktemp -d /tmp/bench-upgrade-huge.XXXXXX)
      mount -t hugetlbfs -o pagesize=2M none "$huge_dir" || die "cannot mount hugetlbfs (root?)"
    fi
    echo "$want" >/proc/sys/vm/nr_hugepages
    (($(cat /proc/sys/vm/nr_hugepages) >= want)) ||
      die "only $(cat /proc/sys/vm/nr_hugepages) of $want huge pages could be reserved"
    arena_flag=(--arena_path "$huge_dir/arena")
  }
  # --handshake_timeout_ms 60000: the node's default cut (5 s from accept to
  # Ready) counts a fresh kvload's own QP set-up and, after a restart, the new
  # node's first verbs calls; under TCG on a loaded host these take longer,
  # and the node answered ClientQp with Goodbye ("handshake not finished
  # within 5s (state connecting); cut"), which ended kvload's run (seen at
  # 1e5 keys). The benchmark measures the upgrade, not that guard. (The
  # other cause of that Goodbye: see events_run.)
  start_node() {
    "${node_pin[@]}" "$node" --listen "$node_host:$port" "${qp_flags[@]}" --db_path "$dir/db" --shm_name "$shm" "${arena_flag[@]}" \
      --admin_socket "$admin" --auth_token_file "$token" --arena_size "$arena" \
      --sync_writes=false --max_clients 16 --handshake_timeout_ms 60000 \
      >>"$dir/kvnode.log" 2>&1 &
    node_pid=$!
    child_pid=$node_pid
    until log_await 1 "kvnode generation ([0-9]+) .* listening on"; do
      kill -0 "$node_pid" 2>/dev/null || { tail "$dir/kvnode.log"; exit 1; }
    done
    gen=${BASH_REMATCH[1]}
  }
  # kvload_cmd NAME [extra kvload flags]: sets cmd (the kvload command line).
  # --timeout_ms 300000: a naive restart at 1e6 keys took 114 s under TCG at
  # load ~10 (the arena is built from RocksDB); operations wait for the node
  # instead of failing on the benchmark's own deadline (failed ops still show).
  workload=A # kvload --workload of the runs (A: 50 % writes; C: GETs only)
  kvload_cmd() {
    local name=$1
    shift
    cmd=("${load_pin[@]}" "$kvload" --server "$node_host:$port" --auth_token_file "$token" --workload "$workload"
      --keys "$keys" --value_size 64 --clients "$nclients" --threads 2 --depth 4 --seed 7
      --connect_timeout_ms 5000 --timeout_ms 300000 --progress=false "${qp_flags[@]}"
      --report "$rdir/$name.json" "$@")
  }
  # load_start NAME: runs cmd (kvload_cmd's), its output in rdir/NAME.log,
  # here or on the client guest; load_running: it has not exited;
  # load_end [stop]: waits for its exit (after a SIGTERM with stop).
  load_seq=0 lp=""
  load_start() {
    if [[ -n $two_host ]]; then
      load_seq=$((load_seq + 1))
      printf '%s\n' "$rdir/$1.log" "${cmd[@]}" >"$share/.load.$load_seq"
      mv "$share/.load.$load_seq" "$share/load.$load_seq"
    else
      "${cmd[@]}" >"$rdir/$1.log" 2>&1 &
      lp=$!
    fi
  }
  load_running() {
    if [[ -n $two_host ]]; then [[ ! -e $share/done.$load_seq ]]; else ! kv_gone "$lp"; fi
  }
  load_end() {
    if [[ -n $two_host ]]; then
      [[ ${1:-} != stop ]] || : >"$share/stop.$load_seq"
      kv_await 900 test -e "$share/done.$load_seq" || die "kvload on the client guest did not end"
    else
      [[ ${1:-} != stop ]] || kill -TERM "$lp" 2>/dev/null || true
      wait "$lp" || true
    fi
  }
  load() { # load NAME [extra kvload flags]
    kvload_cmd "$@"
    load_start "$1"
    KV_AWAIT_INTERVAL=0.2 load_end
  }
  row() { # row KEYS NAME EVENT_MS[/EVENT_MS...]
    [[ -s $rdir/$2.json ]] || { echo "$1 $2: no kvload report ($(tail -n 2 "$rdir/$2.log" | tr '\n' ' '))"; return 0; }
    python3 - "$rdir/$2.json" "$1" "$2" "$3" <<'PY' | tee -a "$results"
import json, sys
r = json.load(open(sys.argv[1]))
l = r["latency_us"]
print(f"{sys.argv[2]:>8} {sys.argv[3]:<7} blackout {r['blackout_ms']:8.1f} ms  p99 {l['p99']/1000:8.2f} ms"
      f"  max {l['max']/1000:8.1f} ms  failed {r['failed_ops']}  ops {r['ops']}  event {sys.argv[4]} ms"
      f"  blackout_read {r.get('blackout_read_ms', -1):.1f} ms  blackout_write {r.get('blackout_write_ms', -1):.1f} ms"
      f"  gets_in_write_gap {r.get('reads_in_write_blackout', -1)}"
      f"  stall {r.get('stall_ms', -1):.1f} ms")
PY
  }
  # The exit status of an old process, when it is this shell's child (the
  # first one; later ones were started by their predecessor).
  reap() {
    local rc=0
    [[ $1 == "$child_pid" ]] || return 0
    wait "$1" || rc=$?
    ((rc == 0)) || echo "old process $1 exited $rc"
  }
  # exit_watch: a coprocess that, for each pid written to it, answers
  # "armed" once it holds a pidfd of that process and "gone" once the
  # process has exited (the pidfd turns readable), whether or not it is this
  # shell's child. Started before a run's load, so that its start-up is not
  # in the run: a bash loop polling every 50 ms took 0.36 s of the guest's
  # CPU in a 3.3 s upgrade (perf, 1e6 keys, GET only) beside the upgrade's
  # own 1.4 s, so that live runs paid for the harness and steady runs did
  # not. Perl (perl-base) starts in 0.2 s in the TCG guest; 434 is
  # pidfd_open's number on every architecture.
  exit_watch() {
    coproc EXIT_WATCH {
      exec perl -e '$| = 1;
        while (my $pid = <STDIN>) {
          my $fd = syscall(434, $pid + 0, 0);
          print "armed\n";
          if ($fd >= 0 && open(my $fh, "<&=", $fd)) {
            vec(my $r = "", fileno($fh), 1) = 1;
            select($r, undef, undef, undef);
            close($fh);
          }
          print "gone\n";
        }'
    }
  }
  # One live upgrade; sets last_ms = signal -> old process exit, and keeps
  # the phases of N's "complete" line for phases_rows. The previous upgrade
  # ended with that line, so the node takes this signal.
  #
  # The old process's exit is awaited without polling, by exit_watch.
  live_event() {
    local old=$node_pid t0 word
    echo "$old" >&"${EXIT_WATCH[1]}"
    read -r -u "${EXIT_WATCH[0]}" word && [[ $word == armed ]] || die "no exit watch on $old"
    t0=${EPOCHREALTIME/./}
    kill -USR2 "$old"
    read -r -t 120 -u "${EXIT_WATCH[0]}" word && [[ $word == gone ]] ||
      die "old process $old still alive 120 s after the signal"
    last_ms=$(((${EPOCHREALTIME/./} - t0) / 1000))
    reap "$old"
    log_await 10 "Owned by pid ([0-9]+) generation $((gen + 1)) " ||
      die "old process $old exited, but no process owns generation $((gen + 1))"
    node_pid=${BASH_REMATCH[1]}
    # O's phases reach N with Gone, which N reads after its RocksDB open.
    log_await 120 "upgrade: generation $((gen + 1)) complete; phases \(ms\): (.*)" 0.25 ||
      die "generation $((gen + 1)) did not complete within 120 s of the old process's exit"
    gen=$((gen + 1))
    printf 'event_ms=%s\nphases=%s\n' "$last_ms" "${BASH_REMATCH[1]}" >>"$dir/$name.phases"
  }
  # phases_rows NAME: one line per event of the run, after the run.
  phases_rows() {
    [[ -s $dir/$1.phases ]] || return 0
    python3 - "$1" "$dir/$1.phases" <<'PY' | tee -a "$results"
import re, sys
name, events, p = sys.argv[1], [], None
for line in open(sys.argv[2]):
    if line.startswith("event_ms="):
        p = {}
        events.append((line.split("=")[1].strip(), p))
    elif line.startswith("phases="):
        for kv in line[len("phases="):].split():
            k, _, v = kv.partition("=")
            p[k] = float(v)
for event_ms, p in events:
    ms = lambda k: "%.0f" % p[k] if k in p else "-"
    print("    phases %s: writer_switch %s ms  signal->N_writes %s ms  signal->O_exit %s ms  %s" % (
        name, ms("writer_switch"), ms("signal_to_n_writes"), event_ms,
        " ".join("%s=%.0f" % (k, v) for k, v in sorted(p.items()))))
PY
  }
  # One naive restart; sets last_ms = SIGTERM -> new process answering.
  naive_event() {
    local old=$node_pid t0
    t0=${EPOCHREALTIME/./}
    kill -TERM "$old"
    kv_await 300 kv_gone "$old" || die "node $old still alive 300 s after SIGTERM"
    reap "$old"
    start_node
    last_ms=$(((${EPOCHREALTIME/./} - t0) / 1000))
  }
  # events_run NAME live|naive: kvload under the event schedule; sets ev_ms.
  events_run() {
    local name=$1 kind=$2 i t_start
    local -a cmd
    local ready=0 end
    log_skip
    [[ $kind == live ]] && exit_watch
    kvload_cmd "$name" --duration 100000
    load_start "$name"
    # The schedule starts when all of kvload's sessions are Ready, not when
    # it was started: under TCG a fresh kvload's start and handshake can take
    # longer than BENCH_AT_S, and a first event inside kvload's initial
    # connect ended its run (a SIGTERM'd node says Goodbye to a client in
    # state connecting, and kvload gives up on its first connect: "answered
    # ClientQp with Goodbye").
    end=$((SECONDS + 300))
    while ((ready < nclients && SECONDS < end)); do
      if log_await 1 "session ready: client "; then
        ready=$((ready + 1))
      else
        load_running || break # kvload gave up: its log says why
      fi
    done
    t_start=$SECONDS
    ev_ms=""
    kv_nap "$at_s" # the benchmark's schedule: steady load before the first event
    for ((i = 1; i <= events; i++)); do
      "${kind}_event"
      ev_ms+=${ev_ms:+/}$last_ms
      kv_nap "$at_s" # the schedule: steady load after each event
    done
    while ((SECONDS < t_start + run_s)); do kv_nap 0.2; done # at least run_s of load
    load_end stop # kvload drains what is in flight and reports
    if [[ $kind == live ]]; then
      local to_watch=${EXIT_WATCH[1]}
      exec {to_watch}>&- # perl ends at the end of its input
      wait "$EXIT_WATCH_PID" || true
    fi
    phases_rows "$name"
  }
  for spec in $keys_list; do
    keys=${spec%%:*}
    events=$events_default
    [[ $spec == *:* ]] && events=${spec#*:}
    dir=$(mktemp -d /tmp/bench-upgrade.XXXXXX)
    rdir=$dir # kvload's logs and reports
    [[ -z $two_host ]] || { rdir=$share/$keys && mkdir -p "$rdir"; }
    echo "$events" >"$dir/events.txt" # for deploy/bench/bench-all.sh's plot titles
    token="$rdir/token"
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token")
    admin="$dir/admin/admin.sock"
    port=$((7100 + RANDOM % 500))
    shm="kvnode-bench-$$-$keys"
    # ~200 bytes per key (object, slot, allocator) plus headroom.
    arena=$(((keys * 256 + (64 << 20)) / 4096 * 4096))
    [[ $arena_kind == hugetlbfs ]] && huge_pages_for "$arena"
    t=$(date +%s%N)
    # kvload_cmd's --keys, --key_size (16, kvload's default) and --value_size.
    "$kvfill" --db_path "$dir/db" --keys "$keys" --key_size 16 --value_size 64 \
      >"$dir/kvfill.log" 2>&1 || { cat "$dir/kvfill.log"; exit 1; }
    fill_ms=$((($(date +%s%N) - t) / 1000000))
    : >"$dir/kvnode.log"
    log_open
    t=$(date +%s%N)
    start_node
    start_ms=$((($(date +%s%N) - t) / 1000000))
    echo "== $keys keys ($events events per run): kvfill $fill_ms ms, cold start $start_ms ms" \
      "(arena $arena bytes on $arena_kind; $(grep -o 'store [^ ]*: [a-z-]* in .*' "$dir/kvnode.log" | tail -1 | cut -d' ' -f3-))"
    # GET only (YCSB C) beside A: what a reader sees across the same upgrades.
    for run in steady live steady_c live_c naive; do
      [[ $runs == *" $run "* ]] || continue
      workload=A
      [[ $run == *_c ]] && workload=C
      case $run in
        steady*)
          load "$run" --duration "$run_s"
          ev_ms=0
          ;;
        live*) events_run "$run" live ;;
        naive) events_run naive naive ;;
      esac
      row "$keys" "$run" "$ev_ms"
    done
    grep -E "store .*: (rebuilt|reattached|created)" "$dir/kvnode.log" | tail -1 || true
    kill -TERM "$node_pid"
    kv_await 300 kv_gone "$node_pid" || die "node $node_pid still alive 300 s after SIGTERM"
    wait "$node_pid" 2>/dev/null || true
    node_pid=""
    # RocksDB's own log tells where an open or a flush spent its time.
    cp "$dir/db/LOG" "$dir/rocksdb.log" 2>/dev/null || true
    # The server guest's /tmp ends with it: its node log goes beside kvload's.
    [[ -z $two_host ]] || cp "$dir/kvnode.log" "$dir/rocksdb.log" "$rdir/" 2>/dev/null || true
    rm -rf "$dir/db" # the guest's /tmp is memory (1e6 keys: ~100 MB); the logs stay
  done
  echo "== summary (event = live: signal -> old process exit; naive: SIGTERM -> new process answering)"
  cat "$results"
  exit 0
fi

if [[ $mode != --no-build ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j 2 --target kvnode kvload kvfill
fi
if [[ -z ${BENCH_TWO_HOST:-} ]] && kv_active_device >/dev/null; then
  KVNODE_BUILD_DIR=$build exec deploy/bench/bench-upgrade.sh --inner
fi
settings=(KVNODE_BUILD_DIR="$build" BENCH_KEYS="${BENCH_KEYS:-}" BENCH_EVENTS="${BENCH_EVENTS:-1}"
  BENCH_RUNS="${BENCH_RUNS:-}" BENCH_ARENA="${BENCH_ARENA:-}" BENCH_CPUS="${BENCH_CPUS:-}"
  BENCH_RUN_S="${BENCH_RUN_S:-40}" BENCH_AT_S="${BENCH_AT_S:-5}")
if [[ -z ${BENCH_TWO_HOST:-} ]]; then
  exec deploy/vm/rxe-vm --rw "$build" -- env "${settings[@]}" "$PWD/deploy/bench/bench-upgrade.sh" --inner
fi
share=$build/bench-twohost
rm -rf "$share"
mkdir -p "$share"
# 2 GiB per guest: the server's /tmp (tmpfs) holds the arena and RocksDB
# (1e6 keys: ~330 MB and ~100 MB).
exec deploy/vm/rxe-vm --two-host --memory 2048 --rw "$build" --results "$share" -- \
  env "${settings[@]}" BENCH_TWO_HOST=1 BENCH_SHARE="$share" "$PWD/deploy/bench/bench-upgrade.sh" --inner
