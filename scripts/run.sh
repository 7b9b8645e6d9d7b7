#!/usr/bin/env bash
# Builds sysscope (release) and runs the exporter with its defaults, as root:
# metrics on http://127.0.0.1:9812/metrics. Arguments are passed to sysscope, e.g.
#   scripts/run.sh --web.listen-address=0.0.0.0:9812
# Installs what a fresh Debian machine lacks first (idempotent, seconds when present).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p sysscope --bin sysscope
bin="$PWD/target/release/sysscope"
if [ "$(id -u)" -ne 0 ]; then
  exec sudo "$bin" "$@"
fi
exec "$bin" "$@"
