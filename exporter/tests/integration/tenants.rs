//! What a node's tenants can do to the syscall accounting, on the real kernel with the real
//! probes: an unprivileged process calling thousands of invalid syscall numbers, a cgroup
//! whose processes create more (process, syscall) keys than its quota, and four fork storms
//! that together fill the processes' share of the table. None may leave
//! another workload's calls uncounted, forge errors against real syscalls, or grow the
//! exposition without bound; the flooding workload's own calls stay counted in full.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Write},
    process::{Child, Stdio},
    time::Duration,
};

use crate::common::*;

/// A workload started in `cg` that waits for a line on its standard input before it ends.
struct Held {
    child: Child,
}

impl Held {
    fn start(cg: &TestCgroup, program: &str, args: &[&str]) -> Self {
        let child = cg
            .command(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        Self { child }
    }

    /// Waits for the workload's `ready` line.
    fn wait_ready(&mut self) {
        let stdout = self.child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the workload did not get ready");
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = stdin.write_all(b"\n");
        }
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

const NOBODY: &str = "65534";

/// Distinct values of the `syscall` label in an exposition.
fn syscall_labels(samples: &[Sample]) -> BTreeSet<String> {
    samples
        .iter()
        .filter_map(|s| s.labels.get("syscall").cloned())
        .collect()
}

/// The getppid calls counted for the workload in the victim's cgroup.
fn victim_calls(samples: &[Sample], victim_cg: &TestCgroup) -> f64 {
    sum(
        samples,
        "sysscope_syscalls_total",
        &[
            ("cgroup", victim_cg.rel.as_str()),
            ("comm", WORKLOAD_COMM),
            ("syscall", "getppid"),
        ],
    )
}

#[test]
fn invalid_syscall_numbers_from_an_unprivileged_tenant_blind_nobody() {
    if !require_root("invalid_syscall_numbers_from_an_unprivileged_tenant_blind_nobody") {
        return;
    }
    // Thousands of syscall keys: they would fill the tables of tests running beside it.
    let _alone = alone();
    // The default series budget and map sizes: the flood must fit in them.
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let flood_cg = TestCgroup::new("sysscope-test-nrflood");
    const FLOOD: u64 = 20_000;
    // 20,000 distinct invalid numbers, then numbers whose low 16 bits are read (0) and execve
    // (59): an error key that kept only those bits reported them as `read`/`execve` ENOSYS.
    let mut flood = Held::start(
        &flood_cg,
        "setpriv",
        &[
            "--reuid",
            NOBODY,
            "--regid",
            NOBODY,
            "--clear-groups",
            workload_bin(),
            "invalid-syscalls",
            "1000",
            &FLOOD.to_string(),
            "invalid-syscalls",
            "65536",
            "1",
            "invalid-syscalls",
            "65595",
            "1",
            "getppid",
            "1",
            "hold-children",
            "0",
            "0",
        ],
    );
    flood.wait_ready();

    // A victim beside it, in its own cgroup, while the flooding process is still alive.
    let victim_cg = TestCgroup::new("sysscope-test-victim");
    const VICTIM: u64 = 777;
    run_workload_joined(&victim_cg, &["getppid", &VICTIM.to_string()]);

    let text = exporter.scrape();
    let samples = parse_samples(&text);
    let flood_rel = flood_cg.rel.as_str();
    let in_flood = |syscall: &'static str| vec![("cgroup", flood_rel), ("syscall", syscall)];
    assert_eq!(
        victim_calls(&samples, &victim_cg),
        VICTIM as f64,
        "the victim's calls, beside the flood"
    );
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &in_flood("invalid")),
        (FLOOD + 2) as f64,
        "every invalid call is counted, as one syscall"
    );
    let mut enosys = in_flood("invalid");
    enosys.push(("errno", "ENOSYS"));
    assert_eq!(
        sum(&samples, "sysscope_syscall_errors_total", &enosys),
        (FLOOD + 2) as f64
    );
    let forged: Vec<_> = select(
        &samples,
        "sysscope_syscall_errors_total",
        &[("cgroup", flood_rel), ("errno", "ENOSYS")],
    )
    .into_iter()
    .filter(|s| s.labels["syscall"] != "invalid")
    .map(|s| s.labels["syscall"].clone())
    .collect();
    assert!(forged.is_empty(), "errors forged against {forged:?}");
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &in_flood("getppid")),
        1.0,
        "the flooding process's real calls are still its own"
    );
    // The exposition stays bounded: one syscall label per table entry at most, and nowhere
    // near the 28 MB such a flood once produced.
    let labels = syscall_labels(&samples);
    assert!(
        labels.len() <= sysscope_abi::MAX_SYSCALL_NR as usize,
        "{} distinct syscall labels",
        labels.len()
    );
    assert!(
        !labels.iter().any(|l| l
            .strip_prefix("syscall_")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n >= sysscope_abi::INVALID_NR)),
        "an out-of-range number has a label of its own"
    );
    assert!(text.len() < 4 << 20, "exposition of {} bytes", text.len());
    assert!(
        sum(
            &samples,
            "sysscope_syscalls_folded_total",
            &[("reason", "invalid_syscall_number")],
        ) >= (FLOOD + 2) as f64,
        "the folding is counted"
    );
}

