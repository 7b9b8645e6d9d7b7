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
if [ "$(id -u)" -ne 0 ]; then
  echo "bench/overhead.sh: needs root (loads eBPF programs)" >&2
  exit 2
fi
export PATH="$HOME/.cargo/bin:$PATH"

smoke=0
for arg in "$@"; do [ "$arg" = "--smoke" ] && smoke=1; done

workdir=$(mktemp -d /tmp/sysscope-bench.XXXXXX)
trap 'rm -rf "$workdir"' EXIT

bin_dir=${SYSSCOPE_BENCH_BIN_DIR:-}
if [ -z "$bin_dir" ]; then
  # Timing is not looked at in smoke mode: the debug build the tests made is enough.
  profile_args=(--release)
  profile=release
  if [ "$smoke" -eq 1 ]; then profile_args=(); profile=debug; fi
  target=${CARGO_TARGET_DIR:-$PWD/target}
  cargo build --locked "${profile_args[@]}" -p sysscope --bins >&2
  # Copied at once: a target directory shared with other builds may be rewritten meanwhile.
  bin_dir=$workdir/bin
  mkdir -p "$bin_dir"
  for b in sysscope sysscope-bench sysscope-workload; do cp "$target/$profile/$b" "$bin_dir/"; done
fi

# bpftrace and perf trace read tracepoint formats from tracefs. It is left mounted: other
# tools may start using it meanwhile, and a mounted tracefs costs nothing.
if ! grep -qs " tracefs " /proc/mounts; then
  mount -t tracefs tracefs /sys/kernel/tracing || echo "bench: cannot mount tracefs" >&2
fi

export SYSSCOPE_REVISION=${SYSSCOPE_REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
python3 bench/overhead.py --bin-dir "$bin_dir" "$@"
