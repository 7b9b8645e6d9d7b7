# Shared by the bench/*.sh drivers (sourced): root check, and the binaries to measure.
# bench_setup "$@" is a driver's whole preamble: root, cargo on PATH, $workdir (removed at exit),
# $bin_dir (bench_bins, a debug build when the arguments hold --smoke) and SYSSCOPE_REVISION.
# bench_bins WORKDIR SMOKE sets $bin_dir: $SYSSCOPE_BENCH_BIN_DIR if given, else a fresh build
# (release; debug in smoke mode, where timing is not looked at) copied into WORKDIR/bin.

bench_require_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$0: needs root (loads eBPF programs)" >&2
    exit 2
  fi
}

bench_bins() {
  local workdir=$1 smoke=$2
  bin_dir=${SYSSCOPE_BENCH_BIN_DIR:-}
  [ -n "$bin_dir" ] && return 0
  local profile=release profile_args=(--release)
  if [ "$smoke" -eq 1 ]; then profile=debug; profile_args=(); fi
  local target=${CARGO_TARGET_DIR:-$PWD/target}
  # Cargo decides what to rebuild by comparing source modification times with its last build.
  # When several checkouts of this workspace share one CARGO_TARGET_DIR, that last build may be
  # another checkout's, with sources newer than ours: cargo would then hand us its binaries and
  # probes object. Marking our sources as newest makes the build ours (at the price of
  # recompiling sysscope itself).
  find exporter/src ebpf/abi/src ebpf/probes/src -name '*.rs' -exec touch {} +
  touch exporter/build.rs
  cargo build --locked "${profile_args[@]}" -p sysscope --bins >&2
  # Copied at once: a target directory shared with other builds may be rewritten meanwhile.
  bin_dir=$workdir/bin
  mkdir -p "$bin_dir"
  for b in sysscope sysscope-bench sysscope-workload; do cp "$target/$profile/$b" "$bin_dir/"; done
}

bench_setup() {
  bench_require_root
  export PATH="$HOME/.cargo/bin:$PATH"
  local smoke=0 arg
  for arg in "$@"; do [ "$arg" = "--smoke" ] && smoke=1; done
  workdir=$(mktemp -d /tmp/sysscope-bench.XXXXXX)
  trap 'rm -rf "$workdir"' EXIT
  bench_bins "$workdir" "$smoke"
  export SYSSCOPE_REVISION=${SYSSCOPE_REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
}
