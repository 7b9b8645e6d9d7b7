//! Each call's time split by where its thread was (`sysscope_syscall_time_seconds_total{state}`),
//! on the real kernel, against ground truth the tests control: sleeps of a known length, reads
//! that only compute, reads made beside busy loops on the same CPU (the kernel's own run delay,
//! `/proc/<pid>/schedstat` field 2, as the reference), and a cgroup under a CPU quota (its
//! `cpu.stat`). In every test the four parts of every series of the test's cgroup add up to the
//! series' `sysscope_syscall_duration_seconds_sum` to the nanosecond.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::common::*;

const CONFIG: &str = "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n";

/// The parts of one series, in ns: on CPU, waiting for a CPU, blocked, unknown.
#[derive(Debug, Default, Clone, Copy)]
struct Parts {
    on_cpu: i128,
    wait: i128,
    blocked: i128,
    unknown: i128,
    duration: i128,
}

impl Parts {
    fn secs(ns: i128) -> f64 {
        ns as f64 / 1e9
    }
}

fn ns(seconds: f64) -> i128 {
    (seconds * 1e9).round() as i128
}

/// The parts of the series of `cgroup` whose labels include `want`, summed over those series,
/// after checking that every series of the cgroup adds up exactly.
fn parts(samples: &[Sample], cgroup: &str, want: &[(&str, &str)]) -> Parts {
    check_every_series_adds_up(samples, cgroup);
    let mut labels = vec![("cgroup", cgroup)];
    labels.extend_from_slice(want);
    let state = |s: &str| {
        let mut l = labels.clone();
        l.push(("state", s));
        select(samples, "sysscope_syscall_time_seconds_total", &l)
            .iter()
            .map(|s| ns(s.value))
            .sum::<i128>()
    };
    Parts {
        on_cpu: state("on_cpu"),
        wait: state("wait_cpu"),
        blocked: state("blocked"),
        unknown: state("unknown"),
        duration: select(samples, "sysscope_syscall_duration_seconds_sum", &labels)
            .iter()
            .map(|s| ns(s.value))
            .sum(),
    }
}

/// Every syscall series of `cgroup`: its exported parts (at most one per state, none at
/// zero) add up to its duration sum, in ns.
fn check_every_series_adds_up(samples: &[Sample], cgroup: &str) {
    let sums = select(
        samples,
        "sysscope_syscall_duration_seconds_sum",
        &[("cgroup", cgroup)],
    );
    assert!(!sums.is_empty(), "no syscall series of {cgroup}");
    for sum in sums {
        let mut total = 0i128;
        let mut states = 0;
        for state in ["on_cpu", "wait_cpu", "blocked", "unknown"] {
            let mut want: Vec<(&str, &str)> = sum
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            want.push(("state", state));
            let found = select(samples, "sysscope_syscall_time_seconds_total", &want);
            // The series' own labels plus `state`: exactly one sample each.
            let found: Vec<_> = found
                .into_iter()
                .filter(|s| s.labels.len() == sum.labels.len() + 1)
                .collect();
            // A state the series never spent time in is not exported.
            assert!(found.len() <= 1, "{state} of {:?}", sum.labels);
            if let Some(part) = found.first() {
                assert!(
                    part.value > 0.0,
                    "{state} of {:?} exported at 0",
                    sum.labels
                );
                total += ns(part.value);
                states += 1;
            }
        }
        // A series with time has at least one state; one without (calls counted with no
        // duration: exit_group, calls a seccomp filter denied) has none.
        assert!(
            states >= 1 || ns(sum.value) == 0,
            "no state of {:?}",
            sum.labels
        );
        assert_eq!(
            total,
            ns(sum.value),
            "the parts of {:?} do not add up to its duration",
            sum.labels
        );
    }
}

