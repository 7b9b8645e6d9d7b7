#!/usr/bin/env bash
# Builds the eBPF probes object of a git revision, as the exporter's build script does (nightly,
# bpfel target, BTF), so `bench/overhead.sh --configs attach:PROGS@OBJECT` can compare probe
# variants side by side in one run.
#
#   bench/probes-object.sh REV OUT     e.g. bench/probes-object.sh HEAD~3 /tmp/probes-old.o
#
# The revision is checked out in a temporary worktree; the working tree is left alone.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 REV OUT" >&2; exit 2; }
rev=$1 out=$2
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

tree=$(mktemp -d /tmp/sysscope-probes.XXXXXX)
cleanup() { git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"; }
trap cleanup EXIT
git worktree add --detach --force "$tree" "$rev" >/dev/null

arch=$(uname -m)
case "$arch" in aarch64 | arm64) arch=aarch64 ;; *) arch=x86_64 ;; esac
# The same flags aya-build passes: the target arch cfg, debug info, and BTF from the linker.
sep=$'\x1f'
(
  cd "$tree/ebpf/probes"
  CARGO_ENCODED_RUSTFLAGS="--cfg=bpf_target_arch=\"$arch\"${sep}-Cdebuginfo=2${sep}-Clink-arg=--btf" \
    rustup run nightly cargo build --release --bins --target bpfel-unknown-none -Z build-std=core \
      --target-dir "${CARGO_TARGET_DIR:-$PWD/../../target}/probes-object" >&2
)
cp "${CARGO_TARGET_DIR:-$tree/target}/probes-object/bpfel-unknown-none/release/sysscope-probes" "$out"
echo "$out: probes of $(git rev-parse --short "$rev")"
