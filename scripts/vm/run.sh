#!/usr/bin/env bash
# Boots a Debian kernel package under qemu (software emulation: no KVM needed) with a small
# initramfs holding sysscope's binaries, runs one scenario inside, and reports. Used by
# scripts/checks/vm-*.sh; runnable by hand (root, Debian):
#
#   scripts/vm/run.sh --scenario big-node --smp 2,maxcpus=224
#   scripts/vm/run.sh --scenario basic --kernel linux-image-6.1.0-56-cloud-amd64-unsigned
#   scripts/vm/run.sh --scenario basic --arch arm64
#
# Options: --arch amd64|arm64 (default amd64; arm64 boots qemu-system-aarch64 with binaries
# cross-built for aarch64-unknown-linux-gnu), --kernel PACKAGE (default: the newest 6.1 cloud
# kernel Debian offers for the architecture), --smp SPEC (qemu -smp; default 2), --mem MiB
# (default 6144), --bin-dir DIR (sysscope and sysscope-workload; default target/debug, or
# target/aarch64-unknown-linux-gnu/debug for arm64, built if missing), --timeout SECONDS
# (default 300 for amd64, 900 for arm64: emulating another architecture is slower).
# SYSSCOPE_VM_ACCEL overrides qemu's -accel (see the amd64 case below for the default's reason).
# SYSSCOPE_VM_LOGLEVEL (default 1) sets the guest kernel's console log level: 7 prints the
# stack traces of kernel warnings (a soft lockup's trace is not printed at 1).
# Scenarios are shell scripts in scripts/vm/scenarios/, run as the guest's init payload; each
# check prints `VMCHECK <name> PASS|FAIL <detail>`. Exit status 0 only if every check passed
# and the scenario ran to its end. Downloads and the built initramfs are cached under
# target/vm-cache/.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
arch=amd64 kernel_pkg="" smp=2 mem=6144 bin_dir="" timeout="" scenario=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --kernel) kernel_pkg=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --scenario) scenario=$2; shift 2 ;;
    *) echo "vm: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$scenario" ] || { echo "vm: --scenario NAME is required" >&2; exit 2; }
scenario_file="$top/scripts/vm/scenarios/$scenario.sh"
[ -f "$scenario_file" ] || { echo "vm: no scenario $scenario_file" >&2; exit 2; }
case "$arch" in
  amd64)
    qemu=qemu-system-x86_64 qemu_pkg=qemu-system-x86 console_dev=ttyS0 strip=strip
    machine=(-machine q35 -cpu max) rust_target="" default_timeout=300
    # One host thread for all vCPUs: with multi-threaded TCG (qemu 7.2), a vCPU can keep
    # executing a stale translation of a kernel jump-label site another vCPU has just patched
    # back from int3 (here the BPF statistics key, switched by collection.probe_stats), so it
    # traps on the int3 forever and the guest reports soft lockups at bpf_trace_run2. The
    # stats-toggle scenario reproduces it within seconds with SYSSCOPE_VM_ACCEL=tcg.
    accel=tcg,thread=single
    ;;
  arm64)
    # cortex-a72 rather than max: emulating pointer authentication slows TCG down a lot.
    qemu=qemu-system-aarch64 qemu_pkg=qemu-system-arm console_dev=ttyAMA0
    strip=aarch64-linux-gnu-strip machine=(-machine virt -cpu cortex-a72)
    rust_target=aarch64-unknown-linux-gnu default_timeout=900
    # Not seen on arm64 (whose jump labels patch one branch instruction, no int3 protocol):
    # one host thread per vCPU, which halves the wall time of the slow cross-architecture run.
    accel=tcg
    ;;
  *) echo "vm: unknown arch $arch (amd64 or arm64)" >&2; exit 2 ;;
esac
accel=${SYSSCOPE_VM_ACCEL:-$accel}
bin_dir_opt=$bin_dir
[ -n "$bin_dir" ] || bin_dir="$top/target${rust_target:+/$rust_target}/debug"
[ -n "$timeout" ] || timeout=$default_timeout

log() { printf '[vm] %s\n' "$*" >&2; }
cache="$top/target/vm-cache"
mkdir -p "$cache"

# Tools, installed once.
need=()
command -v "$qemu" >/dev/null || need+=("$qemu_pkg")
[ -x /bin/busybox ] || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
if [ "$arch" = arm64 ]; then
  command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
  [ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] || need+=(libc6-dev-arm64-cross)
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "dpkg --add-architecture arm64"
    dpkg --add-architecture arm64
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
  fi
