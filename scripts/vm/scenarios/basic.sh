# Issue: kernels and architectures. The same checks on every kernel and architecture of the
# matrix (scripts/checks/vm-matrix.sh): --config.check passes; the exporter with its defaults
# counts a child in a fresh cgroup exactly (getppid, openat failing with ENOENT) and reports
# its sleeps as blocked time (the time split); an O_DIRECT dd of a known size to a loop device
# is counted within 1%, and charged to the writer's cgroup; a slow pipe read arrives at
# /api/v1/slow-calls with its file path (the descriptor argument read from the registers);
# `sysscope summary` reports the child's calls; every documented switch loads
# (/etc/sysscope-vm/switches.txt: --config.check reports every enabled collector up).
calls=12345
errors=777
port=9812
base=http://127.0.0.1:$port

# Sums the samples of metric $1 whose labels contain every string in $2.. (ex. 'cgroup="/vm"').
metric_sum() {
  name=$1; shift
  wget -q -O - "$base/metrics" 2>/dev/null | awk -v name="$name" -v want="$*" '
    BEGIN { n = split(want, w, " ") }
    index($0, name "{") == 1 || $0 ~ ("^" name " ") {
      ok = 1; for (i = 1; i <= n; i++) if (index($0, w[i]) == 0) ok = 0
      if (ok) s += $NF
    }
    END { printf "%.0f\n", s }'
}

# The same sum in nanoseconds, for metrics in seconds.
metric_sum_ns() {
  name=$1; shift
  wget -q -O - "$base/metrics" 2>/dev/null | awk -v name="$name" -v want="$*" '
    BEGIN { n = split(want, w, " ") }
    index($0, name "{") == 1 || $0 ~ ("^" name " ") {
      ok = 1; for (i = 1; i <= n; i++) if (index($0, w[i]) == 0) ok = 0
      if (ok) s += $NF
    }
    END { printf "%.0f\n", s * 1e9 }'
}

# Polls metric_sum until it equals $1 (or the deadline passes); prints the last value. The
# deadline is short for a metric whose collector is down (its value will not change).
wait_for_value() {
  want=$1; shift
  case "$1" in
    sysscope_syscall*) up=$syscalls_up ;;
    sysscope_block_io*) up=$block_io_up ;;
    *) up=1 ;;
  esac
  limit=60; [ "$up" = 1 ] || limit=2
  v=0; i=0
  while [ $i -lt $limit ]; do
    v=$(metric_sum "$@")
    [ "$v" = "$want" ] && break
    sleep 1; i=$((i + 1))
  done
  echo "$v"
}

# 1. --config.check
if sysscope --config.check > /tmp/config-check.log 2>&1; then
  report config_check PASS "rc=0"
else
  report config_check FAIL "rc=$?"
fi
sed 's/^/  config.check: /' /tmp/config-check.log | tail -n 40

# 2. The exporter with its defaults.
sysscope --web.listen-address 127.0.0.1:$port > /tmp/exporter.log 2>&1 &
exporter=$!
i=0
while [ $i -lt 120 ]; do
  wget -q -O /dev/null "$base/-/ready" 2>/dev/null && break
  kill -0 $exporter 2>/dev/null || break
  sleep 1; i=$((i + 1))
done
if wget -q -O /dev/null "$base/-/ready" 2>/dev/null; then
  report exporter_ready PASS "after ${i}s"
else
  report exporter_ready FAIL "not ready after ${i}s"
  tail -n 40 /tmp/exporter.log
  poweroff -f
fi
grep -i "warn\|error" /tmp/exporter.log | head -n 20 | sed 's/^/  exporter: /'
syscalls_up=$(metric_sum sysscope_collector_up 'collector="syscalls"')
block_io_up=$(metric_sum sysscope_collector_up 'collector="block_io"')

# 3. Exact counts for a child in a fresh cgroup.
mkdir -p /sys/fs/cgroup/vmtest
sysscope-workload join-cgroup /sys/fs/cgroup/vmtest getppid "$calls" openat-missing "$errors"
got=$(wait_for_value "$calls" sysscope_syscalls_total 'cgroup="/vmtest"' 'syscall="getppid"')
[ "$got" = "$calls" ] && report getppid_count PASS "$got" || report getppid_count FAIL "want $calls got $got"
got=$(wait_for_value "$errors" sysscope_syscall_errors_total 'cgroup="/vmtest"' 'syscall="openat"' 'errno="ENOENT"')
[ "$got" = "$errors" ] && report enoent_count PASS "$got" || report enoent_count FAIL "want $errors got $got"

