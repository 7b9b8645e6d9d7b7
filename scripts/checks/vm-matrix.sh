#!/usr/bin/env bash
# The kernel and architecture matrix: the `basic` VM scenario (scripts/vm/scenarios/basic.sh)
# on Debian's 6.1 cloud kernels for amd64 and arm64, under qemu's software emulation. This
# machine's own kernel is covered by the integration tests. amd64 uses the debug binaries
# `cargo test` built; arm64 a debug cross build (compiled on first use, then reused).
# SYSSCOPE_VM_ARCHES="amd64" (for example) limits the matrix. One result line per architecture.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then
    echo "vm-matrix: FAIL (needs root to install qemu and the kernel packages, and CI must run it)"
    exit 1
  fi
  echo "vm-matrix: SKIPPED (needs root)"
  exit 0
fi
rc=0
for arch in ${SYSSCOPE_VM_ARCHES:-amd64 arm64}; do
  started=$(date +%s)
  if out=$("$top/scripts/vm/run.sh" --scenario basic --arch "$arch" 2>&1); then
    last=${out##*$'\n'}
    echo "vm-matrix $arch: ${last#vm: } ($(($(date +%s) - started))s with set-up and build)"
  else
    printf '%s\n' "$out" >&2
    echo "vm-matrix $arch: FAIL (see above)"
    rc=1
  fi
done
exit $rc
