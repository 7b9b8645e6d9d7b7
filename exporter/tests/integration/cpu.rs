//! The CPU collector against ground truth on the real machine: a busy loop pinned to one CPU
//! must show as user time on that CPU, in agreement with /proc/stat deltas the test takes
//! itself, and a busy child in a fresh cgroup must accrue the CPU time its own rusage says.

use std::{collections::BTreeMap, os::unix::process::CommandExt, process::Command};

use crate::common::*;

const MODES: [&str; 8] = [
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
];

/// The test's own reading of /proc/stat: CPU number -> ticks of the 8 modes above (guest
/// columns left out: they are included in user and nice).
fn proc_stat() -> BTreeMap<u32, [u64; 8]> {
    let text = std::fs::read_to_string("/proc/stat").unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let name = fields.next().unwrap_or("");
        let Some(n) = name.strip_prefix("cpu").and_then(|n| n.parse().ok()) else {
            continue;
        };
        let mut ticks = [0u64; 8];
        for (t, f) in ticks.iter_mut().zip(fields) {
            *t = f.parse().unwrap();
        }
        out.insert(n, ticks);
    }
    out
}

fn delta(a: &[u64; 8], b: &[u64; 8]) -> [i64; 8] {
    let mut d = [0i64; 8];
    for i in 0..8 {
        d[i] = b[i] as i64 - a[i] as i64;
    }
    d
}

/// Only scrapes refresh: the background tick (which fires once at start) comes back after an
/// hour, so sysscope's interval is exactly the one between the test's two scrapes.
const SCRAPE_ONLY: &str = "[collection]\nmin_interval = \"0s\"\nbackground_interval = \"1h\"\nseries_retention = \"1h\"\n";

#[test]
fn pinned_busy_loop_is_user_time_of_its_cpu_and_agrees_with_proc_stat() {
    if !require_root("pinned_busy_loop_is_user_time_of_its_cpu_and_agrees_with_proc_stat") {
        return;
    }
    let exporter = Exporter::start(SCRAPE_ONLY, &[]);
    exporter.scrape();
    // Let the start-up background refresh finish before the measured window opens.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let cpu = *proc_stat().keys().last().unwrap();

    let s0 = proc_stat();
    exporter.scrape(); // sysscope's reading at the start of its interval
    let s0_after = proc_stat();
    // At nice -20, so that other work on this shared machine cannot crowd the loop off its
    // CPU (nice -20 counts as user time; only positive nice counts as nice).
    let mut cmd = Command::new(workload_bin());
    cmd.args(["pin-cpu", &cpu.to_string(), "spin", "3000"]);
    // SAFETY: setpriority is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setpriority(libc::PRIO_PROCESS, 0, -20) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = cmd.status().expect("spawn spin");
    assert!(status.success());
    let s1 = proc_stat();
    let text = exporter.scrape(); // ... and at its end
    let s1_after = proc_stat();

    let samples = parse_samples(&text);
    let ratio = |c: u32, mode: &str| {
        let c = c.to_string();
        let found = select(
            &samples,
            "sysscope_cpu_utilization_ratio",
            &[("cpu", &c), ("mode", mode)],
        );
        assert_eq!(found.len(), 1, "cpu {c} mode {mode}: {found:?}");
        found[0].value
    };
    for c in s1.keys() {
        let total: f64 = MODES.iter().map(|m| ratio(*c, m)).sum();
        assert!((total - 1.0).abs() < 1e-6, "cpu {c}: modes sum to {total}");
    }
    let user = ratio(cpu, "user");
    eprintln!("cpu {cpu}: user ratio {user} over sysscope's interval");
    assert!(
        user > 0.8,
        "cpu {cpu} user ratio {user} with a loop pinned to it"
    );

    // sysscope read /proc/stat once between s0 and s0_after and once between s1 and
    // s1_after. The counters only grow, so its ticks in each mode lie between the inner
    // (s0_after..s1) and outer (s0..s1_after) deltas, and each ratio between
    // inner_mode / outer_total and outer_mode / inner_total. The only slack is one tick per
    // read for idle and iowait, which tickless kernels may move back slightly (so 2 ticks per
    // mode, 4 on the total). The bracket is
    // as wide as the ticks the two scrapes took (a few ms of 3 s), so this is a close check.
    for (c, a) in &s0 {
        let (Some(a2), Some(b), Some(b2)) = (s0_after.get(c), s1.get(c), s1_after.get(c)) else {
            continue; // went offline meanwhile
        };
        let inner = delta(a2, b);
        let outer = delta(a, b2);
        let inner_total: i64 = inner.iter().sum();
        let outer_total: i64 = outer.iter().sum();
        eprintln!("cpu {c}: /proc/stat ticks inner {inner:?}, outer {outer:?}");
        for (i, mode) in MODES.iter().enumerate() {
            let slack = if *mode == "idle" || *mode == "iowait" {
                2
            } else {
                0
            };
            let lo = (inner[i] - slack).max(0) as f64 / (outer_total + 4) as f64;
            let hi = (outer[i] + slack) as f64 / (inner_total - 4).max(1) as f64;
            let got = ratio(*c, mode);
            assert!(
                got >= lo - 1e-9 && got <= hi + 1e-9,
                "cpu {c} {mode}: sysscope {got}, /proc/stat says between {lo} and {hi}"
            );
        }
    }
}

#[test]
fn cgroup_cpu_time_matches_the_childs_rusage() {
    if !require_root("cgroup_cpu_time_matches_the_childs_rusage") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let cg = TestCgroup::new("sysscope-test-cgcpu");
    // Reaped below with wait4, which returns its rusage (std's wait does not).
    let pid = cg
        .command(workload_bin())
        .args(["spin", "1500"])
        .spawn()
        .expect("spawn spin")
        .id() as i32;
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child; status and usage are valid to fill.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "spin child: wait status {status:#x}"
    );
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let (user_truth, system_truth) = (tv(usage.ru_utime), tv(usage.ru_stime));
    let truth = user_truth + system_truth;
    // The machine may be busy (the child gets less than its 1.5 s of wall time): any
    // sizeable amount of CPU time will do.
    assert!(truth > 0.25, "the child spun for {truth}s only");

    let samples = parse_samples(&exporter.scrape());
    let series = |mode: &str| {
        sum(
            &samples,
            "sysscope_cgroup_cpu_seconds_total",
            &[("cgroup", cg.rel.as_str()), ("mode", mode)],
        )
    };
    let (user, system) = (series("user"), series("system"));
    let total = user + system;
    eprintln!("cgroup {total}s (user {user}, system {system}); rusage {truth}s (user {user_truth}, system {system_truth})");
    assert!(
        (total - truth).abs() <= 0.10 * truth,
        "cgroup {} CPU {total}s (user {user}, system {system}); rusage {truth}s (user {user_truth}, system {system_truth})",
        cg.rel
    );
    // The split follows the same tick sampling in both: compare within 10% of the total.
    assert!(
        (user - user_truth).abs() <= 0.10 * truth,
        "user {user}s vs rusage {user_truth}s"
    );
    // The parent cgroup includes it.
    let root = sum(
        &samples,
        "sysscope_cgroup_cpu_seconds_total",
        &[("cgroup", "/")],
    );
    assert!(root >= total, "root {root}s < child cgroup {total}s");
}