/// 200 sleeps of 5 ms: blocked for at least the 1 s asked for and at most what the child
/// measured around its calls; barely on CPU, and waiting far less than asleep (on an idle
/// machine barely at all; a loaded one delays the wake-ups).
#[test]
fn sleeps_are_blocked_time() {
    if !require_root("sleeps_are_blocked_time") {
        return;
    }
    let exporter = Exporter::start(CONFIG, &[]);
    let cg = TestCgroup::new("sysscope-test-time-sleep");
    const N: u64 = 200;
    const MS: u64 = 5;
    let out = cg
        .command(workload_bin())
        .args(["sleep", &N.to_string(), &MS.to_string()])
        .output()
        .expect("spawn workload");
    assert!(out.status.success(), "workload failed: {}", out.status);
    // Ground truth: what the child measured around its own calls. The timer fires within the
    // slack (50 µs by default) after the time asked for plus the timer interrupt's latency,
    // which a loaded virtual machine stretches to hundreds of µs: no fixed bound holds.
    let slept: i128 = String::from_utf8_lossy(&out.stderr)
        .trim()
        .strip_prefix("slept_ns=")
        .and_then(|v| v.parse().ok())
        .expect("workload prints slept_ns");
    let samples = parse_samples(&exporter.scrape());
    let p = parts(&samples, &cg.rel, &[("syscall", "nanosleep")]);
    eprintln!(
        "nanosleep: {p:?}, the child measured {}s",
        Parts::secs(slept)
    );
    let asked = (N * MS) as i128 * 1_000_000;
    // The timer is armed before the switch-out (a few µs each); the child's clock reads
    // around each call take a few µs more than the call.
    let arming = N as i128 * 20_000;
    // A stretch whose wakeup the probes did not see is unknown, not blocked (rare: counted
    // apart rather than guessed).
    let blocked = p.blocked + p.unknown;
    assert!(
        blocked >= asked - arming && blocked <= slept,
        "blocked {}s (with {}s unknown) is not between the {}s asked for and the {}s the child \
         measured",
        Parts::secs(p.blocked),
        Parts::secs(p.unknown),
        Parts::secs(asked),
        Parts::secs(slept)
    );
    assert!(
        p.duration <= slept,
        "the calls lasted {}s by sysscope, more than the {}s the child measured around them",
        Parts::secs(p.duration),
        Parts::secs(slept)
    );
    assert!(
        p.unknown * 20 <= p.duration,
        "{}s of {}s unknown",
        Parts::secs(p.unknown),
        Parts::secs(p.duration)
    );
    // A sleep computes for microseconds; how long its wake-up waits for a CPU depends on the
    // machine's load (on an idle one, microseconds too): small next to the time asleep.
    assert!(
        p.on_cpu * 50 <= p.duration && p.wait < p.blocked,
        "on CPU {}s and waiting {}s of {}s: not small",
        Parts::secs(p.on_cpu),
        Parts::secs(p.wait),
        Parts::secs(p.duration)
    );
    assert!(p.on_cpu > 0, "no time on CPU at all");
}

/// Reads of /dev/zero into a large buffer compute (the kernel zeroes the pages): on CPU
/// dominates, nothing blocks. (How long they wait for a CPU depends on the machine's load:
/// compared with the time they were not waiting.)
#[test]
fn reads_that_compute_are_on_cpu_time() {
    if !require_root("reads_that_compute_are_on_cpu_time") {
        return;
    }
    // Not beside the tests that pin busy loops.
    let _alone = alone();
    let exporter = Exporter::start(CONFIG, &[]);
    let cg = TestCgroup::new("sysscope-test-time-zero");
    // 8 reads of 64 MiB.
    run_workload_joined(&cg, &["read-file", "/dev/zero", "536870912", "67108864"]);
    let samples = parse_samples(&exporter.scrape());
    let p = parts(
        &samples,
        &cg.rel,
        &[("syscall", "read"), ("fd_kind", "char")],
    );
    eprintln!("read /dev/zero: {p:?}");
    assert!(p.duration > 0, "no reads of /dev/zero counted");
    assert!(
        p.on_cpu * 10 >= (p.duration - p.wait) * 9,
        "on CPU {}s of the {}s not waiting for a CPU",
        Parts::secs(p.on_cpu),
        Parts::secs(p.duration - p.wait)
    );
    assert!(
        p.blocked * 20 <= p.duration,
        "blocked {}s of {}s",
        Parts::secs(p.blocked),
        Parts::secs(p.duration)
    );
}

