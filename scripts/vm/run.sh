#!/usr/bin/env bash
# Boots a kernel under qemu (software emulation: no KVM needed) with a small initramfs holding
# sysscope's binaries, runs one scenario inside, and reports. Used by scripts/checks/vm-*.sh;
# runnable by hand (root, Debian):
#
#   scripts/vm/run.sh --scenario big-node --smp 2,maxcpus=224
#   scripts/vm/run.sh --scenario basic --kernel 6.12
#   scripts/vm/run.sh --scenario basic --kernel linux-image-6.1.0-56-cloud-amd64-unsigned
#   scripts/vm/run.sh --scenario basic --kernel ../shared/kernels/linux-5.15.135/bzImage
#   scripts/vm/run.sh --scenario basic --arch arm64
#
# Options: --arch amd64|arm64 (default amd64; arm64 boots qemu-system-aarch64 with binaries
# cross-built for aarch64-unknown-linux-gnu), --kernel KERNEL (default 6.1): a Debian series
# (6.1, 6.12: the newest cloud kernel package of that series Debian offers for the
# architecture), a Debian package name (linux-image-...), or the path of a kernel image
# (an x86 bzImage with what the scenario needs built in; a SHA256SUMS file beside it, if
# there is one, must match), --smp SPEC (qemu -smp; default 2), --mem MiB (default 6144),
# --bin-dir DIR (sysscope and sysscope-workload; default target/debug, or
# target/aarch64-unknown-linux-gnu/debug for arm64, built if missing), --timeout SECONDS
# (default 600 for amd64, 1200 for arm64: emulating another architecture is slower),
# --fetch-only (install the tools and download the kernel and busybox, then stop: runs of
# several guests at once do their apt work first, one at a time).
# SYSSCOPE_VM_ACCEL overrides qemu's -accel (see the amd64 case below for the default's reason).
# SYSSCOPE_VM_LOGLEVEL (default 1) sets the guest kernel's console log level: 7 prints the
# stack traces of kernel warnings (a soft lockup's trace is not printed at 1).
# Scenarios are shell scripts in scripts/vm/scenarios/, run as the guest's init payload; each
# check prints `VMCHECK <name> PASS|FAIL <detail>`; the files of scripts/vm/data/ are in the
# guest's /etc/sysscope-vm/. The report ends with one line, `vm: PASS|FAIL (what): ...`,
# giving the guest's boot time (kernel start to init) and the scenario's. Exit status 0 only
# if every check passed and the scenario ran to its end. Downloads and the built initramfs
# are cached under target/vm-cache/.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
arch=amd64 kernel=6.1 smp=2 mem=6144 bin_dir="" timeout="" scenario="" fetch_only=false
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --kernel) kernel=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --scenario) scenario=$2; shift 2 ;;
    --fetch-only) fetch_only=true; shift ;;
    *) echo "vm: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$scenario" ] || { echo "vm: --scenario NAME is required" >&2; exit 2; }
scenario_file="$top/scripts/vm/scenarios/$scenario.sh"
[ -f "$scenario_file" ] || { echo "vm: no scenario $scenario_file" >&2; exit 2; }
case "$arch" in
  amd64)
    qemu=qemu-system-x86_64 qemu_pkg=qemu-system-x86 console_dev=ttyS0 strip=strip
    machine=(-machine q35 -cpu max) rust_target="" default_timeout=600
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
    rust_target=aarch64-unknown-linux-gnu default_timeout=1200
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

# The kernel: an image file as given, or a Debian package, extracted once.
kdir="" kernel_pkg=""
if [ -f "$kernel" ]; then
  vmlinuz=$(cd "$(dirname "$kernel")" && pwd)/$(basename "$kernel")
  sums="$(dirname "$vmlinuz")/SHA256SUMS"
  if [ -f "$sums" ]; then
    line=$(grep " [*]\?$(basename "$vmlinuz")\$" "$sums" || true)
    [ -n "$line" ] || { echo "vm: $sums does not list $(basename "$vmlinuz")" >&2; exit 1; }
    (cd "$(dirname "$vmlinuz")" && printf '%s\n' "$line" | sha256sum -c --quiet -) >&2 \
      || { echo "vm: $vmlinuz does not match $sums" >&2; exit 1; }
  fi
  # An x86 bzImage names its version in the setup header (Documentation/arch/x86/boot.rst:
  # "HdrS" at 0x202, the version string's offset less 0x200 at 0x20e).
  kernel_version=""
  if [ "$(dd if="$vmlinuz" bs=1 skip=$((0x202)) count=4 2>/dev/null)" = HdrS ]; then
    off=$(od -An -tu2 -j $((0x20e)) -N2 "$vmlinuz" | tr -d ' ')
    kernel_version=$(dd if="$vmlinuz" bs=1 skip=$((off + 0x200)) count=64 2>/dev/null \
      | tr '\0' '\n' | head -n 1 | cut -d' ' -f1)
  fi
  [ -n "$kernel_version" ] || kernel_version=$(basename "$vmlinuz")
  kernel_what=$vmlinuz
