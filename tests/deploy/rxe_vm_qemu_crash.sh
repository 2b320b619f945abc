#!/usr/bin/env bash
# deploy/vm/rxe-vm when QEMU itself crashes (label unit, on the host; boots one
# real guest). RXE_VM_QEMU names a stand-in that dies by SIGSEGV before any
# guest exists, as qemu-system-x86_64 did now and then right after start.
#   once    rxe-vm says that QEMU crashed (the signal, not a guest's exit),
#           keeps QEMU's stderr in the results directory, boots the guest once
#           more (the real QEMU) and exits with the command's own exit code
#   always  one retry only, then 125 with the same message
# Skipped (77) without qemu-system-x86_64.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
fail() {
  echo "rxe_vm_qemu_crash: FAIL: $*" >&2
  exit 1
}
command -v qemu-system-x86_64 >/dev/null || { echo "no qemu-system-x86_64: skipped"; exit 77; }
dir=$(mktemp -d /tmp/kv-rxe-vm-crash.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/qemu" <<'SH'
#!/usr/bin/env bash
# Dies by SIGSEGV (without a core file) the first $CRASHES times, then runs QEMU.
n=$(cat "$CRASH_COUNT" 2>/dev/null || echo 0)
echo $((n + 1)) >"$CRASH_COUNT"
if ((n < CRASHES)); then
  echo "stand-in QEMU: crashing (start $((n + 1)))" >&2
  ulimit -c 0
  kill -SEGV $$
fi
exec qemu-system-x86_64 "$@"
SH
chmod +x "$dir/qemu"
cd "$dir"

# crashing N TAG: rxe-vm with the stand-in crashing N times; sets rc.
crashing() {
  rc=0
  RXE_VM_QEMU=$dir/qemu CRASHES=$1 CRASH_COUNT=$dir/count-$2 "$repo/deploy/vm/rxe-vm" --timeout 300 \
    --memory 512 --cpus 1 --results "$dir/results-$2" -- bash -c 'echo guest-ran; exit 7' \
    >"$dir/$2.out" 2>"$dir/$2.err" || rc=$?
}
show() { cat "$dir/$1.out" "$dir/$1.err" >&2; }
crashed="QEMU itself crashed (killed by SIGSEGV, exit status 139) before the command started"

crashing 1 once
[[ $rc -eq 7 ]] || { show once; fail "once: exit $rc, expected the command's 7"; }
grep -qx guest-ran "$dir/once.out" || { show once; fail "once: the command's output is missing"; }
grep -qF "$crashed" "$dir/once.err" || { show once; fail "once: no message '$crashed'"; }
grep -qF "booting the guest once more" "$dir/once.err" || { show once; fail "once: no word of the retry"; }
[[ $(<"$dir/count-once") -eq 2 ]] || fail "once: QEMU started $(<"$dir/count-once") times, expected 2"
kept=$(ls -d "$dir"/results-once/rxe-vm-failed-*first-boot 2>/dev/null | head -n 1)
[[ -n $kept ]] && grep -qF "stand-in QEMU: crashing (start 1)" "$kept/qemu.err" ||
  { show once; ls -R "$dir/results-once" >&2; fail "once: QEMU's stderr not kept in the results directory"; }
echo "ok: crashed once before the command: said so, kept $(basename "$kept")/qemu.err, booted again, exit 7"

crashing 5 always
[[ $rc -eq 125 ]] || { show always; fail "always: exit $rc, expected 125"; }
[[ $(<"$dir/count-always") -eq 2 ]] || fail "always: QEMU started $(<"$dir/count-always") times, expected 2"
[[ $(grep -cF "$crashed" "$dir/always.err") -eq 2 ]] || { show always; fail "always: not two crash messages"; }
! grep -q "guest stopped before the command" "$dir/always.err" ||
  { show always; fail "always: reported as a guest failure"; }
echo "ok: crashed at every start: one retry, then 125 naming the crash"
echo "rxe_vm_qemu_crash: PASS"
