#!/usr/bin/env bash
# Measures sysscope's footprint for sizing the DaemonSet's requests and limits: resident memory
# (VmRSS, peak VmHWM), CPU time of the sysscope process (user + system, from /proc/<pid>/stat),
# the memory its eBPF maps hold (bpftool: bytes_memlock of the maps it owns), and, where a
# memory cgroup is available, everything charged to it (what a container memory limit sees).
#
#   scripts/measure-footprint.sh [SECONDS] [THREADS] [CGROUPS]
#
# Phases: idle; a syscall load (sysscope-workload loop-getppid on THREADS threads) while
# Prometheus-like scrapes run every second; then CGROUPS cgroups with short-lived processes
# making a spread of syscalls, to grow the series count. Needs root and a release build:
#   cargo build --release -p sysscope --bins
# SYSSCOPE and WORKLOAD override the binaries' paths.
set -euo pipefail

secs=${1:-30}
threads=${2:-1}
ncg=${3:-40}
top=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$top/target}
sysscope=${SYSSCOPE:-$target/release/sysscope}
workload=${WORKLOAD:-$target/release/sysscope-workload}
port=$((20000 + RANDOM % 20000))
hz=$(getconf CLK_TCK)

v2=$(awk '$9 == "cgroup2" && $4 == "/" { print $5; exit }' /proc/self/mountinfo)
work=$(mktemp -d)
memcg=""
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  for d in "$v2"/sysscope-footprint-*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null || true; done
  [ -n "$memcg" ] && rmdir "$memcg" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# A memory cgroup for sysscope: v2 if the memory controller is there, else v1.
if grep -qw memory "$v2/cgroup.controllers" 2>/dev/null; then
  memcg="$v2/sysscope-footprint-self"; mkdir -p "$memcg"; memfile=memory.current
elif [ -d /sys/fs/cgroup/memory ]; then
  memcg=/sys/fs/cgroup/memory/sysscope-footprint; mkdir -p "$memcg"; memfile=memory.usage_in_bytes
fi

printf '[collection]\nbackground_interval = "10s"\n' >"$work/config.toml"
(
  [ -n "$memcg" ] && echo $BASHPID >"$memcg/cgroup.procs"
  exec "$sysscope" --web.listen-address=127.0.0.1:$port --config.file="$work/config.toml" --log.level=warn
) &
pid=$!
for _ in $(seq 100); do curl -sf "localhost:$port/-/ready" >/dev/null && break; sleep 0.1; done

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$pid/status"; }
# Kernel memory of the maps sysscope holds: "memlock:" of each map fd's fdinfo.
map_bytes() {
  cat /proc/$pid/fdinfo/* 2>/dev/null | awk '/^map_type:/ { m = 1 } /^memlock:/ && m { s += $2; m = 0 } END { print s + 0 }'
}
series() { curl -s "localhost:$port/metrics" | grep -c '^sysscope_' || true; }
report() {
  local phase=$1 t0=$2 c0=$3
  local dt=$(( $(date +%s%N) - t0 )) dc=$(( $(cpu_ticks) - c0 ))
  local mem="n/a"
  [ -n "$memcg" ] && mem="$(( $(cat "$memcg/$memfile") / 1048576 )) MiB"
  printf '%-28s cpu %5.1f%% of a core | VmRSS %4d MiB | VmHWM %4d MiB | maps %4d MiB | memcg %s | samples %d\n' \
    "$phase" "$(awk -v c="$dc" -v hz="$hz" -v dt="$dt" 'BEGIN { print c / hz * 1e9 / dt * 100 }')" \
    $(( $(kib VmRSS) / 1024 )) $(( $(kib VmHWM) / 1024 )) $(( $(map_bytes) / 1048576 )) "$mem" "$(series)"
}

t=$(date +%s%N); c=$(cpu_ticks); sleep "$secs"; report "idle" "$t" "$c"

t=$(date +%s%N); c=$(cpu_ticks)
"$workload" loop-getppid "$secs" "$threads" >"$work/load.txt" &
load=$!
while kill -0 $load 2>/dev/null; do curl -s "localhost:$port/metrics" >/dev/null; sleep 1; done
report "getppid load, 1 scrape/s" "$t" "$c"
echo "  load: $(cat "$work/load.txt")"

t=$(date +%s%N); c=$(cpu_ticks)
end=$(( $(date +%s) + secs ))
i=0
jobs_=()
while [ "$(date +%s)" -lt "$end" ]; do
  d="$v2/sysscope-footprint-$((i % ncg))"; mkdir -p "$d"
  "$workload" join-cgroup "$d" getppid 100 openat-missing 20 sleep 1 1 >/dev/null &
  jobs_+=($!)
  i=$((i + 1))
  if [ $((i % ncg)) -eq 0 ]; then
    curl -s "localhost:$port/metrics" >/dev/null
    wait "${jobs_[@]}"; jobs_=()
  fi
done
[ ${#jobs_[@]} -gt 0 ] && wait "${jobs_[@]}"
curl -s "localhost:$port/metrics" >/dev/null
report "$ncg cgroups, $i processes" "$t" "$c"
