#!/usr/bin/env bash
# Per-syscall overhead of sysscope beside the empty-program floor, bpftrace, perf trace and
# strace, side by side in one run (see docs/performance.md). Needs root.
#
#   bench/overhead.sh --quick          about 2 minutes: 3 rounds of 0.5 s cells
#   bench/overhead.sh                  the full run: 7 rounds of 2 s cells, more configurations
#   bench/overhead.sh --quick --smoke  checks the machinery only (debug build, < 1 minute)
#
# Other options go to bench/overhead.py (--configs, --workloads, --threads, --rounds,
# --seconds, --object, --label, --out). Prints the table; writes JSON to bench/results/.
# SYSSCOPE_BENCH_BIN_DIR=DIR uses already-built binaries instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_setup "$@"

# bpftrace and perf trace read tracepoint formats from tracefs. It is left mounted: other
# tools may start using it meanwhile, and a mounted tracefs costs nothing.
if ! grep -qs " tracefs " /proc/mounts; then
  mount -t tracefs tracefs /sys/kernel/tracing || echo "bench: cannot mount tracefs" >&2
fi

python3 bench/overhead.py --bin-dir "$bin_dir" "$@"
