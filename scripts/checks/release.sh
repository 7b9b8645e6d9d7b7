#!/usr/bin/env bash
# The release artifacts, installed and run as a user would (scripts/build-release.sh amd64):
#   - the binary needs no glibc newer than 2.28 and still links glibc dynamically (NVML);
#   - the .deb installs with dpkg; `systemd-analyze verify` accepts its unit; the installed
#     binary, run with exactly the unit's command line, user and capabilities (setpriv, in a
#     network namespace of its own so that the unit's port is free), counts a child in a fresh
#     cgroup exactly, keeps only the capabilities its configuration needs, and makes no system
#     call outside the unit's SystemCallFilter (strace); bash loads the completions; `man -l`
#     renders the page; removing the package leaves only the configuration, purging nothing;
#   - the .rpm holds the same files;
#   - the image runs under podman (rootful) with what the DaemonSet grants (CAP_BPF,
#     CAP_PERFMON, host PID namespace, read-only root, cgroup and BTF mounts, no_new_privs):
#     it counts a child exactly, /-/healthy answers, and the exporter holds no capability once
#     started; it has no shell and holds only the binary, glibc, the loader and CA certificates.
# The machine-specific podman settings (no default ulimits, runc with cgroupfs, vfs storage, a
# seccomp profile that allows bpf and perf_event_open) are explained in docs/operations.md.
# Prints one result line with the seconds it took; SYSSCOPE_RELEASE_CHECK_KEEP=1 keeps the
# package installed and the container's log.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$top"
if [ "$(id -u)" -ne 0 ]; then
  if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then
    echo "release: FAIL (needs root to install the package and run the image, and CI must run it)"
    exit 1
  fi
  echo "release: SKIPPED (needs root)"
  exit 0
fi
export PATH="$HOME/.cargo/bin:$PATH"
started=$SECONDS
work="$top/target/release-check"
dist="$work/dist"
mkdir -p "$work"
log() { printf '[release-check] %s\n' "$*" >&2; }
fail() {
  echo "release: FAIL ($*)"
  exit 1
}
pids_to_stop=()
cgroups_to_remove=()
container=""
cleanup() {
  local pid cg
  for pid in "${pids_to_stop[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for cg in "${cgroups_to_remove[@]}"; do rmdir "$cg" 2>/dev/null; done
  if [ -n "$container" ]; then podman_ rm -f "$container" >/dev/null 2>&1; fi
  if [ "${SYSSCOPE_RELEASE_CHECK_KEEP:-0}" != 1 ]; then
    dpkg --purge sysscope >/dev/null 2>&1
  fi
}
trap cleanup EXIT

# 1. Build the amd64 artifacts: the check's main cost. With the release-ci profile (Cargo.toml):
# the release pipeline without its optimisation; SYSSCOPE_RELEASE_PROFILE=release checks the
# published build itself.
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
revision=$(git rev-parse --verify HEAD)
git diff --quiet HEAD -- 2>/dev/null || revision="$revision-dirty"
build_started=$SECONDS
profile=${SYSSCOPE_RELEASE_PROFILE:-release-ci}
if ! SYSSCOPE_DIST="$dist" SYSSCOPE_RELEASE_PROFILE=$profile scripts/build-release.sh amd64 >"$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log" >&2
  fail "scripts/build-release.sh amd64 failed; see above"
fi
build_s=$((SECONDS - build_started))
deb="$dist/sysscope_${version}-1_amd64.deb"
rpm="$dist/sysscope-${version}-1.x86_64.rpm"
tarball="$dist/sysscope-${version}-linux-amd64.tar.gz"
image="$dist/sysscope_${version}_linux_amd64.oci.tar"
for f in "$deb" "$rpm" "$tarball" "$image" "$dist/SHA256SUMS"; do
  [ -s "$f" ] || fail "missing artifact $(basename "$f")"
