#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang into build-fuzz/ and
# runs each, as many at once as there are CPUs, for a bounded time from its
# committed seed corpus (read only: the committed corpus is never modified).
# Fails on any crash, sanitizer report, leak or timeout, printing the
# reproducer's path. Prints per target: executions, exec/s, wall time,
# coverage (cov: and ft: of libFuzzer's last line), corpus size and the result.
#
#   deploy/dev/fuzz.sh                       every target, 5 s each (the CI run)
#   deploy/dev/fuzz.sh --seconds 180         longer
#   deploy/dev/fuzz.sh --runs 10000000       stop after N executions (or the time)
#   deploy/dev/fuzz.sh --only read_path      one target (repeatable)
#   deploy/dev/fuzz.sh --max-len 1024        libFuzzer's -max_len (default: 4096
#                                        or the largest seed)
#   deploy/dev/fuzz.sh --corpus DIR          keep the inputs found in DIR/<target>
#                                        (reused by the next run; default: a
#                                        temporary directory, removed)
#   deploy/dev/fuzz.sh --build-only          build the targets, run none
#   KVNODE_FUZZ_BUILD=DIR                build dir (default build-fuzz)
#   KVNODE_FUZZ_JOBS=N                   make -j (default 2)
#   KVNODE_FUZZ_PARALLEL=N               targets run at once (default: CPUs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

seconds=5
runs=""
max_len=""
keep=""
build_only=0
only=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --only) only+=("$2"); shift 2 ;;
    --max-len) max_len=$2; shift 2 ;;
    --corpus) keep=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

build=${KVNODE_FUZZ_BUILD:-build-fuzz}
targets=(control rpc handoff handoff_header geometry object read_path ack_log dedupe_record)
((${#only[@]})) && targets=("${only[@]}")

for t in "${targets[@]}"; do
  [[ -d tests/fuzz/corpus/$t ]] || { echo "fuzz.sh: no target $t" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ missing (deploy/install-deps.sh)" >&2; exit 1; }

echo "== configure and build ($build, clang, -fsanitize=fuzzer,address,undefined)"
mkdir -p "$build"
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVNODE_FUZZ=ON \
  >"$build/configure.log" || { cat "$build/configure.log"; exit 1; }
make -C "$build" -j "${KVNODE_FUZZ_JOBS:-2}" --no-print-directory \
  "${targets[@]/#/fuzz_}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -40 "$build/fuzz-build.log"; exit 1; }
((build_only)) && { echo "fuzz.sh: built ${#targets[@]} targets"; exit 0; }

out="$build/fuzz-runs"
mkdir -p "$out"
# run_one TARGET: runs it and writes its table row to $out/TARGET/row.
run_one() {
  local t=$1 work rc=0 start wall execs rate last cov ft corp artifacts="" result f
  # The first directory receives the new inputs; the committed seeds are read
  # from the second.
  if [[ -n $keep ]]; then
    work=$keep/$t
    mkdir -p "$work"
  else
    work=$(mktemp -d "${TMPDIR:-/tmp}/kvnode-fuzz-$t.XXXXXX")
  fi
  mkdir -p "$out/$t"
  rm -f "$out/$t"/crash-* "$out/$t"/leak-* "$out/$t"/timeout-* "$out/$t"/oom-* "$out/$t/row"
  local args=(-max_total_time="$seconds" -timeout=10 -print_final_stats=1
              -artifact_prefix="$out/$t/")
  [[ -n $runs ]] && args+=(-runs="$runs")
  [[ -n $max_len ]] && args+=(-max_len="$max_len")
  start=$SECONDS
  "$build/tests/fuzz/fuzz_$t" "${args[@]}" "$work" tests/fuzz/corpus/"$t" >"$out/$t/log" 2>&1 ||
    rc=$?
  wall=$((SECONDS - start))
  [[ -z $keep ]] && rm -rf "$work"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out/$t/log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$out/$t/log" | tail -1)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.*corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$last")
  for f in "$out/$t"/{crash,leak,timeout,oom}-*; do
    if [[ -e $f ]]; then artifacts+="${artifacts:+ }${f##*/}"; fi
  done
  if ((rc != 0)) || [[ -n $artifacts ]]; then
    result="FAILED (exit $rc) $out/$t/log ${artifacts:+$out/$t/$artifacts}"
  else
    result=ok
  fi
  printf '%-16s %12s %8s %7s %6s %7s %7s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$wall" "${cov:-?}" \
    "${ft:-?}" "${corp:-?}" "$result" >"$out/$t/row"
}

# Each target is one process on one CPU: as many run at once as there are CPUs.
par=${KVNODE_FUZZ_PARALLEL:-$(nproc)}
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  if ((++running >= par)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
printf '%-16s %12s %8s %7s %6s %7s %7s  %s\n' target executions exec/s wall_s cov ft corpus result
failed=()
for t in "${targets[@]}"; do
  row=$(cat "$out/$t/row" 2>/dev/null) || row="$t: no result ($out/$t/log)"
  echo "$row"
  [[ $row == *" ok" ]] || failed+=("$t")
done

if ((${#failed[@]})); then
  for t in "${failed[@]}"; do
    echo "== $t: last lines of $out/$t/log"
    grep -v '^#[0-9]' "$out/$t/log" | tail -30
  done
  echo "fuzz.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "fuzz.sh: all ${#targets[@]} targets ran without a crash"
