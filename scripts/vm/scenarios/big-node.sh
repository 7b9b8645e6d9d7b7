# Issue: kernel memory must not grow with the CPU count. Booted with many possible CPUs
# (--smp 2,maxcpus=224: per-CPU maps are allocated for every possible CPU), the exporter with
# its defaults must load everything, count a child exactly, and keep its kernel maps within
# 64 MiB (its own sysscope_map_memory_bytes).
echo "possible CPUs: $(cat /sys/devices/system/cpu/possible)"
/bin/sysscope --config.check > /tmp/check.log 2>&1
check config_check "$?" 0
/bin/sysscope --web.listen-address 127.0.0.1:9812 > /tmp/exporter.log 2>&1 &
i=0
until wget -q -O /dev/null http://127.0.0.1:9812/-/ready 2>/dev/null || [ $i -ge 120 ]; do sleep 1; i=$((i + 1)); done
mkdir /sys/fs/cgroup/vmtest
/bin/sysscope-workload join-cgroup /sys/fs/cgroup/vmtest getppid 12345 openat-missing 777
# A process that exited just before a read is named from its exit record one read later.
getppid="" i=0
while [ "$getppid" != 12345 ] && [ $i -lt 15 ]; do
  sleep 1; i=$((i + 1))
  wget -q -O /tmp/metrics http://127.0.0.1:9812/metrics
  getppid=$(grep '^sysscope_syscalls_total{cgroup="/vmtest",comm="sysscope-worklo",syscall="getppid"}' /tmp/metrics | awk '{print $2}')
done
[ "$getppid" = 12345 ] || grep 'vmtest' /tmp/metrics | grep -v _bucket | head -10
check getppid_exact "$getppid" 12345
enoent=$(grep '^sysscope_syscall_errors_total{cgroup="/vmtest",comm="sysscope-worklo",syscall="openat",errno="ENOENT"}' /tmp/metrics | awk '{print $2}')
check enoent_exact "$enoent" 777
mib=$(awk '/^sysscope_map_memory_bytes/ {s += $2} END {printf "%d", s / 1048576}' /tmp/metrics)
echo "kernel map memory: $mib MiB"
check map_memory_within_64_mib "$([ "$mib" -le 64 ] && echo yes || echo "no ($mib MiB)")" yes
up=$(grep -c '^sysscope_collector_up{collector="syscalls"} 1' /tmp/metrics)
check syscalls_collector_up "$up" 1
if [ "$up" != 1 ]; then grep -iE 'error|warn' /tmp/exporter.log | head -5; fi
