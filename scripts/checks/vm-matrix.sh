#!/usr/bin/env bash
# The kernel and architecture matrix: the `basic` VM scenario (scripts/vm/scenarios/basic.sh)
# under qemu's software emulation on every kernel CI boots besides this machine's own (which
# the integration tests cover):
#   - Debian 12's 6.1 cloud kernel, amd64 and arm64;
#   - Linux 5.15.135 (the line Ubuntu 22.04 runs), amd64: the bzImage of
#     ../shared/kernels/linux-5.15.135/ beside the repository (checked against its SHA256SUMS;
#     SYSSCOPE_VM_SHARED names another directory). Without it the guest is skipped, saying so,
#     except under CI=true, where it fails: CI has ../shared beside its clone;
#   - Debian 12's 6.12 cloud kernel, amd64.
# amd64 uses the debug binaries `cargo test` built; arm64 a debug cross build (compiled on
# first use, then reused). The guests run on as many lanes at once as the machine has cores
# (SYSSCOPE_VM_LANES): an emulated amd64 guest keeps about one host core busy (see run.sh).
# SYSSCOPE_VM_GUESTS="amd64:5.15 amd64:6.12" (for example) limits the matrix. Prints each guest's results (every check with its figures), one result line per
# kernel with its boot and scenario times, and a table of every check on every kernel.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ci=false
{ [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; } && ci=true
if [ "$(id -u)" -ne 0 ]; then
  if $ci; then
    echo "vm-matrix: FAIL (needs root to install qemu and the kernel packages, and CI must run it)"
    exit 1
  fi
  echo "vm-matrix: SKIPPED (needs root)"
  exit 0
fi
shared=${SYSSCOPE_VM_SHARED:-$top/../shared}
k515="$shared/kernels/linux-5.15.135/bzImage"
guests=${SYSSCOPE_VM_GUESTS:-amd64:6.1 arm64:6.1 amd64:5.15 amd64:6.12}
out="$top/target/vm-cache/matrix"
rm -rf "$out" && mkdir -p "$out"

# Runs one guest; its report goes to $out/<arch>-<kernel>.log, its result line to .result.
run_guest() {
  local arch=$1 kernel=$2 started=$SECONDS spec=$2 tag="$1-$2" line
  if [ "$kernel" = 5.15 ]; then
    spec=$k515
    if [ ! -f "$k515" ]; then
      if $ci; then
        echo "FAIL (no kernel image at $k515: CI must have ../shared beside its clone)" > "$out/$tag.result"
      else
        echo "SKIPPED (no kernel image at $k515: this guest needs ../shared beside the clone)" > "$out/$tag.result"
      fi
      return
    fi
  fi
  "$top/scripts/vm/run.sh" --scenario basic --arch "$arch" --kernel "$spec" --mem 2048 \
    > "$out/$tag.log" 2>&1
  line=$(grep '^vm: \(PASS\|FAIL\)' "$out/$tag.log" | tail -n 1)
  [ -n "$line" ] || line="vm: FAIL (no result: see its log above)"
  echo "${line#vm: } ($((SECONDS - started))s with set-up and build)" > "$out/$tag.result"
}

# Tools, kernel packages and busybox first, one guest at a time (apt takes locks).
for g in $guests; do
  [ "${g#*:}" = 5.15 ] && continue
  "$top/scripts/vm/run.sh" --fetch-only --scenario basic --arch "${g%%:*}" --kernel "${g#*:}" \
    > "$out/fetch.log" 2>&1 || { cat "$out/fetch.log"; echo "vm-matrix: FAIL (fetching ${g#*:} ${g%%:*})"; exit 1; }
done

# The guests in order, on as many lanes as there are cores: each lane takes the next guest
# nobody has claimed (mkdir is atomic). The arm64 guest, the longest (it cross-builds the
# binaries), comes first.
lane() {
  local g
  for g in $(printf '%s\n' $guests | grep '^arm64:'; printf '%s\n' $guests | grep -v '^arm64:'); do
    mkdir "$out/claim-${g%%:*}-${g#*:}" 2>/dev/null || continue
    run_guest "${g%%:*}" "${g#*:}"
  done
}
lanes=${SYSSCOPE_VM_LANES:-$(nproc)}
pids=()
for _ in $(seq "$lanes"); do
  lane &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

rc=0
for g in $guests; do
  tag="${g%%:*}-${g#*:}"
  printf '\n--- %s %s\n' "${g#*:}" "${g%%:*}"
  [ -f "$out/$tag.log" ] && cat "$out/$tag.log"
  result=$(cat "$out/$tag.result" 2>/dev/null || echo "FAIL (no result)")
  case "$result" in PASS*|SKIPPED*) ;; *) rc=1 ;; esac
done
echo
# A guest's results table (run.sh prints it after `vm: results on`): "name PASS|FAIL ...".
results() {
  awk '/^vm: results on/ { f = 1; next } /^vm: / { f = 0 } f' "$out/$1.log" 2>/dev/null
}
# Every check on every kernel: PASS, FAIL, or - where the guest did not report it.
{
  printf '%-32s' check
  for g in $guests; do printf ' %-11s' "${g#*:} ${g%%:*}"; done
  printf '\n'
  names=$(for g in $guests; do results "${g%%:*}-${g#*:}"; done | awk '!seen[$1]++ { print $1 }')
  for name in $names; do
    printf '%-32s' "$name"
    for g in $guests; do
      tag="${g%%:*}-${g#*:}"
      r=$(results "$tag" | awk -v n="$name" '$1 == n { print $2; exit }')
      printf ' %-11s' "${r:--}"
    done
    printf '\n'
  done
} | sed 's/^/vm-matrix table: /'
for g in $guests; do
  tag="${g%%:*}-${g#*:}"
  echo "vm-matrix ${g#*:} ${g%%:*}: $(cat "$out/$tag.result" 2>/dev/null || echo "FAIL (no result)")"
done
exit $rc
