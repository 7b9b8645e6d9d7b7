#!/usr/bin/env bash
# A node with 224 possible CPUs (DGX-class), emulated: Debian's 6.1 cloud kernel under qemu
# with -smp 2,maxcpus=224 (per-CPU maps are allocated for every possible CPU). The exporter with
# its defaults must load on that kernel, count a child exactly and keep its kernel maps within
# 64 MiB. Uses the debug binaries `cargo test` built. Prints one result line.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then
    echo "vm-big-node: FAIL (needs root to install qemu and the kernel package, and CI must run it)"
    exit 1
  fi
  echo "vm-big-node: SKIPPED (needs root)"
  exit 0
fi
if out=$("$top/scripts/vm/run.sh" --scenario big-node --smp 2,maxcpus=224 2>&1); then
  last=${out##*$'\n'}; echo "vm-big-node: ${last#vm: }"
else
  printf '%s\n' "$out" >&2
  echo "vm-big-node: FAIL (see above)"
  exit 1
fi
