#!/usr/bin/env bash
# Source-based line and branch coverage of a fuzz target's decoder by a corpus:
# which lines the inputs reach, to tell a plateau of an exhausted decoder from
# a fuzzer that is stuck (docs/security.md, "Fuzzing"). Builds the harness and
# its decoder library with clang -O0 -fprofile-instr-generate
# -fcoverage-mapping (no sanitizers) into OUT, replays every input once and
# prints llvm-cov's report of the decoder's source files; --show prints every
# line and branch that no input reached.
#
#   tests/fuzz/coverage.sh TARGET [CORPUS_DIR...] [--out DIR] [--show]
#   e.g. tests/fuzz/coverage.sh read_path /work/fuzz-scratch/read_path --show
#
# With no CORPUS_DIR the committed seeds (tests/fuzz/corpus/TARGET) are used;
# they are always replayed as well. OUT defaults to build-fuzz-cov/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
M=$PWD

target=""
corpora=()
out=build-fuzz-cov
show=0
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --show) show=1; shift ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) if [[ -z $target ]]; then target=$1; else corpora+=("$1"); fi; shift ;;
  esac
done
[[ -n $target && -d tests/fuzz/corpus/$target ]] ||
  { echo "coverage.sh: name a target of tests/fuzz/corpus (see --help)" >&2; exit 2; }

case $target in
  control | rpc)
    lib=proto; srcs="base/src/errno.cc base/src/poll.cc proto/src/control.cc proto/src/rpc.cc proto/src/frame_io.cc"
    report="proto/src/$target.cc" ;;
  handoff | handoff_header)
    lib=upgrade
    srcs="base/src/errno.cc base/src/poll.cc upgrade/src/channel.cc upgrade/src/fault.cc upgrade/src/header.cc upgrade/src/messages.cc"
    srcs+=" upgrade/src/process.cc upgrade/src/sd_notify.cc"
    [[ $target == handoff ]] && report=upgrade/src/messages.cc || report=upgrade/src/header.cc ;;
  geometry | object | read_path)
    lib=storage; srcs="storage/src/format.cc storage/src/read_path.cc"
    report="storage/src/format.cc storage/src/read_path.cc" ;;
  ack_log)
    lib=load; srcs="base/src/errno.cc tools/src/ack_log.cc tools/src/histogram.cc"
    srcs+=" tools/src/report.cc tools/src/verify.cc tools/src/workload.cc"
    report=tools/src/ack_log.cc ;;
  dedupe_record)
    lib=server; srcs="server/src/dedupe.cc"; report=server/src/dedupe.cc ;;
  *) echo "coverage.sh: no decoder known for $target" >&2; exit 2 ;;
esac

cxx=(clang++ -std=c++20 -O0 -fprofile-instr-generate -fcoverage-mapping
     -DGLOG_CUSTOM_PREFIX_SUPPORT -I"$M/base/include" -I"$M/proto/include"
     -I"$M/tools/include" -I"$M/storage/include" -I"$M/upgrade/include" -I"$M/upgrade/src"
     -I"$M/server/include")
mkdir -p "$out/obj/$lib"
objs=()
for s in $srcs; do
  o=$out/obj/$lib/$(basename "$s" .cc).o
  [[ $o -nt $M/$s ]] || "${cxx[@]}" -fsanitize=fuzzer-no-link -c "$M/$s" -o "$o"
  objs+=("$o")
done
bin=$out/cov_$target
"${cxx[@]}" -fsanitize=fuzzer "tests/fuzz/${target}_fuzz.cc" "${objs[@]}" -o "$bin" \
  /usr/lib/x86_64-linux-gnu/libabsl_*.so -lglog -lgflags -lxxhash -lrt -latomic -lpthread

LLVM_PROFILE_FILE=$out/$target.profraw "$bin" -runs=0 "${corpora[@]}" tests/fuzz/corpus/"$target" \
  >"$out/$target.replay.log" 2>&1
llvm-profdata merge -o "$out/$target.profdata" "$out/$target.profraw"
# shellcheck disable=SC2086
llvm-cov report "$bin" -instr-profile="$out/$target.profdata" $report
if ((show)); then
  # shellcheck disable=SC2086
  llvm-cov show "$bin" -instr-profile="$out/$target.profdata" -show-branches=count $report |
    grep -B4 -E '\[True: 0|False: 0\]|^ +[0-9]+\| +0\|' || true
fi
