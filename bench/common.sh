# Shared by the bench/*.sh drivers (sourced): root check, and the binaries to measure.
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
  if [ "$smoke" -eq 0 ]; then
    # The probes object is built by exporter/build.rs into a directory cargo may share between
    # several checkouts of this workspace (its fingerprint ignores the checkout's path), so a
    # measurement could otherwise embed another checkout's probes: rebuild it every time.
    touch exporter/build.rs
  fi
  cargo build --locked "${profile_args[@]}" -p sysscope --bins >&2
  # Copied at once: a target directory shared with other builds may be rewritten meanwhile.
  bin_dir=$workdir/bin
  mkdir -p "$bin_dir"
  for b in sysscope sysscope-bench sysscope-workload; do cp "$target/$profile/$b" "$bin_dir/"; done
}