else
  case "$kernel" in
    linux-image-*) kernel_pkg=$kernel ;;
    [0-9]*.[0-9]*)
      # 6.1 matches linux-image-6.1.0-57-... but not linux-image-6.12.x-...
      pattern="^linux-image-${kernel//./\\.}[.-].*-cloud-$arch-unsigned\$"
      newest() { apt-cache search --names-only "$pattern" 2>/dev/null | awk '{print $1}' | sort -V | tail -n 1; }
      kernel_pkg=$(newest)
      if [ -z "$kernel_pkg" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        kernel_pkg=$(newest)
      fi
      [ -n "$kernel_pkg" ] || { echo "vm: no Debian $kernel cloud kernel package for $arch" >&2; exit 1; }
      ;;
    *) echo "vm: --kernel $kernel is neither a file, a Debian series (6.1) nor a package (linux-image-...)" >&2; exit 2 ;;
  esac
  kdir="$cache/$kernel_pkg"
  if ! ls "$kdir"/boot/vmlinuz-* >/dev/null 2>&1; then
    log "downloading $kernel_pkg"
    rm -rf "$kdir.tmp" && mkdir -p "$kdir.tmp"
    (cd "$kdir.tmp" && apt-get download "$kernel_pkg:$arch" >/dev/null && dpkg-deb -x ./*.deb extracted)
    rm -rf "$kdir" && mv "$kdir.tmp/extracted" "$kdir" && rm -rf "$kdir.tmp"
  fi
  vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -n 1)
  kernel_version=${vmlinuz##*/vmlinuz-}
  kernel_what=$kernel_pkg
fi

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

if $fetch_only; then
  echo "vm: fetched kernel $kernel_version ($kernel_what), arch $arch"
  exit 0
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
cp -r "$top/scripts/vm/data" "$root/etc/sysscope-vm"
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
# The loop driver is a module in Debian's cloud kernels; the block I/O checks need it. (A
# kernel image given as a file has it built in.)
for ko in $([ -z "$kdir" ] || find "$kdir/lib/modules" -name loop.ko -o -name loop.ko.xz); do
  case "$ko" in *.xz) xz -dc "$ko" > "$root/lib/modules/loop.ko" ;; *) cp "$ko" "$root/lib/modules/" ;; esac
done
{
  cat <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
echo "VMTIME init $(cut -d' ' -f1 /proc/uptime)"
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
  printf '\necho "VMTIME end $(cut -d" " -f1 /proc/uptime)"\necho VMCHECK_END\npoweroff -f\n'
} > "$root/init"
chmod +x "$root/init"
initrd="$cache/initrd-$arch-$scenario-$kernel_version.cpio.gz"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$initrd")

console="$cache/console-$scenario-$kernel_version.log"
# quiet: only the scenario's lines and errors on the console the checks are read from.
what="kernel $kernel_version ($kernel_what), arch $arch, smp $smp, scenario $scenario"
log "booting: $what"
started=$(date +%s)
set +e
timeout -k 10 "$timeout" "$qemu" -accel "$accel" "${machine[@]}" -m "$mem" -smp "$smp" \
  -nographic -no-reboot -kernel "$vmlinuz" -initrd "$initrd" \
  -append "console=$console_dev quiet loglevel=${SYSSCOPE_VM_LOGLEVEL:-1} panic=-1" </dev/null > "$console" 2>&1
rc=$?
set -e
took=$(( $(date +%s) - started ))
log_text=$(tr -d '\r' < "$console")
checks=$(printf '%s\n' "$log_text" | grep '^VMCHECK ' || true)
# The guest's clock: kernel start to init, and init to the scenario's end.
init_at=$(printf '%s\n' "$log_text" | sed -n 's/.*VMTIME init \([0-9.]*\).*/\1/p' | head -n 1)
end_at=$(printf '%s\n' "$log_text" | sed -n 's/.*VMTIME end \([0-9.]*\).*/\1/p' | head -n 1)
times="boot ${init_at:-?}s, scenario $( [ -n "$init_at" ] && [ -n "$end_at" ] \
  && awk -v a="$init_at" -v b="$end_at" 'BEGIN { printf "%.1f", b - a }' || echo '?')s, ${took}s in all"
# One row a check: name, result, the figures it measured (shortened).
echo "vm: results on $kernel_version ($arch):" >&2
printf '%s\n' "$checks" | grep -v '^$' | while read -r _ name result detail; do
  [ ${#detail} -le 110 ] || detail="${detail:0:107}..."
  printf '  %-32s %-4s %s\n' "$name" "$result" "$detail"
done >&2
failed=$(printf '%s\n' "$checks" | grep -c '^VMCHECK [^ ]* FAIL' || true)
passed=$(printf '%s\n' "$checks" | grep -c '^VMCHECK [^ ]* PASS' || true)
if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || ! printf '%s\n' "$log_text" | grep -q '^VMCHECK_END'; then
  why="qemu exit $rc"; [ "$rc" -eq 124 ] && why="timed out (--timeout $timeout)"
  echo "vm: console tail:" >&2
  printf '%s\n' "$log_text" | grep -v '^\s*$' | tail -n 40 >&2
  echo "vm: FAIL ($what): $passed passed, $failed failed, $why; $times"
  exit 1
fi
echo "vm: PASS ($what): $passed checks; $times"
