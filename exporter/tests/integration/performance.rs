//! What the performance work changed, against ground truth on the real kernel: exact counts
//! when calls are preempted and resumed on another CPU, slots of the statistics table handed
//! from exited processes to new ones, whole-map reads in batches, the probe cost metrics in
//! each `collection.probe_stats` mode, and the kernel memory of the maps.
//! (Costs themselves are measured by bench/, never asserted here.) `TEST_CONFIG` ends inside
//! its `[collection]` table, so collection keys are appended to it.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use crate::common::*;

/// More threads than CPUs make getppid in a loop: threads are preempted in the middle of calls
/// and complete them on whichever CPU they resume, where their cached slot's copy may not be
/// theirs yet. Every call must still be counted exactly once, with its duration.
#[test]
fn exact_counts_when_calls_are_preempted_and_resumed_elsewhere() {
    if !require_root("exact_counts_when_calls_are_preempted_and_resumed_elsewhere") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let cg = TestCgroup::new("sysscope-test-preempt");
    let threads = (std::thread::available_parallelism().map_or(2, |n| n.get()) * 2).to_string();
    let out = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&cg.dir)
        .args(["loop-getppid", "1", &threads])
        .output()
        .expect("spawn workload");
    assert!(out.status.success(), "workload failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let calls: f64 = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("calls="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no calls= in {stdout}"));
    assert!(calls > 0.0);

    let samples = parse_samples(&exporter.scrape());
    let labels = [("cgroup", cg.rel.as_str()), ("syscall", "getppid")];
    assert_eq!(sum(&samples, "sysscope_syscalls_total", &labels), calls);
    assert_eq!(
        sum(&samples, "sysscope_syscall_duration_seconds_count", &labels),
        calls
    );
}

/// A process moved to another cgroup by someone else while it waits in a syscall: the calls
/// before the move stay with the old cgroup, the ones after go to the new one.
#[test]
fn calls_follow_a_process_moved_to_another_cgroup() {
    if !require_root("calls_follow_a_process_moved_to_another_cgroup") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let first = TestCgroup::new("sysscope-test-move-a");
    let second = TestCgroup::new("sysscope-test-move-b");
    let mut child = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&first.dir)
        .args(["getppid", "120", "wait-stdin", "getppid", "80"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn workload");
    // Wait until the first 120 calls are counted, then move the process while it blocks.
    let a = [("cgroup", first.rel.as_str()), ("syscall", "getppid")];
    let counted = eventually(Duration::from_secs(10), || {
        let n = sum(
            &parse_samples(&exporter.scrape()),
            "sysscope_syscalls_total",
            &a,
        );
        (n == 120.0).then_some(())
    });
    assert!(counted.is_some(), "first 120 calls not counted");
    std::fs::write(
        second.dir.join("cgroup.procs"),
        child.id().to_string().as_bytes(),
    )
    .unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());

    let samples = parse_samples(&exporter.scrape());
    let b = [("cgroup", second.rel.as_str()), ("syscall", "getppid")];
    assert_eq!(sum(&samples, "sysscope_syscalls_total", &a), 120.0);
    assert_eq!(sum(&samples, "sysscope_syscalls_total", &b), 80.0);
}

/// Processes in fresh cgroups, one after the other, each making a different number of calls:
/// the slots of each are freed when it is reclaimed, and the next takes them from the free
/// stack (lowest first). Whatever a reused slot held before must not reach the new owner, and
/// nothing of the new owner's may be lost: every cgroup's count is exact.
#[test]
fn reused_slots_carry_nothing_over() {
    if !require_root("reused_slots_carry_nothing_over") {
        return;
    }
    // Reads only when scraped: a background read between a round's exit and the dump below
    // would reclaim its slots before they are looked at.
    let exporter = Exporter::start(
        "[collection]\nmin_interval = \"0s\"\nbackground_interval = \"1h\"\nseries_retention = \"1h\"\n",
        &[],
    );
    let mut rounds = Vec::new();
    let mut reused = 0;
    let mut previous: Vec<u32> = Vec::new();
    for i in 0..12 {
        let cg = TestCgroup::new(&format!("sysscope-test-reuse-{i}"));
        let calls = 100 + 37 * i;
        run_workload(&cg, &["getppid", &calls.to_string()]);
        // The process has exited; its slots are held until the exporter's next read.
        let slots = slots_of_cgroup(&exporter, cg.id());
        assert!(!slots.is_empty(), "round {i}: no slot in SYSCALL_SLOTS");
        reused += slots.iter().filter(|s| previous.contains(s)).count();
        let labels = [("cgroup", cg.rel.as_str()), ("syscall", "getppid")];
        let counted = sum(
            &parse_samples(&exporter.scrape()),
            "sysscope_syscalls_total",
            &labels,
        );
        assert_eq!(counted, calls as f64, "round {i}");
        // Reclaimed once read: the slots are free again.
        let freed = eventually(Duration::from_secs(10), || {
            exporter.scrape();
            slots_of_cgroup(&exporter, cg.id()).is_empty().then_some(())
        });
        assert!(
            freed.is_some(),
            "round {i}: slots not freed after the process exited"
        );
        previous = slots;
        rounds.push((cg, calls));
    }
    assert!(
        reused > 0,
        "no slot was handed to a later process: the test proved nothing"
    );
    // Later reads change none of the finished cgroups.
    let samples = parse_samples(&exporter.scrape());
    for (cg, calls) in &rounds {
        let labels = [("cgroup", cg.rel.as_str()), ("syscall", "getppid")];
        assert_eq!(
            sum(&samples, "sysscope_syscalls_total", &labels),
            *calls as f64,
            "{}",
            cg.rel
        );
    }
}