fi
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The kernel: a Debian package, extracted once.
if [ -z "$kernel_pkg" ]; then
  kernel_pkg=$(apt-cache search --names-only "^linux-image-6\\.1\\.0-[0-9]+-cloud-$arch-unsigned\$" 2>/dev/null \
    | awk '{print $1}' | sort -V | tail -n 1)
  if [ -z "$kernel_pkg" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    kernel_pkg=$(apt-cache search --names-only "^linux-image-6\\.1\\.0-[0-9]+-cloud-$arch-unsigned\$" \
      | awk '{print $1}' | sort -V | tail -n 1)
  fi
fi
[ -n "$kernel_pkg" ] || { echo "vm: no Debian 6.1 cloud kernel package found" >&2; exit 1; }
kdir="$cache/$kernel_pkg"
if ! ls "$kdir"/boot/vmlinuz-* >/dev/null 2>&1; then
  log "downloading $kernel_pkg"
  rm -rf "$kdir.tmp" && mkdir -p "$kdir.tmp"
  (cd "$kdir.tmp" && apt-get download "$kernel_pkg:$arch" >/dev/null && dpkg-deb -x ./*.deb extracted)
  rm -rf "$kdir" && mv "$kdir.tmp/extracted" "$kdir" && rm -rf "$kdir.tmp"
fi
vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -n 1)
kernel_version=${vmlinuz##*/vmlinuz-}

# busybox for the guest: the host's for amd64, Debian's arm64 package (downloaded once) for arm64.
busybox=/bin/busybox
if [ "$arch" = arm64 ]; then
  bb="$cache/busybox-arm64"
  if [ ! -x "$bb/bin/busybox" ]; then
    log "downloading busybox-static:arm64"
    rm -rf "$bb.tmp" && mkdir -p "$bb.tmp"
    (cd "$bb.tmp" && apt-get download busybox-static:arm64 >/dev/null && dpkg-deb -x ./*.deb extracted)
    rm -rf "$bb" && mv "$bb.tmp/extracted" "$bb" && rm -rf "$bb.tmp"
  fi
  busybox="$bb/bin/busybox"
fi

# The binaries. amd64 takes what `cargo test` built (built here only if missing); the arm64
# cross build is always brought up to date (a no-op when it is), since nothing else builds it.
bin_dir_given=$bin_dir_opt
if [ ! -x "$bin_dir/sysscope" ] || [ ! -x "$bin_dir/sysscope-workload" ] \
   || { [ -n "$rust_target" ] && [ -z "$bin_dir_given" ]; }; then
  if [ -z "$rust_target" ]; then
    log "building sysscope (debug)"
    (cd "$top" && cargo build --locked --bin sysscope --bin sysscope-workload)
  else
    log "building sysscope (debug) for $rust_target"
    rustup target list --installed | grep -qx "$rust_target" || rustup target add "$rust_target"
    (cd "$top" && CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      cargo build --locked --target "$rust_target" --bin sysscope --bin sysscope-workload)
  fi
fi

# The initramfs: busybox, the stripped binaries and their libraries, the scenario as /init.
root=$(mktemp -d "$cache/root.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,proc,sys,dev,tmp,etc,lib/modules}
cp "$busybox" "$root/bin/busybox"
for b in sysscope sysscope-workload; do
  "$strip" -o "$root/bin/$b" "$bin_dir/$b"
  if [ "$arch" = amd64 ]; then
    for lib in $(ldd "$bin_dir/$b" | grep -o '/[^ :]*' | sort -u); do
      [ -e "$lib" ] || continue
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  else
    # The cross toolchain's sysroot holds the arm64 glibc the binaries were linked against.
    for lib in $(readelf -d "$bin_dir/$b" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p') ld-linux-aarch64.so.1; do
      cp -L "/usr/aarch64-linux-gnu/lib/$lib" "$root/lib/$lib"
    done
  fi
done
# The loop driver is a module in the cloud kernels; the block I/O checks need it.
for ko in $(find "$kdir/lib/modules" -name loop.ko -o -name loop.ko.xz); do
  case "$ko" in *.xz) xz -dc "$ko" > "$root/lib/modules/loop.ko" ;; *) cp "$ko" "$root/lib/modules/" ;; esac
done
{
  cat <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup
mount -t tmpfs tmp /tmp
mkdir -p /sys/kernel/tracing && mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
for ko in /lib/modules/*.ko; do [ -e "$ko" ] && insmod "$ko"; done
echo "VMINFO kernel $(uname -r) $(uname -m), possible CPUs $(cat /sys/devices/system/cpu/possible)"
check() { if [ "$2" = "$3" ]; then echo "VMCHECK $1 PASS $2"; else echo "VMCHECK $1 FAIL got=$2 want=$3"; fi; }
# report NAME PASS|FAIL DETAIL, for checks that are not an equality.
report() { echo "VMCHECK $1 $2 $3"; }
INIT
  cat "$scenario_file"
  printf '\necho VMCHECK_END\npoweroff -f\n'
} > "$root/init"
chmod +x "$root/init"
initrd="$cache/initrd-$arch-$scenario.cpio.gz"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$initrd")

console="$cache/console-$scenario-$kernel_version.log"
# quiet: only the scenario's lines and errors on the console the checks are read from.
what="kernel $kernel_version ($kernel_pkg), arch $arch, smp $smp, scenario $scenario"
log "booting: $what"
started=$(date +%s)
set +e
timeout -k 10 "$timeout" "$qemu" -accel "$accel" "${machine[@]}" -m "$mem" -smp "$smp" \
  -nographic -no-reboot -kernel "$vmlinuz" -initrd "$initrd" \
  -append "console=$console_dev quiet loglevel=${SYSSCOPE_VM_LOGLEVEL:-1} panic=-1" </dev/null > "$console" 2>&1
rc=$?
set -e
took=$(( $(date +%s) - started ))
checks=$(tr -d '\r' < "$console" | grep '^VMCHECK ' || true)
printf '%s\n' "$checks" | grep -v '^$' | sed 's/^/  /' >&2 || true
failed=$(printf '%s\n' "$checks" | grep -c '^VMCHECK [^ ]* FAIL' || true)
passed=$(printf '%s\n' "$checks" | grep -c '^VMCHECK [^ ]* PASS' || true)
if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || ! grep -q '^VMCHECK_END' <(tr -d '\r' < "$console"); then
  why="qemu exit $rc"; [ "$rc" -eq 124 ] && why="timed out (--timeout $timeout)"
  echo "vm: FAIL ($what): $passed passed, $failed failed, $why after ${took}s; console tail:" >&2
  tr -d '\r' < "$console" | grep -v '^\s*$' | tail -n 40 >&2
  exit 1
fi
echo "vm: PASS ($what): $passed checks in ${took}s"
