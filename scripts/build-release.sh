#!/usr/bin/env bash
# Builds the release binary of sysscope (the exporter and its command-line tools) for one
# architecture, on this x86_64 Debian machine:
#   scripts/build-release.sh            amd64: target/release/sysscope
#   scripts/build-release.sh arm64      aarch64: target/aarch64-unknown-linux-gnu/release/sysscope
# Installs what is missing first (the build prerequisites; for arm64 Debian's cross gcc and the
# Rust target), idempotently. The probes are the same eBPF object for both architectures but are
# compiled for the target's syscall ABI (argument registers, syscall numbers).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-amd64}
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
case "$arch" in
  amd64 | x86_64)
    cargo build --release --locked -p sysscope --bin sysscope
    out=target/release/sysscope
    ;;
  arm64 | aarch64)
    if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -e /usr/aarch64-linux-gnu/lib/libc.so.6 ]; then
      sudo_or() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
      sudo_or env DEBIAN_FRONTEND=noninteractive apt-get update -qq
      sudo_or env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    fi
    rustup target list --installed | grep -qx aarch64-unknown-linux-gnu \
      || rustup target add aarch64-unknown-linux-gnu
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      cargo build --release --locked -p sysscope --bin sysscope --target aarch64-unknown-linux-gnu
    out=target/aarch64-unknown-linux-gnu/release/sysscope
    ;;
  *)
    echo "build-release.sh: unknown architecture '$arch' (expected amd64 or arm64)" >&2
    exit 2
    ;;
esac
file "$out" 2>/dev/null || true
echo "$out"