done
(cd "$dist" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match the artifacts"

# The manifests pull the version this tree builds.
for f in deploy/kubernetes/daemonset.yaml deploy/kubernetes/kustomization.yaml; do
  grep -qE "(image: ghcr.io/sysscope/sysscope:|newTag: )$version\$" "$f" ||
    fail "$f does not name the image of version $version"
done

# 2. The tarball's contents.
expected_tar="LICENSE README.md completions/_sysscope completions/sysscope.bash completions/sysscope.fish config.toml sysscope sysscope.1.gz sysscope.service"
got_tar=$(tar -tzf "$tarball" | grep -v '/$' | sed "s,^sysscope-$version-linux-amd64/,," | sort | tr '\n' ' ')
[ "$got_tar" = "$expected_tar " ] || fail "tarball holds [$got_tar], expected [$expected_tar]"

# 3. Install the .deb (a leftover from an interrupted run goes first).
dpkg --purge sysscope >/dev/null 2>&1
dpkg -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -i failed"; }
bin=/usr/bin/sysscope
unit=/usr/lib/systemd/system/sysscope.service
[ "$(stat -c %a /etc/sysscope/config.toml)" = 644 ] || fail "config mode"
dpkg-query -W -f='${Conffiles}\n' sysscope | grep -q '/etc/sysscope/config.toml' ||
  fail "/etc/sysscope/config.toml is not a conffile"

# glibc: no symbol version above 2.28, dynamically linked (dlopen of the host's NVML).
newest=$(readelf --version-info --wide "$bin" | grep -o 'Name: GLIBC_[0-9.]*' | sed 's/.*GLIBC_//' |
  sort -t . -k 1,1n -k 2,2n | tail -n 1)
[ -n "$newest" ] && [ "$(printf '%s\n2.28\n' "$newest" | sort -t . -k 1,1n -k 2,2n | tail -n 1)" = 2.28 ] ||
  fail "the installed binary needs GLIBC_$newest (at most 2.28 promised)"
readelf --program-headers "$bin" | grep -q 'Requesting program interpreter: /lib64/ld-linux-x86-64.so.2' ||
  fail "the binary is not dynamically linked against glibc"

# The version and the revision the artifacts were built from.
"$bin" --version >"$work/version.txt"
grep -qx "revision:   $revision" "$work/version.txt" || fail "--version: $(tr '\n' ' ' <"$work/version.txt"), expected revision $revision"
grep -q '^build date: 20' "$work/version.txt" && grep -q '^rustc:      rustc 1\.' "$work/version.txt" ||
  fail "--version lacks the build date or rustc: $(tr '\n' ' ' <"$work/version.txt")"

# The unit: verified by systemd, and read for the command line, user and capabilities.
verify=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $verify"
[ -z "$verify" ] || fail "systemd-analyze verify warned: $verify"
unit_value() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
exec_start=$(unit_value ExecStart)
ambient=$(unit_value AmbientCapabilities)
bounding=$(unit_value CapabilityBoundingSet)
[ "$(unit_value DynamicUser)" = yes ] && [ "$(unit_value NoNewPrivileges)" = yes ] ||
  fail "the unit should run with DynamicUser=yes and NoNewPrivileges=yes"
[ "$ambient" = "$bounding" ] || fail "AmbientCapabilities and CapabilityBoundingSet differ"
[ "$(unit_value ProtectSystem)" = strict ] || fail "ProtectSystem is not strict"
caps=$(for c in $ambient; do c=${c#CAP_}; printf '+%s,' "${c,,}"; done)
caps=${caps%,}

# Completions and man page.
completion=$(bash -c 'source /usr/share/bash-completion/completions/sysscope && complete -p sysscope' 2>&1)
[[ "$completion" == "complete "*"-F _sysscope"*" sysscope" ]] || fail "bash completion: $completion"
[ -s /usr/share/zsh/vendor-completions/_sysscope ] && [ -s /usr/share/fish/vendor_completions.d/sysscope.fish ] ||
  fail "zsh or fish completions missing"
page=$(MANWIDTH=100 man -l /usr/share/man/man1/sysscope.1.gz 2>&1 | col -b)
for word in NAME SYNOPSIS --config.file completions "Always-on eBPF"; do
  grep -q -- "$word" <<<"$page" || fail "the man page does not render '$word'"
done

# A fresh cgroup v2 for the counted child.
cg_root=$(awk '$9 == "cgroup2" && $4 == "/" { print $5; exit }' /proc/self/mountinfo)
[ -n "$cg_root" ] || fail "no cgroup v2 mount"
workload="$top/target/debug/sysscope-workload"
if [ ! -x "$workload" ]; then
  cargo build --locked --quiet --bin sysscope-workload || fail "building sysscope-workload"
fi
# "<getppid calls> <openat ENOENT errors> <build_info revision>" of a cgroup in an exposition.
cat >"$work/count.py" <<'EOF'
import re, sys
text, cg = open(sys.argv[1]).read(), sys.argv[2]
calls = errors = 0
revision = "-"
for line in text.splitlines():
    m = re.match(r"(\w+)\{(.*)\} (\S+)$", line.strip())
    if not m:
        continue
    name, value = m.group(1), m.group(3)
    labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
    if name == "sysscope_build_info":
        revision = labels.get("revision", "-")
    if labels.get("cgroup") != cg:
        continue
    if name == "sysscope_syscalls_total" and labels.get("syscall") == "getppid":
        calls += float(value)
    if name == "sysscope_syscall_errors_total" and labels.get("syscall") == "openat" \
            and labels.get("errno") == "ENOENT":
        errors += float(value)
print(int(calls), int(errors), revision)
EOF
scrape_counts() { # URL CGROUP
  curl -sf "$1" >"$work/metrics.txt" || return 1
  python3 "$work/count.py" "$work/metrics.txt" "$2"
}
count_in_fresh_cgroup() { # NAME URL -> checks 12345 getppid and 67 failed openat
  local name=$1 url=$2 cg="$cg_root/sysscope-release-$1-$$" got
  mkdir "$cg" || fail "mkdir $cg"
  cgroups_to_remove+=("$cg")
  "$workload" join-cgroup "$cg" getppid 12345 openat-missing 67 || fail "$name: workload failed"
  # Scrapes within collection.min_interval (1 s) of the last read of the maps share it.
  for _ in $(seq 1 10); do
    sleep 1.1
    got=$(scrape_counts "$url" "/sysscope-release-$1-$$")
    [ "${got%% *}" = 0 ] || break
  done
  [ "$got" = "12345 67 $revision" ] ||
    fail "$name: counted '$got' (getppid, openat ENOENT, build_info revision), expected '12345 67 $revision'"
  rmdir "$cg"
}
wait_ready() { # URL PID LOG
  local i
  for i in $(seq 1 120); do
    curl -sf -o /dev/null "$1" && return 0
    kill -0 "$2" 2>/dev/null || { tail -n 20 "$3" >&2; return 1; }
    sleep 0.5
  done
  tail -n 20 "$3" >&2
  return 1
}

# 4. The installed binary as the unit runs it: a uid of systemd's dynamic range, the unit's
# ambient capabilities and bounding set, no_new_privs, under strace to collect its system calls.
# In a network namespace of its own: the unit's address is 127.0.0.1:9812, which another
# exporter on this machine may hold.
uid=61234
read -r -a cmdline <<<"$exec_start"
cat >"$work/unit-run.sh" <<EOF
set -u
ip link set lo up
strace -f -qq -o "$work/strace.txt" -e trace=all -e signal=none \\
  setpriv --reuid=$uid --regid=$uid --clear-groups --inh-caps=-all,$caps --ambient-caps=$caps \\
    --bounding-set=-all,$caps --no-new-privs -- ${cmdline[*]} 2>"$work/unit-run.log" &
exporter=\$!
for i in \$(seq 1 120); do curl -sf -o /dev/null http://127.0.0.1:9812/-/ready && break; sleep 0.5; done
# The capabilities the exporter kept (its pid is setpriv's child under strace: find it by uid).
pid=\$(pgrep -o -u $uid -x sysscope)
grep -E '^(Uid|CapEff|CapPrm|CapBnd|CapAmb)' /proc/\$pid/status >"$work/unit-caps.txt"
cat /proc/\$pid/task/*/status | grep -E '^CapEff' | sort -u >"$work/unit-thread-caps.txt"
"$workload" join-cgroup "$cg_root/sysscope-release-unit-$$" getppid 12345 openat-missing 67
# Scrapes within collection.min_interval (1 s) of the last read of the maps share it: the first
# read after the child's exit has every call.
for i in \$(seq 1 10); do
  sleep 1.1
  curl -sf http://127.0.0.1:9812/metrics >"$work/unit-metrics.txt"
  grep -q 'cgroup="/sysscope-release-unit-$$".*syscall="getppid"' "$work/unit-metrics.txt" && break
done
kill -TERM \$pid
wait \$exporter
echo "exit=\$?" >>"$work/unit-caps.txt"
EOF
mkdir "$cg_root/sysscope-release-unit-$$" && cgroups_to_remove+=("$cg_root/sysscope-release-unit-$$")
timeout 180 unshare --net bash "$work/unit-run.sh" || fail "the unit's command did not run; $(tail -n 5 "$work/unit-run.log")"
grep -q 'exit=0' "$work/unit-caps.txt" || fail "the unit's command did not stop with status 0: $(tail -n 5 "$work/unit-run.log")"
grep -q "^Uid:[[:space:]]*$uid" "$work/unit-caps.txt" || fail "the exporter did not run as uid $uid"
# File paths are on by default and come from the kernel: nothing stays, in any thread. The unit
# grants neither capability of the /proc fallback, and the exporter says so at start.
grep -q '^CapEff:[[:space:]]*0000000000000000$' "$work/unit-caps.txt" &&
  grep -q '^CapPrm:[[:space:]]*0000000000000000$' "$work/unit-caps.txt" &&
  [ "$(cat "$work/unit-thread-caps.txt")" = "CapEff:	0000000000000000" ] ||
  fail "capabilities after start: $(tr '\n' ' ' <"$work/unit-caps.txt") $(tr '\n' ' ' <"$work/unit-thread-caps.txt")"
grep -q "proc_fallback=\"off for other users' processes (CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE not held at start)" \
  "$work/unit-run.log" || fail "the unit's exporter did not say that the /proc fallback is off: $(tail -n 5 "$work/unit-run.log")"
got=$(python3 "$work/count.py" "$work/unit-metrics.txt" "/sysscope-release-unit-$$")
[ "$got" = "12345 67 $revision" ] ||
  fail "unit's command: counted '$got' (getppid, openat ENOENT, build_info revision), expected '12345 67 $revision'"

# Every system call the exporter made is one the unit's SystemCallFilter allows.
filter=$(unit_value SystemCallFilter)
outside=$(systemd-analyze syscall-filter 2>/dev/null | python3 -c '
import re, sys
groups, current = {}, None
for line in sys.stdin:
    s = line.strip()
    if not s or s.startswith("#"):
        continue
    if not line.startswith(" ") and s.startswith("@"):
        current = groups.setdefault(s, set())
    elif current is not None:
        current.add(s)
def expand(name, seen):
    if not name.startswith("@"):
        return {name}
    if name in seen:
        return set()
    seen.add(name)
    return set().union(*(expand(m, seen) for m in groups.get(name, ())))
allowed = set().union(*(expand(n, set()) for n in sys.argv[1].split()))
used = set()
for line in open(sys.argv[2]):
    m = re.match(r"\d+\s+([a-z0-9_]+)\(", line)
    if m:
        used.add(m.group(1))
print(" ".join(sorted(used - allowed)))
' "$filter" "$work/strace.txt")
[ -z "$outside" ] || fail "system calls outside the unit's SystemCallFilter: $outside"

# 5. Remove: nothing of the package is left but its configuration; purge removes that too.
mapfile -t installed < <(dpkg -L sysscope | while read -r p; do [ -f "$p" ] && echo "$p"; done)
dpkg -r sysscope >>"$work/dpkg.log" 2>&1 || fail "dpkg -r failed"
left=$(for p in "${installed[@]}"; do [ -e "$p" ] && echo "$p"; done | tr '\n' ' ')
[ "$left" = "/etc/sysscope/config.toml " ] || fail "after dpkg -r, left: [$left]"
dpkg --purge sysscope >>"$work/dpkg.log" 2>&1 || fail "dpkg --purge failed"
[ ! -e /etc/sysscope ] || fail "after dpkg --purge, /etc/sysscope is left"

# 6. The .rpm: the same files, glibc 2.28 required, the config marked as such.
rpm_files=$(rpm -qpl "$rpm" 2>/dev/null | sort | tr '\n' ' ')
for p in /usr/bin/sysscope /usr/lib/systemd/system/sysscope.service /etc/sysscope/config.toml \
  /usr/share/man/man1/sysscope.1.gz /usr/share/bash-completion/completions/sysscope \
  /usr/share/zsh/site-functions/_sysscope /usr/share/fish/vendor_completions.d/sysscope.fish; do
  [[ " $rpm_files" == *" $p "* ]] || fail "the .rpm lacks $p"
done
rpm -qpc "$rpm" 2>/dev/null | grep -qx /etc/sysscope/config.toml || fail "the .rpm does not mark the config"
rpm -qpR "$rpm" 2>/dev/null | grep -q 'glibc >= 2.28' || fail "the .rpm does not require glibc >= 2.28"

# 7. The image, under podman as the DaemonSet runs it.
# podman refuses a run root longer than 50 characters, and its database remembers the one it
# was created with: a short path of this checkout's own.
runroot=/tmp/sysscope-podman-$(printf '%s' "$work" | sha256sum | cut -c 1-12)
store=(--root "$work/podman/storage" --runroot "$runroot" --storage-driver vfs)
export CONTAINERS_CONF="$work/containers.conf"
printf '[containers]\ndefault_ulimits = []\n' >"$CONTAINERS_CONF"
podman_() { podman "${store[@]}" "$@"; }
podman_ rmi -f "localhost/sysscope:$version" >/dev/null 2>&1
loaded=$(podman_ load -q -i "$image" 2>&1) || fail "podman load: $loaded"
ref="localhost/sysscope:$version"
podman_ image exists "$ref" || fail "podman load gave $loaded, not $ref"
entry=$(podman_ image inspect -f '{{json .Config.Entrypoint}} {{.Config.User}} {{.Architecture}}' "$ref")
[ "$entry" = '["/usr/bin/sysscope"] 0:0 amd64' ] || fail "image config: $entry"
container=sysscope-release-check-$$
podman_ create --name "$container" "$ref" >/dev/null || fail "podman create"
files=$(podman_ export "$container" | tar -t | grep -v '/$' | sort | tr '\n' ' ')
podman_ rm "$container" >/dev/null
for f in usr/bin/sysscope lib64/ld-linux-x86-64.so.2 lib/x86_64-linux-gnu/libc.so.6 etc/ssl/certs/ca-certificates.crt; do
  [[ " $files" == *" $f "* ]] || fail "the image lacks /$f: $files"
done
for f in $files; do
  case "$f" in
    usr/bin/sysscope | lib64/ld-linux-x86-64.so.2 | lib/x86_64-linux-gnu/*.so* | etc/ssl/certs/ca-certificates.crt) ;;
    *) fail "unexpected file in the image: /$f (no shell, nothing but the binary and glibc)" ;;
  esac
done
# The runtime's default seccomp profile predates CAP_BPF: allow bpf and perf_event_open, as a
# node's Localhost profile would (docs/kubernetes.md).
python3 - /usr/share/containers/seccomp.json "$work/seccomp.json" <<'EOF'
import json, sys
profile = json.load(open(sys.argv[1]))
ours = {"bpf", "perf_event_open"}
# The default gates them on CAP_SYS_ADMIN, with an explicit EPERM rule otherwise: drop both.
for rule in profile["syscalls"]:
    rule["names"] = [n for n in rule["names"] if n not in ours]
profile["syscalls"] = [r for r in profile["syscalls"] if r["names"]]
profile["syscalls"].append({"names": sorted(ours), "action": "SCMP_ACT_ALLOW"})
json.dump(profile, open(sys.argv[2], "w"))
EOF
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
podman_ run -d --name "$container" --runtime runc --cgroup-manager cgroupfs --network host \
  --pid host --user 0:0 --cap-drop all --cap-add BPF,PERFMON --read-only \
  --security-opt no-new-privileges --security-opt "seccomp=$work/seccomp.json" \
  -v /sys/fs/cgroup:/host/sys/fs/cgroup:ro -v /sys/kernel/btf:/sys/kernel/btf:ro \
  "$ref" "--web.listen-address=127.0.0.1:$port" >/dev/null || fail "podman run"
cpid=$(podman_ inspect -f '{{.State.Pid}}' "$container")
podman_logs() { podman_ logs "$container" >"$work/container.log" 2>&1; }
wait_ready "http://127.0.0.1:$port/-/ready" "$cpid" /dev/null || {
  podman_logs
  tail -n 20 "$work/container.log" >&2
  fail "the container did not become ready"
}
health=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/-/healthy")
[ "$health" = 200 ] || fail "/-/healthy answered $health"
for status in /proc/"$cpid"/task/*/status; do
  c=$(grep -E '^Cap(Eff|Prm)' "$status" | tr -s '\t ' ' ' | tr '\n' ' ')
  [ "$c" = "CapPrm: 0000000000000000 CapEff: 0000000000000000 " ] ||
    fail "the exporter in the container holds capabilities after start ($status: $c)"
done
count_in_fresh_cgroup image "http://127.0.0.1:$port/metrics"
podman_ stop -t 10 "$container" >/dev/null
code=$(podman_ inspect -f '{{.State.ExitCode}}' "$container")
podman_logs
[ "$code" = 0 ] || { tail -n 20 "$work/container.log" >&2; fail "the container exited with $code"; }
podman_ rm "$container" >/dev/null
container=""

echo "release: ok (amd64 tarball, .deb, .rpm and image: installed, run with the unit's and the DaemonSet's privileges, exact counts; newest glibc symbol GLIBC_$newest; $profile build ${build_s}s, $((SECONDS - started))s in all)"