/// Busy loops pinned to `cpu` in `cg` (and, when given, in the v1 `cpu` cgroup `v1`), killed
/// on drop.
struct BusyLoops(Vec<Child>);

impl BusyLoops {
    fn start(cg: &TestCgroup, v1: Option<&PathBuf>, cpu: usize, n: usize) -> Self {
        let loops = (0..n)
            .map(|_| {
                let mut cmd = cg.command(workload_bin());
                if let Some(v1) = v1 {
                    cmd.arg("join-cgroup").arg(v1);
                }
                cmd.args(["pin-cpu", &cpu.to_string(), "spin", "120000"])
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("spawn a busy loop")
            })
            .collect();
        // Running (and pinned) before the reader starts.
        std::thread::sleep(Duration::from_millis(200));
        Self(loops)
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The reader of `contended-pipe-read`: `n` reads of a pipe fed `ms` ms after each blocks, pinned to
/// `cpu` beside the busy loops, at nice 19 and as SCHED_BATCH (woken, it does not preempt
/// them: it waits for its CPU). Returns the run delay it read around its reads, in ns.
fn contended_reads(cg: &TestCgroup, v1: Option<&PathBuf>, cpu: usize, n: u64, ms: u64) -> i128 {
    let mut cmd = cg.command("nice");
    cmd.args(["-n", "19", workload_bin()]);
    if let Some(v1) = v1 {
        cmd.arg("join-cgroup").arg(v1);
    }
    let out = cmd
        .args(["pin-cpu", &cpu.to_string(), "sched-batch"])
        .args(["contended-pipe-read", &n.to_string(), &ms.to_string()])
        .output()
        .expect("spawn the reader");
    assert!(out.status.success(), "reader: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("run_delay_ns=")?.parse().ok())
        .unwrap_or_else(|| panic!("the reader prints its run delay: {stdout}"))
}

/// Tolerance of the comparison with the kernel's run delay: the reader reads its schedstat
/// around each read (so delays of those reads and of the user-space code between count there
/// and not in the read), and the kernel accounts run delay with the runqueue clock, which
/// sysscope's CLOCK_MONOTONIC stamps track within microseconds per switch.
fn run_delay_tolerance(run_delay: i128) -> i128 {
    (run_delay / 10).max(3_000_000)
}

/// Reads beside two busy loops on the same CPU wait for it: their wait for a CPU is large, and
/// matches the run delay the kernel accounts for the reader over those reads.
#[test]
fn waiting_for_a_cpu_matches_the_kernels_run_delay() {
    if !require_root("waiting_for_a_cpu_matches_the_kernels_run_delay") {
        return;
    }
    // Its busy loops would slow every test beside it.
    let _alone = alone();
    let exporter = Exporter::start(CONFIG, &[]);
    let cg = TestCgroup::new("sysscope-test-time-wait");
    let loops = BusyLoops::start(&cg, None, 0, 2);
    let run_delay = contended_reads(&cg, None, 0, 40, 0);
    drop(loops);
    let samples = parse_samples(&exporter.scrape());
    let p = parts(
        &samples,
        &cg.rel,
        &[("syscall", "read"), ("fd_kind", "pipe")],
    );
    eprintln!("pipe reads beside busy loops: {p:?}; run delay {run_delay} ns");
    assert!(
        p.wait >= 20_000_000,
        "waited only {}s for a CPU",
        Parts::secs(p.wait)
    );
    let tolerance = run_delay_tolerance(run_delay);
    assert!(
        p.wait <= run_delay + tolerance,
        "waited {}s in reads, more than the kernel's run delay {}s around them",
        Parts::secs(p.wait),
        Parts::secs(run_delay)
    );
    // A stretch the probes could not attribute is unknown: it may hold run delay.
    assert!(
        p.wait + p.unknown >= run_delay - tolerance,
        "waited {}s (+{}s unknown) in reads, less than the kernel's run delay {}s",
        Parts::secs(p.wait),
        Parts::secs(p.unknown),
        Parts::secs(run_delay)
    );
}

/// A cgroup held to 10% of a CPU: its throttling is exported beside its syscall time, as the
/// kernel accounts it in `cpu.stat`, and its calls' time still adds up.
#[test]
fn a_cpu_quota_shows_as_throttling_beside_the_time_split() {
    if !require_root("a_cpu_quota_shows_as_throttling_beside_the_time_split") {
        return;
    }
    let _alone = alone();
    let exporter = Exporter::start(CONFIG, &[]);
    let cg = TestCgroup::new("sysscope-test-time-quota");
    let Some(quota) = CpuQuota::required(
        "a_cpu_quota_shows_as_throttling_beside_the_time_split",
        &cg,
        10_000,
        100_000,
    ) else {
        return;
    };
    let join = quota.join.clone();
    let loops = BusyLoops::start(&cg, join.as_ref(), 0, 2);
    let run_delay = contended_reads(&cg, join.as_ref(), 0, 20, 0);
    drop(loops);
    // Every task of the cgroup is gone; the period timer may still close a period or two,
    // so the exported values lie between a read of cpu.stat before the scrape and one after.
    std::thread::sleep(Duration::from_millis(300));
    let before = quota.stat();
    let samples = parse_samples(&exporter.scrape());
    let after = quota.stat();
    let throttled_ns = |stat: &std::collections::HashMap<String, u64>| -> u64 {
        stat.get("throttled_usec")
            .map(|us| us * 1000)
            .unwrap_or_else(|| stat["throttled_time"])
    };
    let throttled_periods = after["nr_throttled"];
    assert!(
        throttled_periods > 0,
        "the quota never throttled: {after:?}"
    );
    let labels = [("cgroup", cg.rel.as_str())];
    let exported = |name: &str| sum(&samples, name, &labels);
    let within = |name: &str, low: u64, high: u64| {
        let v = exported(name);
        assert!(
            v >= low as f64 && v <= high as f64,
            "{name} {v}, cpu.stat said {low} before the scrape and {high} after"
        );
    };
    within(
        "sysscope_cgroup_cpu_periods_total",
        before["nr_periods"],
        after["nr_periods"],
    );
    within(
        "sysscope_cgroup_cpu_throttled_periods_total",
        before["nr_throttled"],
        after["nr_throttled"],
    );
    let seconds = ns(exported("sysscope_cgroup_cpu_throttled_seconds_total"));
    assert!(
        seconds >= throttled_ns(&before) as i128 && seconds <= throttled_ns(&after) as i128,
        "throttled {seconds} ns, cpu.stat said {} before and {} after",
        throttled_ns(&before),
        throttled_ns(&after)
    );
    let throttled_ns = throttled_ns(&after);
    let p = parts(
        &samples,
        &cg.rel,
        &[("syscall", "read"), ("fd_kind", "pipe")],
    );
    eprintln!(
        "pipe reads under a 10% quota: {p:?}; run delay {run_delay} ns; throttled {throttled_periods} periods, {throttled_ns} ns"
    );
    // Where the throttled time lands depends on the kernel: before 6.18 a task woken in a
    // throttled cgroup waits inside its call; from 6.18 it runs its kernel part and is held
    // on its way back to user space (after the call). Either way the reads wait no longer
    // than the run delay the kernel accounts around them.
    assert!(
        p.wait <= run_delay + run_delay_tolerance(run_delay),
        "waited {}s in reads, more than the kernel's run delay {}s around them",
        Parts::secs(p.wait),
        Parts::secs(run_delay)
    );
}

/// Spans of slow calls carry the split, adding up to the span's duration.
#[test]
fn slow_call_spans_carry_the_split() {
    if !require_root("slow_call_spans_carry_the_split") {
        return;
    }
    let config = format!(
        "{CONFIG}[slow_calls]\nthreshold = \"1h\"\n[slow_calls.thresholds]\nnanosleep = \"5ms\"\n"
    );
    let exporter = Exporter::start(&config, &[]);
    let cg = TestCgroup::new("sysscope-test-time-span");
    let child = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&cg.dir)
        .args(["sleep", "3", "20"])
        .spawn()
        .expect("spawn workload");
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let spans = eventually(Duration::from_secs(20), || {
        let (_, _, body) = http_get(exporter.port, "/api/v1/slow-calls", None).ok()?;
        let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
        let mine: Vec<serde_json::Value> = doc["slow_calls"]
            .as_array()?
            .iter()
            .filter(|c| c["attributes"]["process.pid"] == pid && c["name"] == "nanosleep")
            .cloned()
            .collect();
        (mine.len() == 3).then_some(mine)
    })
    .expect("three nanosleep spans");
    for span in spans {
        let a = &span["attributes"];
        let int = |k: &str| a[k].as_i64().unwrap_or(0) as i128;
        let duration = span["end_time_unix_nano"].as_i64().unwrap()
            - span["start_time_unix_nano"].as_i64().unwrap();
        let parts = int("sysscope.syscall.on_cpu_ns")
            + int("sysscope.syscall.wait_cpu_ns")
            + int("sysscope.syscall.blocked_ns")
            + int("sysscope.syscall.unknown_ns");
        assert_eq!(parts, duration as i128, "{span}");
        assert!(
            int("sysscope.syscall.blocked_ns") + int("sysscope.syscall.unknown_ns") >= 19_900_000,
            "{span}"
        );
    }
}

/// Runs the `sysscope` binary with `args`; returns (exit code, stdout, stderr).
fn sysscope(args: &[&str]) -> (i32, String, String) {
    run_sysscope(args, &[])
}

/// `summary` splits each syscall's seconds by state (in its JSON always, as a table with
/// `--by-state`), and `trace` draws each stretch off CPU inside its call's slice.
#[test]
fn summary_and_trace_split_calls_by_state() {
    if !require_root("summary_and_trace_split_calls_by_state") {
        return;
    }
    let (code, out, err) = sysscope(&[
        "summary",
        "-q",
        "--json",
        "--",
        workload_bin(),
        "sleep",
        "20",
        "5",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = v["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["syscall"] == "nanosleep")
        .expect("a nanosleep row")
        .clone();
    let part = |k: &str| ns(row[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}")));
    let parts = part("on_cpu_seconds")
        + part("wait_cpu_seconds")
        + part("blocked_seconds")
        + part("unknown_seconds");
    // Each column is rounded from ns to a float on its own: within a few ns of the total.
    assert!((parts - part("seconds")).abs() <= 4, "{row}");
    assert!(
        part("blocked_seconds") + part("unknown_seconds") >= 99_000_000,
        "{row}"
    );
    assert_eq!(row["switched_calls"], 20);

    let (code, out, err) = sysscope(&[
        "summary",
        "-q",
        "--by-state",
        "--",
        workload_bin(),
        "sleep",
        "3",
        "5",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "    seconds      on-cpu    wait-cpu     blocked     unknown %switched syscall"
        ),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.ends_with(" nanosleep") && l.contains("100.0")),
        "{out}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let (code, _, err) = sysscope(&[
        "trace",
        "-q",
        "-o",
        path.to_str().unwrap(),
        "--",
        workload_bin(),
        "sleep",
        "5",
        "20",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("stretches off CPU inside calls"), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let slices = |cat: &str, name: &str| -> Vec<(u64, f64, f64)> {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == cat && e["name"] == name)
            .map(|e| {
                (
                    e["tid"].as_u64().unwrap(),
                    e["ts"].as_f64().unwrap(),
                    e["dur"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let sleeps = slices("syscall", "nanosleep");
    assert_eq!(sleeps.len(), 5);
    let blocked = slices("sched", "blocked");
    assert!(blocked.len() >= 4, "{blocked:?}");
    // Each stretch lies inside a call of its thread (µs, three decimals).
    for (tid, ts, dur) in &blocked {
        assert!(
            sleeps
                .iter()
                .any(|(t, s, d)| t == tid && *s <= *ts && ts + dur <= s + d + 0.001),
            "blocked {ts}+{dur} on {tid} outside every nanosleep {sleeps:?}"
        );
    }
    let asleep: f64 = blocked.iter().map(|(_, _, d)| d).sum();
    assert!(asleep >= 4.0 * 19_900.0, "{asleep} µs blocked");
}

/// `diagnose` says when reads wait for a CPU, with the numbers.
#[test]
fn diagnose_says_reads_wait_for_a_cpu() {
    if !require_root("diagnose_says_reads_wait_for_a_cpu") {
        return;
    }
    let _alone = alone();
    let w = workload_bin();
    let script = format!(
        "{w} pin-cpu 0 spin 60000 & a=$!; {w} pin-cpu 0 spin 60000 & b=$!; \
         {w} sleep 1 200; nice -n 19 {w} pin-cpu 0 sched-batch contended-pipe-read 40 0 >/dev/null; \
         kill $a $b"
    );
    let (code, out, err) = sysscope(&[
        "diagnose",
        "-q",
        "--json",
        "--no-trace",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let verdict = v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == "reads-wait-for-cpu")
        .unwrap_or_else(|| panic!("no reads-wait-for-cpu verdict: {v:#}"))
        .clone();
    assert!(
        verdict["title"]
            .as_str()
            .unwrap()
            .starts_with("reads wait for a CPU"),
        "{verdict:#}"
    );
    assert!(
        verdict["evidence"][0]
            .as_str()
            .unwrap()
            .contains("waiting for a CPU"),
        "{verdict:#}"
    );
}

/// The time split is a switch, and both of its values load: `--config.check` reports every
/// collector up and every program attached, `sched_wakeup` only with the split on. (The GPU
/// collector is off: no machine of the tests has a GPU.)
#[test]
fn config_check_loads_with_the_split_on_and_off() {
    if !require_root("config_check_loads_with_the_split_on_and_off") {
        return;
    }
    for split in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sysscope.toml");
        std::fs::write(
            &path,
            format!("[gpu]\nenabled = false\n[syscalls]\ntime_by_state = {split}\n"),
        )
        .unwrap();
        let (code, out, err) = run_sysscope(
            &[
                &format!("--config.file={}", path.display()),
                "--config.check",
            ],
            &[],
        );
        let context = format!("time_by_state = {split}:\n{out}\n{err}");
        assert_eq!(code, 0, "{context}");
        assert!(
            out.lines().any(|l| l == "configuration OK: yes"),
            "{context}"
        );
        let collectors: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("collector ") && !l.contains(" failed: "))
            .collect();
        for name in ["syscalls", "block_io", "cpu"] {
            assert!(
                collectors.contains(&format!("collector {name}: up").as_str()),
                "{name} not up; {context}"
            );
        }
        assert!(collectors.iter().all(|l| l.ends_with(": up")), "{context}");
        assert!(!out.lines().any(|l| l.starts_with("FAILED")), "{context}");
        for program in ["sys_enter", "sys_exit", "sched_switch"] {
            assert!(
                out.lines()
                    .any(|l| l.starts_with("attached") && l.contains(&format!(" {program} "))),
                "{program} not attached; {context}"
            );
        }
        assert_eq!(
            out.lines()
                .any(|l| l.starts_with("attached") && l.contains(" sched_wakeup ")),
            split,
            "sched_wakeup; {context}"
        );
    }
}

/// With the split off the exporter counts exactly, calls that blocked (and so were moved to
/// the thread's storage at their switch-out) included, and exports no time split.
#[test]
fn split_off_counts_exactly() {
    if !require_root("split_off_counts_exactly") {
        return;
    }
    let config = format!("{CONFIG}[syscalls]\ntime_by_state = false\n");
    let exporter = Exporter::start(&config, &[]);
    let cg = TestCgroup::new("sysscope-test-split-off");
    const N: u64 = 4321;
    const SLEEPS: u64 = 20;
    run_workload_joined(
        &cg,
        &["getppid", &N.to_string(), "sleep", &SLEEPS.to_string(), "1"],
    );
    let samples = parse_samples(&exporter.scrape());
    assert_eq!(getppid_calls(&samples, &cg), N as f64);
    let with = |syscall| [("cgroup", cg.rel.as_str()), ("syscall", syscall)];
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &with("nanosleep")),
        SLEEPS as f64
    );
    assert!(
        select(
            &samples,
            "sysscope_syscall_time_seconds_total",
            &[("cgroup", cg.rel.as_str())]
        )
        .is_empty(),
        "a time split exported with the split off"
    );
}