# 3b. The time split: sleeps of a known total are blocked time. The probes see the switch
# out a little after the timer is armed (allowed: 1 ms a call, generous for an emulated CPU)
# and the wakeup before the child's clock does, so the blocked time lies between what the
# child asked for, less that allowance, and what it measured around its calls. A stretch
# whose wakeup the probes did not see counts as unknown, never blocked: it may be a little.
sleeps=20 sleep_ms=50
mkdir -p /sys/fs/cgroup/vmsleep
slept=$(sysscope-workload join-cgroup /sys/fs/cgroup/vmsleep sleep $sleeps $sleep_ms 2>&1 | sed -n 's/^slept_ns=//p')
got=$(wait_for_value "$sleeps" sysscope_syscalls_total 'cgroup="/vmsleep"' 'syscall="nanosleep"')
blocked=$(metric_sum_ns sysscope_syscall_time_seconds_total 'cgroup="/vmsleep"' 'syscall="nanosleep"' 'state="blocked"')
unknown=$(metric_sum_ns sysscope_syscall_time_seconds_total 'cgroup="/vmsleep"' 'syscall="nanosleep"' 'state="unknown"')
asked=$((sleeps * sleep_ms * 1000000))
detail="blocked ${blocked}ns + unknown ${unknown}ns of $got sleeps; asked ${asked}ns, child measured ${slept:-?}ns"
if [ "$got" = "$sleeps" ] && [ -n "$slept" ] \
   && [ $((blocked + unknown)) -ge $((asked - sleeps * 1000000)) ] \
   && [ $((blocked + unknown)) -le "$slept" ] && [ $((unknown * 20)) -le "$asked" ]; then
  report time_split_blocked PASS "$detail"
else
  report time_split_blocked FAIL "$detail"
fi

