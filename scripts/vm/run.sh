#!/usr/bin/env bash
# Boots a Debian kernel package under qemu (software emulation: no KVM needed) with a small
# initramfs holding sysscope's binaries, runs one scenario inside, and reports. Used by
# scripts/checks/vm-*.sh; runnable by hand (root, Debian):
#
#   scripts/vm/run.sh --scenario big-node --smp 2,maxcpus=224
#   scripts/vm/run.sh --scenario basic --kernel linux-image-6.1.0-56-cloud-amd64-unsigned
#
# Options: --arch amd64 (default; the only one this runner boots yet), --kernel PACKAGE
# (default: the newest 6.1 cloud kernel Debian offers), --smp SPEC (qemu -smp; default 2),
# --mem MiB (default 6144), --bin-dir DIR (sysscope and sysscope-workload; default
# target/debug, built if missing), --timeout SECONDS (default 300).
# Scenarios are shell scripts in scripts/vm/scenarios/, run as the guest's init payload; each
# check prints `VMCHECK <name> PASS|FAIL <detail>`. Exit status 0 only if every check passed
# and the scenario ran to its end. Downloads and the built initramfs are cached under
# target/vm-cache/.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
arch=amd64 kernel_pkg="" smp=2 mem=6144 bin_dir="$top/target/debug" timeout=300 scenario=""
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
[ "$arch" = amd64 ] || { echo "vm: arch $arch is not supported by this runner yet" >&2; exit 2; }

log() { printf '[vm] %s\n' "$*" >&2; }
cache="$top/target/vm-cache"
mkdir -p "$cache"

# Tools, installed once.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The kernel: a Debian package, extracted once.
if [ -z "$kernel_pkg" ]; then
  kernel_pkg=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$' 2>/dev/null \
    | awk '{print $1}' | sort -V | tail -n 1)
  if [ -z "$kernel_pkg" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    kernel_pkg=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$' \
      | awk '{print $1}' | sort -V | tail -n 1)
  fi
fi
[ -n "$kernel_pkg" ] || { echo "vm: no Debian 6.1 cloud kernel package found" >&2; exit 1; }
kdir="$cache/$kernel_pkg"
if ! ls "$kdir"/boot/vmlinuz-* >/dev/null 2>&1; then
  log "downloading $kernel_pkg"
  rm -rf "$kdir.tmp" && mkdir -p "$kdir.tmp"
  (cd "$kdir.tmp" && apt-get download "$kernel_pkg" >/dev/null && dpkg-deb -x ./*.deb extracted)
  rm -rf "$kdir" && mv "$kdir.tmp/extracted" "$kdir" && rm -rf "$kdir.tmp"
fi
vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -n 1)
kernel_version=${vmlinuz##*/vmlinuz-}

# The binaries.
if [ ! -x "$bin_dir/sysscope" ] || [ ! -x "$bin_dir/sysscope-workload" ]; then
  log "building sysscope (debug)"
  (cd "$top" && cargo build --locked --bin sysscope --bin sysscope-workload)
fi

# The initramfs: busybox, the stripped binaries and their libraries, the scenario as /init.
root=$(mktemp -d "$cache/root.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,proc,sys,dev,tmp,etc}
cp /bin/busybox "$root/bin/busybox"
for b in sysscope sysscope-workload; do
  strip -o "$root/bin/$b" "$bin_dir/$b"
  for lib in $(ldd "$bin_dir/$b" | grep -o '/[^ :]*' | sort -u); do
    [ -e "$lib" ] || continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
{
  cat <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
check() { if [ "$2" = "$3" ]; then echo "VMCHECK $1 PASS $2"; else echo "VMCHECK $1 FAIL got=$2 want=$3"; fi; }
INIT
  cat "$scenario_file"
  printf '\necho VMCHECK_END\npoweroff -f\n'
} > "$root/init"
chmod +x "$root/init"
initrd="$cache/initrd-$scenario.cpio.gz"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$initrd")

console="$cache/console-$scenario-$kernel_version.log"
what="kernel $kernel_version ($kernel_pkg), arch $arch, smp $smp, scenario $scenario"
log "booting: $what"
started=$(date +%s)
set +e
timeout "$timeout" qemu-system-x86_64 -accel tcg -cpu max -machine q35 -m "$mem" -smp "$smp" \
  -nographic -no-reboot -kernel "$vmlinuz" -initrd "$initrd" \
  -append "console=ttyS0 quiet panic=-1" </dev/null > "$console" 2>&1
rc=$?
set -e
took=$(( $(date +%s) - started ))
checks=$(tr -d '\r' < "$console" | grep '^VMCHECK ' || true)
printf '%s\n' "$checks" | grep -v '^$' | sed 's/^/  /' >&2 || true
failed=$(printf '%s\n' "$checks" | grep -c '^VMCHECK [^ ]* FAIL' || true)
passed=$(printf '%s\n' "$checks" | grep -c '^VMCHECK [^ ]* PASS' || true)
if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || ! grep -q '^VMCHECK_END' <(tr -d '\r' < "$console"); then
  echo "vm: FAIL ($what): $passed passed, $failed failed, qemu exit $rc after ${took}s; console tail:" >&2
  tr -d '\r' < "$console" | grep -v '^\s*$' | tail -n 40 >&2
  exit 1
fi
echo "vm: PASS ($what): $passed checks in ${took}s"
