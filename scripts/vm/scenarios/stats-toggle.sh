# Not part of the matrix: a stress run to use by hand when the guest hangs. For 60 s, while the
# exporter runs with its defaults, a second exporter with collection.probe_stats = "always" is
# started and stopped every 4 s (each start and stop switches the kernel's BPF statistics key,
# which patches every jump-label site of that key) and `sysscope summary` attaches, counts a
# child exactly and detaches in a loop. Every summary must count the child's calls exactly and
# every scrape must answer. Under multi-threaded TCG on amd64 (SYSSCOPE_VM_ACCEL=tcg) the guest
# hangs in soft lockups within seconds (see the comment in run.sh); with the default it passes.
echo 1 > /proc/sys/kernel/softlockup_all_cpu_backtrace
base=http://127.0.0.1:9100
/bin/sysscope --web.listen-address 127.0.0.1:9100 > /tmp/exporter.log 2>&1 &
i=0
until wget -q -O /dev/null $base/-/ready 2>/dev/null || [ $i -ge 120 ]; do sleep 1; i=$((i + 1)); done
printf '[collection]\nprobe_stats = "always"\n' > /tmp/always.toml
(
  while true; do
    /bin/sysscope --config.file /tmp/always.toml --web.listen-address 127.0.0.1:9200 > /dev/null 2>&1 &
    p=$!
    sleep 4
    kill $p; wait $p
  done
) &
toggler=$!
runs=0 exact=0 scrapes=0
end=$(( $(cut -d. -f1 /proc/uptime) + 60 ))
while [ "$(cut -d. -f1 /proc/uptime)" -lt $end ]; do
  runs=$((runs + 1))
  /bin/sysscope summary -q --json -- /bin/sysscope-workload getppid 2000 > /tmp/s.json 2> /tmp/s.err
  tr -d ' \n' < /tmp/s.json | grep -q '"calls":2000,' && exact=$((exact + 1))
  wget -q -O /dev/null $base/metrics && scrapes=$((scrapes + 1))
done
kill $toggler
check exact_summaries "$exact" "$runs"
check scrapes_answered "$scrapes" "$runs"