# 4. Block I/O: an O_DIRECT dd of a known size to a loop device.
dd if=/dev/zero of=/tmp/disk.img bs=1M count=40 2>/dev/null
if loop=$(losetup -f) && losetup "$loop" /tmp/disk.img; then
  dev=${loop#/dev/}
  # With the io controller on, the bio carries the writer's cgroup even when a kernel thread
  # (the loop worker) issues the request.
  echo +io > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
  mkdir -p /sys/fs/cgroup/vmblk
  bytes=$((32 * 1024 * 1024))
  before=$(metric_sum sysscope_block_io_bytes_total "device=\"$dev\"" 'op="write"')
  (echo 0 > /sys/fs/cgroup/vmblk/cgroup.procs && exec dd if=/dev/zero of="$loop" bs=1M count=32 oflag=direct 2>/dev/null)
  want=$((before + bytes))
  after=$(wait_for_value "$want" sysscope_block_io_bytes_total "device=\"$dev\"" 'op="write"')
  delta=$((after - before))
  if awk -v d="$delta" -v b="$bytes" 'BEGIN { e = d - b; if (e < 0) e = -e; exit !(e <= b / 100) }'; then
    report block_io_bytes PASS "$delta of $bytes bytes on $dev"
  else
    report block_io_bytes FAIL "$delta of $bytes bytes on $dev"
  fi
  mine=$(metric_sum sysscope_block_io_bytes_total "device=\"$dev\"" 'op="write"' 'cgroup="/vmblk"')
  if awk -v d="$mine" -v b="$bytes" 'BEGIN { e = d - b; if (e < 0) e = -e; exit !(e <= b / 100) }'; then
    report block_io_cgroup PASS "$mine of $bytes bytes attributed to cgroup /vmblk"
  else
    report block_io_cgroup FAIL "$mine of $bytes bytes attributed to cgroup /vmblk"
  fi
  wget -q -O - "$base/metrics" | grep "^sysscope_block_io_bytes_total.*$dev" | sed 's/^/  /'
else
  report block_io_bytes FAIL "no loop device"
fi

# 5. One slow pipe read arrives at /api/v1/slow-calls with its file.path.
# The child stays alive a moment after the read: the path is resolved from its descriptor.
sysscope-workload join-cgroup /sys/fs/cgroup/vmtest slow-pipe-read-timed 1 60 sleep 1 1500 > /dev/null &
slow=$!
wait $slow
found=""
i=0
limit=30; [ "$syscalls_up" = 1 ] || limit=2
while [ $i -lt $limit ]; do
  found=$(wget -q -O - "$base/api/v1/slow-calls" | tr -d ' \n' | tr '{' '\n' | grep "\"process.pid\":$slow[,}]" | head -n 1)
  [ -n "$found" ] && break
  sleep 1; i=$((i + 1))
done
if [ -n "$found" ]; then
  report slow_call PASS "pid $slow"
  if echo "$found" | grep -q '"file.path":"pipe:\['; then
    report slow_call_file_path PASS "$(echo "$found" | grep -o '"file.path":"[^"]*"')"
  else
    report slow_call_file_path FAIL "$found"
  fi
else
  report slow_call FAIL "no slow call of pid $slow"
  wget -q -O - "$base/api/v1/slow-calls" | head -c 2000; echo
fi

# 6. sysscope summary of the same child. The dynamic loader's own failed opens are counted too,
# so a run without the workload's ENOENT calls gives the baseline.
summary_of() { # $1: openat-missing count; prints "rc getppid_calls openat_ENOENT"
  sysscope summary -q --json -- sysscope-workload getppid "$calls" openat-missing "$1" > /tmp/summary.json 2> /tmp/summary.err
  rc=$?
  # --json rows have sorted keys ("calls", "errnos", ..., "syscall", "usecs_per_call"): one
  # record per row once split at "usecs_per_call".
  rows=$(tr -d ' \n' < /tmp/summary.json | awk '{ gsub(/"usecs_per_call"/, "\n"); print }')
  c=$(echo "$rows" | grep '"syscall":"getppid"' | grep -o '"calls":[0-9]*' | head -n 1 | cut -d: -f2)
  e=$(echo "$rows" | grep '"syscall":"openat"' | grep -o '"ENOENT":[0-9]*' | head -n 1 | cut -d: -f2)
  echo "$rc ${c:-none} ${e:-0}"
}
set -- $(summary_of 0)
rc0=$1 c0=$2 e0=$3
set -- $(summary_of "$errors")
rc1=$1 c1=$2 e1=$3
if [ "$rc0" = 0 ] && [ "$rc1" = 0 ] && [ "$c0" = "$calls" ] && [ "$c1" = "$calls" ] && [ $((e1 - e0)) = "$errors" ]; then
  report summary PASS "getppid=$c1 ENOENT=$e1-$e0"
else
  report summary FAIL "rc=$rc0/$rc1 getppid=$c0/$c1 ENOENT=$e1-$e0 (want getppid=$calls ENOENT difference $errors)"
  head -c 3000 /tmp/summary.json; echo; tail -n 20 /tmp/summary.err
fi

kill $exporter 2>/dev/null
wait $exporter 2>/dev/null

# 7. Every documented switch loads: --config.check with each `kernel` case of switches.txt
# reports every enabled collector up (gpu may be down without a failure: this guest has no
# NVIDIA GPU) and every program attached.
uptime_ms() { awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime; }
walk_started=$(uptime_ms)
grep -v '^#' /etc/sysscope-vm/switches.txt | while read -r case where settings; do
  [ "$where" = kernel ] || continue
  echo "$settings" | tr ';' '\n' | sed 's/^ *//' > /tmp/switch.toml
  started=$(uptime_ms)
  sysscope --config.file /tmp/switch.toml --config.check > /tmp/switch.log 2>&1
  rc=$?
  took="$(( $(uptime_ms) - started )) ms"
  want=""
  for c in syscalls block_io cpu; do
    grep -q "^ *$c\.enabled *= *false" /tmp/switch.toml || want="$want $c"
  done
  wrong=""
  [ $rc = 0 ] || wrong="$wrong rc=$rc"
  grep -q '^configuration OK: yes$' /tmp/switch.log || wrong="$wrong not-OK"
  for c in $want; do
    grep -q "^collector $c: up$" /tmp/switch.log || wrong="$wrong $c-not-up"
  done
  wrong="$wrong$(grep '^FAILED ' /tmp/switch.log | awk '{printf " %s-failed", $2}')"
  wrong="$wrong$(grep '^collector [a-z_]* failed:' /tmp/switch.log | awk '{printf " %s-failed", $2}')"
  if [ -z "$wrong" ]; then
    report "switch:$case" PASS "$(grep -c '^attached ' /tmp/switch.log) programs attached;$want up ($took)"
  else
    report "switch:$case" FAIL "${wrong# } ($settings; $took)"
    grep -E '^(FAILED|collector)' /tmp/switch.log | head -c 600 | sed 's/^/  switch: /'
  fi
done
echo "VMINFO switch walk: $(( $(uptime_ms) - walk_started )) ms"