/// Slots in the exporter's `SYSCALL_SLOTS` whose key is of cgroup `id` (read with bpftool).
fn slots_of_cgroup(exporter: &Exporter, id: u64) -> Vec<u32> {
    let bytes = |v: &serde_json::Value| -> Vec<u8> {
        v.as_array()
            .expect("bytes")
            .iter()
            .map(|b| u8::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16).unwrap())
            .collect()
    };
    dump_exporter_map(exporter, "SYSCALL_SLOTS")
        .iter()
        .filter(|e| bytes(&e["key"])[..8] == id.to_le_bytes())
        .map(|e| u32::from_le_bytes(bytes(&e["value"])[..4].try_into().unwrap()))
        .collect()
}

/// More kernel entries than one batch read returns: every one of them must be exported.
/// The entries are written into the running exporter's map by `sysscope-bench fill`.
#[test]
fn every_entry_is_read_when_the_map_spans_several_batches() {
    if !require_root("every_entry_is_read_when_the_map_spans_several_batches") {
        return;
    }
    let config = format!("{TEST_CONFIG}[limits]\nmax_series = 1000000\n");
    let exporter = Exporter::start(&config, &[]);
    let entries = sysscope::kernel::bpf_batch::CHUNK * 2 + 321;
    let mut fill = Command::new(env!("CARGO_BIN_EXE_sysscope-bench"))
        .args(["fill", "--pid", &exporter.child.id().to_string()])
        .args(["--entries", &entries.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sysscope-bench");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(fill.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("ready"), "{line}");
    let prefix = format!("/sysscope-bench-{}/", fill.id());
    let samples = parse_samples(&exporter.scrape());
    let series: Vec<_> = samples
        .iter()
        .filter(|s| {
            s.name == "sysscope_syscalls_total"
                && s.labels
                    .get("cgroup")
                    .is_some_and(|c| c.starts_with(&prefix))
        })
        .collect();
    drop(fill.stdin.take());
    assert!(fill.wait().unwrap().success());
    assert_eq!(series.len(), entries, "series of the synthetic entries");
    assert!(series.iter().all(|s| s.value == 1.0));
}

fn program_runs(samples: &[Sample], program: &str) -> (f64, f64) {
    (
        sum(
            samples,
            "sysscope_probe_runs_total",
            &[("program", program)],
        ),
        sum(
            samples,
            "sysscope_probe_run_seconds_total",
            &[("program", program)],
        ),
    )
}

/// "always": the counters are the kernel's own, so after N calls of a child the runs of
/// sys_enter grew by at least N, and agree with what bpftool reads from the kernel.
#[test]
fn probe_stats_always_are_the_kernels_counters() {
    if !require_root("probe_stats_always_are_the_kernels_counters") {
        return;
    }
    let config = format!("{TEST_CONFIG}probe_stats = \"always\"\n");
    let exporter = Exporter::start(&config, &[]);
    let before = program_runs(&parse_samples(&exporter.scrape()), "sys_enter");
    let cg = TestCgroup::new("sysscope-test-stats");
    run_workload(&cg, &["getppid", "5000"]);
    let samples = parse_samples(&exporter.scrape());
    let after = program_runs(&samples, "sys_enter");
    assert!(after.0 - before.0 >= 5000.0, "{before:?} -> {after:?}");
    assert!(
        after.1 > before.1,
        "run time did not grow: {before:?} -> {after:?}"
    );
    assert_eq!(
        sum(&samples, "sysscope_probe_stats_coverage_ratio", &[]),
        1.0
    );
    // The same program as bpftool sees it, read just after the scrape: never fewer runs.
    let ids = bpf_program_ids_of(exporter.child.id());
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .expect("bpftool");
    let progs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let kernel_runs = progs
        .iter()
        .find(|p| p["name"] == "sys_enter" && ids.contains(&p["id"].as_u64().unwrap_or(0)))
        .and_then(|p| p["run_cnt"].as_f64())
        .expect("sys_enter in bpftool's list");
    assert!(
        kernel_runs >= after.0,
        "bpftool {kernel_runs} < exported {}",
        after.0
    );
}

/// "sampled" (the default): statistics are on only for short windows, the counters are
/// estimates that start within the first window, and the coverage says how much was measured.
/// "off": no counters at all.
#[test]
fn probe_stats_sampled_and_off() {
    if !require_root("probe_stats_sampled_and_off") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let sampled = eventually(Duration::from_secs(10), || {
        let samples = parse_samples(&exporter.scrape());
        let (runs, secs) = program_runs(&samples, "sys_enter");
        (runs > 0.0 && secs > 0.0)
            .then(|| sum(&samples, "sysscope_probe_stats_coverage_ratio", &[]))
    });
    let coverage = sampled.expect("no sampled run counts after 10 s");
    assert!(coverage > 0.0 && coverage < 1.0, "coverage {coverage}");

    let config = format!("{TEST_CONFIG}probe_stats = \"off\"\n");
    let off = Exporter::start(&config, &[]);
    let samples = parse_samples(&off.scrape());
    assert!(select(&samples, "sysscope_probe_runs_total", &[]).is_empty());
    assert_eq!(
        sum(&samples, "sysscope_probe_stats_coverage_ratio", &[]),
        0.0
    );
}

/// Without CAP_SYS_ADMIN, as the Kubernetes DaemonSet runs it (CAP_BPF and CAP_PERFMON only,
/// no_new_privs), sysscope cannot switch the kernel's run-time statistics on: the cost counters
/// stay 0 and the coverage ratio says they are off. With the node's `kernel.bpf_stats_enabled
/// = 1` they count, sampled by default and exact with "always" (the sysctl is restored after).
#[test]
fn probe_stats_without_cap_sys_admin_come_from_the_nodes_sysctl() {
    if !require_root("probe_stats_without_cap_sys_admin_come_from_the_nodes_sysctl") {
        return;
    }
    const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
    struct Restore(String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write(SYSCTL, &self.0);
        }
    }
    let _restore = Restore(std::fs::read_to_string(SYSCTL).expect("kernel.bpf_stats_enabled"));
    let daemonset = [
        "setpriv",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all,+bpf,+perfmon",
    ];
    let start = |config: &str| {
        let mut e = Exporter::spawn_wrapped(free_port(), config, &[], &[], &daemonset);
        e.wait_ready(Duration::from_secs(30));
        e
    };
    let stats = |e: &Exporter| {
        let samples = parse_samples(&e.scrape());
        let (runs, _) = program_runs(&samples, "sys_enter");
        let coverage = sum(&samples, "sysscope_probe_stats_coverage_ratio", &[]);
        (runs, coverage)
    };

    std::fs::write(SYSCTL, "0").unwrap();
    let off = start(TEST_CONFIG);
    // Past the first sampling window the helper would have opened.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(stats(&off), (0.0, 0.0), "statistics without CAP_SYS_ADMIN");
    drop(off);

    std::fs::write(SYSCTL, "1").unwrap();
    let sampled = start(TEST_CONFIG);
    let always = start(&format!("{TEST_CONFIG}probe_stats = \"always\"\n"));
    let cg = TestCgroup::new("sysscope-test-stats-sysctl");
    let measured = eventually(Duration::from_secs(15), || {
        run_workload(&cg, &["getppid", "2000"]);
        let (runs, coverage) = stats(&sampled);
        (runs > 0.0 && coverage > 0.0).then_some(coverage)
    });
    let coverage = measured.expect("no sampled run counts from the node's statistics");
    assert!(coverage < 1.0, "sampled coverage {coverage}");
    let before = stats(&always);
    assert_eq!(before.1, 1.0, "always: exact counters");
    run_workload(&cg, &["getppid", "5000"]);
    let after = stats(&always);
    assert!(after.0 - before.0 >= 5000.0, "{before:?} -> {after:?}");
}

/// The exported kernel memory of each map is what the kernel accounts for it (bpftool's
/// bytes_memlock of the map the exporter holds).
#[test]
fn map_memory_matches_the_kernels_account() {
    if !require_root("map_memory_matches_the_kernels_account") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let samples = parse_samples(&exporter.scrape());
    let exported = sum(
        &samples,
        "sysscope_map_memory_bytes",
        &[("map", "SYSCALL_STATS")],
    );
    assert!(exported > 0.0, "no memory reported for SYSCALL_STATS");
    let pid = exporter.child.id();
    let mut ids = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        if let Ok(info) = std::fs::read_to_string(fd.path()) {
            ids.extend(
                info.lines()
                    .filter_map(|l| l.strip_prefix("map_id:"))
                    .filter_map(|v| v.trim().parse::<u64>().ok()),
            );
        }
    }
    let out = Command::new("bpftool")
        .args(["-j", "map", "show"])
        .output()
        .expect("bpftool");
    let maps: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let kernel: f64 = maps
        .iter()
        .filter(|m| m["name"] == "SYSCALL_STATS" && ids.contains(&m["id"].as_u64().unwrap_or(0)))
        .filter_map(|m| m["bytes_memlock"].as_f64())
        .sum();
    assert_eq!(exported, kernel);
}