#[test]
fn a_cgroup_over_its_slot_quota_folds_and_the_others_stay_exact() {
    if !require_root("a_cgroup_over_its_slot_quota_folds_and_the_others_stay_exact") {
        return;
    }
    // Thousands of syscall keys: they would fill the tables of tests running beside it.
    let _alone = alone();
    const QUOTA: usize = 64;
    let exporter = Exporter::start(
        &format!(
            "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n\
             max_syscall_entries_per_cgroup = {QUOTA}\n"
        ),
        &[],
    );
    // 30 live processes x 10 distinct syscalls: about 300 keys against a quota of 64.
    let flood_cg = TestCgroup::new("sysscope-test-quota");
    const CHILDREN: u64 = 30;
    const ROUNDS: u64 = 3;
    let mut flood = Held::start(
        &flood_cg,
        workload_bin(),
        &["hold-children", &CHILDREN.to_string(), &ROUNDS.to_string()],
    );
    flood.wait_ready();
    let victim_cg = TestCgroup::new("sysscope-test-quota-victim");
    const VICTIM: u64 = 777;
    run_workload_joined(&victim_cg, &["getppid", &VICTIM.to_string()]);

    let text = exporter.scrape();
    let samples = parse_samples(&text);
    let flood_rel = flood_cg.rel.as_str();
    let context: String = text
        .lines()
        .filter(|l| l.contains(flood_rel) && l.starts_with("sysscope_syscalls_total"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        victim_calls(&samples, &victim_cg),
        VICTIM as f64,
        "the victim keeps its own series"
    );
    // Every child's calls are counted, folded or not.
    for syscall in ["getuid", "getegid", "sched_yield"] {
        assert_eq!(
            sum(
                &samples,
                "sysscope_syscalls_total",
                &[("cgroup", flood_rel), ("syscall", syscall)],
            ),
            (CHILDREN * ROUNDS) as f64,
            "{syscall} in the flooding cgroup:\n{context}"
        );
    }
    let folded = sum(
        &samples,
        "sysscope_syscalls_total",
        &[
            ("cgroup", flood_rel),
            ("comm", "other"),
            ("syscall", "getuid"),
        ],
    );
    assert!(
        folded > 0.0,
        "past its quota the cgroup folds into comm=\"other\":\n{context}"
    );
    assert!(
        sum(
            &samples,
            "sysscope_syscalls_folded_total",
            &[("reason", "cgroup_shared_key")],
        ) > 0.0
    );
    // In the kernel the cgroup holds its quota, plus one shared key per syscall it folded.
    let held = dump_exporter_map(&exporter, "SYSCALL_SLOTS")
        .iter()
        .filter(|e| key_cgroup(&e["key"]) == flood_cg.id())
        .count();
    assert!(
        held <= QUOTA + 32,
        "the flooding cgroup holds {held} slots (quota {QUOTA})"
    );
    drop(flood);
    // Once the processes are gone their slots return: the cgroup's count drops to nothing.
    let drained = eventually(Duration::from_secs(20), || {
        exporter.scrape();
        let left = dump_exporter_map(&exporter, "SYSCALL_SLOTS")
            .iter()
            .filter(|e| key_cgroup(&e["key"]) == flood_cg.id())
            .count();
        (left == 0).then_some(())
    });
    assert!(drained.is_some(), "the cgroup's slots were not returned");
}

/// The cgroup id a `SYSCALL_SLOTS` key (as bpftool prints it) starts with.
fn key_cgroup(bytes: &serde_json::Value) -> u64 {
    le_u64(bytes)
}

/// A fork storm in a cgroup: a shell running `/bin/true` as fast as it can, until dropped.
struct Storm(Child);

impl Storm {
    fn start(cg: &TestCgroup) -> Self {
        let child = cg
            .command("sh")
            .args(["-c", "while :; do /bin/true; done"])
            .spawn()
            .expect("sh");
        Self(child)
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The value of a self-metric sample, 0 when absent.
fn map_metric(samples: &[Sample], name: &str, map: &str) -> f64 {
    sum(samples, name, &[("map", map)])
}

/// The bytes bpftool prints (a list of hex strings) as a little-endian `u64` (the first 8).
fn le_u64(bytes: &serde_json::Value) -> u64 {
    let bytes: Vec<u8> = bytes
        .as_array()
        .expect("bpftool prints bytes as a list")
        .iter()
        .map(|b| u8::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16).expect("hex"))
        .collect();
    u64::from_le_bytes(bytes[..8].try_into().unwrap())
}

/// The count a quota map (`CGROUP_TAKEN`, `CGROUP_RETURNED`) holds under `key`, 0 if none.
fn quota_count(exporter: &Exporter, map: &str, key: u64) -> u64 {
    dump_exporter_map(exporter, map)
        .iter()
        .find(|e| le_u64(&e["key"]) == key)
        .map_or(0, |e| le_u64(&e["value"]))
}

#[test]
fn four_fork_storms_do_not_blind_a_fifth_cgroup() {
    if !require_root("four_fork_storms_do_not_blind_a_fifth_cgroup") {
        return;
    }
    // Fills the whole syscall table: nothing else may run beside it.
    let _alone = alone();
    // The default map sizes and quota (16,384 slots, 4,096 per cgroup): four cgroups at their
    // quota would hold every slot. Nothing scrapes during the storm: the background refresh
    // (every 10 s) alone frees the slots of the processes that exited, as on a node.
    let exporter = Exporter::start(
        "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n",
        &[],
    );
    let capacity = 16_384u64;
    let own_share = sysscope_abi::own_share(capacity as u32) as u64;
    let storm_cgs: Vec<TestCgroup> = (0..4)
        .map(|i| TestCgroup::new(&format!("sysscope-test-storm{i}")))
        .collect();
    let storms: Vec<Storm> = storm_cgs.iter().map(Storm::start).collect();
    let quiet_cg = TestCgroup::new("sysscope-test-quiet");

    // Slots held: by the keys of processes (their count in the kernel), and in all (keys in
    // SYSCALL_SLOTS); the largest seen.
    let (mut fullest_own, mut fullest) = (0u64, 0u64);
    let observe = |own_max: &mut u64, all_max: &mut u64| {
        let key = sysscope_abi::quota_key::ALL_SLOTS;
        let own = quota_count(&exporter, "CGROUP_TAKEN", key).saturating_sub(quota_count(
            &exporter,
            "CGROUP_RETURNED",
            key,
        ));
        *own_max = (*own_max).max(own);
        *all_max = (*all_max).max(dump_exporter_map(&exporter, "SYSCALL_SLOTS").len() as u64);
        own
    };
    // The storms fill the table first, then the quiet cgroup starts its processes among them.
    let filled = eventually(Duration::from_secs(10), || {
        (observe(&mut fullest_own, &mut fullest) >= own_share).then_some(())
    });
    assert!(
        filled.is_some(),
        "the storms never filled the processes' share of the table \
         ({fullest_own} of {own_share} slots)"
    );
    const RUNS: u64 = 20;
    const CALLS: u64 = 500;
    let start = std::time::Instant::now();
    const STORM: Duration = Duration::from_secs(25);
    for run in 0..RUNS {
        // Spread over the storm's 25 s.
        let due = STORM * run as u32 / RUNS as u32;
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        run_workload_joined(&quiet_cg, &["getppid", &CALLS.to_string()]);
        if run % 4 == 3 {
            observe(&mut fullest_own, &mut fullest);
        }
    }
    if let Some(wait) = STORM.checked_sub(start.elapsed()) {
        std::thread::sleep(wait);
    }
    let during = parse_samples(&exporter.scrape());
    drop(storms);

    let samples = parse_samples(&exporter.scrape());
    let quiet = sum(
        &samples,
        "sysscope_syscalls_total",
        &[("cgroup", quiet_cg.rel.as_str()), ("syscall", "getppid")],
    );
    let own = sum(
        &samples,
        "sysscope_syscalls_total",
        &[
            ("cgroup", quiet_cg.rel.as_str()),
            ("comm", WORKLOAD_COMM),
            ("syscall", "getppid"),
        ],
    );
    let dropped = map_metric(
        &during,
        "sysscope_map_insert_failures_total",
        "SYSCALL_STATS",
    );
    let folded = sum(
        &during,
        "sysscope_syscalls_folded_total",
        &[("reason", "cgroup_shared_key")],
    );
    let storm_calls: f64 = storm_cgs
        .iter()
        .map(|cg| {
            sum(
                &during,
                "sysscope_syscalls_total",
                &[("cgroup", cg.rel.as_str()), ("syscall", "execve")],
            )
        })
        .sum();
    eprintln!(
        "table: {fullest} of {capacity} slots held at the fullest, {fullest_own} by processes' \
         keys (their share {own_share}); \
         quiet cgroup: {quiet} getppid ({own} under its own comm); storms: {storm_calls} execve; \
         folded calls {folded}, calls without a slot {dropped}"
    );
    assert_eq!(
        quiet,
        (RUNS * CALLS) as f64,
        "the quiet cgroup's getppid calls, beside four fork storms"
    );
    assert!(folded > 0.0, "the storms' keys folded");
}
