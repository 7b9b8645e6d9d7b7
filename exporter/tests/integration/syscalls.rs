//! The syscall collector against ground truth, on the real kernel with the real probes:
//! a child in a fresh cgroup makes an exact number of calls and sysscope must report exactly
//! that many, with the right errno and latency buckets.

use std::{process::Command, time::Duration};

use crate::common::*;

/// Config of the exact-count tests: every exporter sees every process on the machine, so the
/// other tests running meanwhile (500 processes for the cardinality test) must not use up the
/// series budget and fold this test's series into "other".
const ISOLATED: &str = "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n";

#[test]
fn exact_counts_and_errno_for_a_child_in_a_fresh_cgroup() {
    if !require_root("exact_counts_and_errno_for_a_child_in_a_fresh_cgroup") {
        return;
    }
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-counts");
    const N: u64 = 1234;
    const M: u64 = 57;
    run_workload_joined(
        &cg,
        &["getppid", &N.to_string(), "openat-missing", &M.to_string()],
    );

    let text = exporter.scrape();
    let samples = parse_samples(&text);
    // On failure, show everything exported for the test cgroup.
    let context: String = text
        .lines()
        .filter(|l| l.contains(cg.rel.as_str()) && !l.contains("_bucket"))
        .collect::<Vec<_>>()
        .join("\n");
    let series = [("cgroup", cg.rel.as_str()), ("comm", WORKLOAD_COMM)];
    let with = |syscall: &'static str| {
        let mut v = series.to_vec();
        v.push(("syscall", syscall));
        v
    };
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &with("getppid")),
        N as f64,
        "getppid count; the cgroup's series:\n{context}"
    );
    assert_eq!(
        sum(
            &samples,
            "sysscope_syscall_duration_seconds_count",
            &with("getppid")
        ),
        N as f64,
        "getppid histogram count"
    );
    let mut enoent = with("openat");
    enoent.push(("errno", "ENOENT"));
    assert_eq!(
        sum(&samples, "sysscope_syscall_errors_total", &enoent),
        M as f64,
        "openat ENOENT errors; the cgroup's series:\n{context}"
    );
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &with("openat")),
        M as f64
    );
    // Joining the cgroup is one write (its open happened before the move).
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &with("write")),
        1.0
    );
    // Nothing of this cgroup is attributed elsewhere: the cgroup has exactly one comm.
    let comms: std::collections::BTreeSet<_> =
        select(&samples, "sysscope_syscalls_total", &[("cgroup", &cg.rel)])
            .iter()
            .map(|s| s.labels["comm"].clone())
            .collect();
    assert_eq!(comms.len(), 1, "comms in the test cgroup: {comms:?}");
    // exit_group never returns but is counted at entry, like strace does.
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &with("exit_group")),
        1.0
    );
}

#[test]
fn latency_histogram_of_known_sleeps() {
    if !require_root("latency_histogram_of_known_sleeps") {
        return;
    }
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-sleep");
    const K: u64 = 8;
    let out = cg
        .command(workload_bin())
        .args(["sleep", &K.to_string(), "20"])
        .output()
        .expect("spawn workload");
    assert!(out.status.success());
    // Ground truth: what the child measured around its own calls (a loaded machine oversleeps).
    let slept_ns: f64 = String::from_utf8_lossy(&out.stderr)
        .trim()
        .strip_prefix("slept_ns=")
        .and_then(|v| v.parse().ok())
        .expect("workload prints slept_ns");

    let samples = parse_samples(&exporter.scrape());
    let labels = [("cgroup", cg.rel.as_str()), ("syscall", "nanosleep")];
    assert_eq!(
        sum(&samples, "sysscope_syscall_duration_seconds_count", &labels),
        K as f64
    );
    let total = sum(&samples, "sysscope_syscall_duration_seconds_sum", &labels);
    let truth = slept_ns / 1e9;
    // Inside the window the child measured around its calls (50 us a call for its clock
    // reads), and never less than what was asked for. (A band around the child's figure would
    // fail on a loaded machine, which can preempt the child between its clock read and the
    // call, time the kernel rightly does not count.)
    assert!(
        total <= truth + K as f64 * 50e-6,
        "sum {total}s above the {truth}s the child measured around its calls"
    );
    let asked = K as f64 * 0.020;
    assert!(total >= asked, "sum {total}s below the {asked}s asked for");
    // 20 ms lies in (2^-6 s, 2^-4 s] = (15.6 ms, 62.5 ms]: nothing at or below 15.6 ms, all at
    // 62.5 ms.
    let bucket = |le: &str| {
        let mut l = labels.to_vec();
        l.push(("le", le));
        sum(&samples, "sysscope_syscall_duration_seconds_bucket", &l)
    };
    assert_eq!(bucket("0.015625"), 0.0);
    assert_eq!(bucket("0.0625"), K as f64);
    assert_eq!(bucket("+Inf"), K as f64);
}

/// A call whose task is switched out mid-call leaves the CPU's fast path: its entry is kept in
/// the thread's storage at the switch and found at the exit on the other CPU. Every such call
/// must still be counted once, with its whole duration.
#[test]
fn calls_switched_out_and_resumed_on_another_cpu_are_exact() {
    if !require_root("calls_switched_out_and_resumed_on_another_cpu_are_exact") {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs two CPUs to move a sleeping thread between them");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must run this on two CPUs"
        );
        return;
    }
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-migrate");
    const K: u64 = 12;
    // Long enough that a mover scheduled late on a loaded machine still finds it asleep.
    const MS: u64 = 30;
    let out = cg
        .command(workload_bin())
        .args(["sleep-migrating", &K.to_string(), &MS.to_string()])
        .output()
        .expect("spawn workload");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let field = |name: &str| -> f64 {
        stderr
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or_else(|| panic!("workload prints {name}: {stderr}"))
    };
    // The scenario happened: every sleep returned on the other CPU.
    assert_eq!(field("migrated"), K as f64, "sleeps that returned on CPU 1");

    let samples = parse_samples(&exporter.scrape());
    let labels = [("cgroup", cg.rel.as_str()), ("syscall", "nanosleep")];
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &labels),
        K as f64,
        "nanosleep calls"
    );
    let total = sum(&samples, "sysscope_syscall_duration_seconds_sum", &labels);
    let truth = field("slept_ns") / 1e9;
    let asked = (K * MS) as f64 / 1e3;
    assert!(total >= asked, "sum {total}s below the {asked}s asked for");
    assert!(
        total <= truth,
        "sum {total}s above the {truth}s the child measured around its calls"
    );
    // 30 ms lies in (15.6 ms, 62.5 ms].
    let mut le = labels.to_vec();
    le.push(("le", "0.0625"));
    assert_eq!(
        sum(&samples, "sysscope_syscall_duration_seconds_bucket", &le),
        K as f64
    );
    le.pop();
    le.push(("le", "0.015625"));
    assert_eq!(
        sum(&samples, "sysscope_syscall_duration_seconds_bucket", &le),
        0.0
    );
}

#[test]
fn counters_survive_reclaim_and_sum_over_processes() {
    if !require_root("counters_survive_reclaim_and_sum_over_processes") {
        return;
    }
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-reclaim");
    let labels = [("cgroup", cg.rel.as_str()), ("syscall", "getppid")];
    run_workload(&cg, &["getppid", "300"]);
    // First read: values recorded, entries of the exited process reclaimed from the kernel.
    let first = sum(
        &parse_samples(&exporter.scrape()),
        "sysscope_syscalls_total",
        &labels,
    );
    assert_eq!(first, 300.0);
    let second = sum(
        &parse_samples(&exporter.scrape()),
        "sysscope_syscalls_total",
        &labels,
    );
    assert_eq!(second, 300.0, "counter must not go back after reclaim");
    // A second process with the same name adds to the same series.
    run_workload(&cg, &["getppid", "200"]);
    let third = sum(
        &parse_samples(&exporter.scrape()),
        "sysscope_syscalls_total",
        &labels,
    );
    assert_eq!(third, 500.0);
    // The kernel map no longer holds entries for this cgroup once they were read.
    let id = cg.id();
    // The check itself must be able to see entries: the cgroup has a live process right now.
    let mut live = cg
        .command(workload_bin())
        .args(["sleep", "1", "1000"])
        .spawn()
        .expect("spawn");
    let seen = eventually(Duration::from_secs(5), || {
        (kernel_entries_for_cgroup(&exporter, id) > 0).then_some(())
    });
    live.kill().ok();
    live.wait().ok();
    assert!(
        seen.is_some(),
        "bpftool shows no entry of a live process in the cgroup"
    );
    let leftover = eventually(Duration::from_secs(10), || {
        exporter.scrape();
        (kernel_entries_for_cgroup(&exporter, id) == 0).then_some(())
    });
    assert!(
        leftover.is_some(),
        "kernel entries of exited processes were not reclaimed"
    );
}

/// Entries of the exporter's own statistics table that belong to cgroup `id`, read with
/// bpftool (independent of sysscope): keys of `SYSCALL_SLOTS`, plus the copies in
/// `SYSCALL_STATS` that still name such a key as their owner (a freed slot is zeroed). Other
/// tests' exporters, running in parallel, hold maps of the same names: the maps are found
/// among the ids the exporter process holds open.
fn kernel_entries_for_cgroup(exporter: &Exporter, id: u64) -> usize {
    let of_cgroup = |bytes: &serde_json::Value| {
        let bytes: Vec<u8> = bytes
            .as_array()
            .expect("bpftool prints bytes as a list")
            .iter()
            .map(|b| {
                let b = b.as_str().expect("bytes are strings");
                u8::from_str_radix(b.trim_start_matches("0x"), 16).expect("a hex byte")
            })
            .collect();
        u64::from_le_bytes(
            bytes[..8]
                .try_into()
                .expect("a key starts with the cgroup id"),
        ) == id
    };
    let slots = dump_exporter_map(exporter, "SYSCALL_SLOTS")
        .iter()
        .filter(|e| of_cgroup(&e["key"]))
        .count();
    let copies = dump_exporter_map(exporter, "SYSCALL_STATS")
        .iter()
        .filter(|e| of_cgroup(&e["value"]))
        .count();
    slots + copies
}

#[test]
fn exposition_passes_promtool_and_real_parsers() {
    if !require_root("exposition_passes_promtool_and_real_parsers") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let cg = TestCgroup::new("sysscope-test-format");
    run_workload(&cg, &["getppid", "10", "openat-missing", "3"]);
    let text = exporter.scrape();
    let om = exporter.scrape_openmetrics();
    assert!(om.ends_with("# EOF\n"), "OpenMetrics must end with # EOF");
    assert!(!text.contains("# EOF"), "0.0.4 text must not contain # EOF");

    let (_dir, text_path, om_path) = exposition_files(&text, &om);
    let out = promtool_check_metrics(&text_path);
    let lint =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{lint}"
    );

    // The reference Python parsers, for both formats.
    let script = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
text = open(sys.argv[1]).read()
om = open(sys.argv[2]).read()
a = sum(len(f.samples) for f in text_string_to_metric_families(text))
b = sum(len(f.samples) for f in om_families(om))
names = {f.name for f in om_families(om)}
for required in ["sysscope_syscalls", "sysscope_syscall_errors", "sysscope_syscall_duration_seconds", "sysscope_build_info", "sysscope_collector_up"]:
    assert required in names, (required, sorted(names))
print(a, b)
"#;
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            text_path.to_str().unwrap(),
            om_path.to_str().unwrap(),
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python prometheus_client parsers rejected the exposition:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts = String::from_utf8_lossy(&out.stdout);
    let parsed: Vec<usize> = counts
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        parsed[0] > 10 && parsed[1] > 10,
        "too few samples parsed: {counts}"
    );
}

#[test]
fn sigterm_detaches_everything_and_exits_zero() {
    if !require_root("sigterm_detaches_everything_and_exits_zero") {
        return;
    }
    let mut exporter = Exporter::start(TEST_CONFIG, &[]);
    let pid = exporter.child.id();
    let ids = bpf_program_ids_of(pid);
    assert!(
        ids.len() >= 3,
        "expected sysscope's programs loaded, found {ids:?}"
    );
    let (status, took) = exporter.stop();
    assert!(status.success(), "exit status {status}");
    assert!(took < Duration::from_secs(5), "took {took:?} to stop");
    // The kernel frees programs after an RCU grace period: give it a moment.
    let gone = eventually(Duration::from_secs(3), || {
        let remaining: Vec<u64> = loaded_program_ids()
            .into_iter()
            .filter(|id| ids.contains(id))
            .collect();
        remaining.is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "programs {ids:?} still loaded 3 s after exit"
    );
}

#[test]
fn config_check_lists_attached_programs() {
    if !require_root("config_check_lists_attached_programs") {
        return;
    }
    let out = Command::new(sysscope_bin())
        .arg("--config.check")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for program in ["sys_enter", "sys_exit", "sched_process_exit"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("attached") && l.contains(program)),
            "{program} not attached:\n{stdout}"
        );
    }
    // Root holds the /proc fallback's two capabilities: they are kept, and said why.
    for cap in ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("capability kept after start-up: ") && l.contains(cap)),
            "{cap} not kept:\n{stdout}"
        );
    }
    assert!(
        stdout.lines().any(|l| l
            == "slow-call file names: from the kernel; /proc fallback on for every process \
                (CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE held at start, kept)"),
        "{stdout}"
    );
}

// The errors below need no privileges: they are reported before anything is loaded.

#[test]
fn bad_config_key_is_named_and_exits_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[limits]\nmax_seriess = 10\n").unwrap();
    let out = Command::new(sysscope_bin())
        .arg(format!("--config.file={}", path.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("max_seriess"), "{stderr}");
}

#[test]
fn port_in_use_is_a_clear_error() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let out = Command::new(sysscope_bin())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}")) && stderr.contains("in use"),
        "{stderr}"
    );
    // The cause is stated once, not in the message and again as its source.
    assert_eq!(stderr.matches("in use").count(), 1, "{stderr}");
}

#[test]
fn missing_capability_is_named() {
    // Drop every capability with setpriv (util-linux) and check the message names CAP_BPF.
    // scripts/setup.sh --test installs it (util-linux).
    let setpriv = Command::new("setpriv").arg("--help").output().is_ok();
    if !require("missing_capability_is_named", "setpriv", setpriv) {
        return;
    }
    let port = free_port();
    let out = Command::new("setpriv")
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
        .arg(sysscope_bin())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("CAP_BPF"), "{stderr}");
}

#[test]
fn default_budget_keeps_100_cgroups_and_500_processes_under_50k_series() {
    if !require_root("default_budget_keeps_100_cgroups_and_500_processes_under_50k_series") {
        return;
    }
    // 500 processes with names of their own: the exporters of tests running beside it would
    // fold their series into "other" at the default budget.
    let _alone = alone();
    // The series budget is at its default; the kernel map is made roomier than its default so
    // that other processes on a shared machine cannot fill it during the test (map capacity is
    // not what is under test here, and insert failures are asserted to be zero below).
    let exporter = Exporter::start(
        &format!("{TEST_CONFIG}[limits]\nmax_syscall_entries = 65536\n"),
        &[],
    );
    let cgroups: Vec<TestCgroup> = (0..100)
        .map(|i| TestCgroup::new(&format!("sysscope-test-card{i}")))
        .collect();
    // Five processes per cgroup, each with a name of its own (comm is set by the kernel from
    // the executable's name: use symlinks), making a spread of distinct syscalls.
    let dir = tempfile::tempdir().unwrap();
    let mut children = Vec::new();
    for (i, cg) in cgroups.iter().enumerate() {
        for j in 0..5 {
            let link = dir.path().join(format!("w{i}-{j}"));
            std::os::unix::fs::symlink(workload_bin(), &link).unwrap();
            children.push(
                Command::new(&link)
                    .arg("join-cgroup")
                    .arg(&cg.dir)
                    .args(["getppid", "3", "openat-missing", "2", "sleep", "1", "1"])
                    .spawn()
                    .unwrap(),
            );
        }
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = exporter.scrape();
    let series = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    eprintln!("cardinality: {series} series exported for 100 cgroups x 5 processes");
    assert!(
        series < 50_000,
        "{series} series exported with default limits"
    );
    // The test's own cgroups are all there (as themselves or folded into "other").
    let samples = parse_samples(&text);
    let seen = cgroups
        .iter()
        .filter(|cg| {
            !select(&samples, "sysscope_syscalls_total", &[("cgroup", &cg.rel)]).is_empty()
        })
        .count();
    let folded = sum(
        &samples,
        "sysscope_dropped_series_total",
        &[("family", "syscalls")],
    );
    eprintln!("cardinality: {seen}/100 test cgroups as themselves, {folded} label sets folded");
    assert!(
        seen == 100 || folded > 0.0,
        "cgroups missing ({seen}/100) but nothing was folded"
    );
    // Nothing is lost by folding: the getppid calls of all 500 processes add up.
    let getppid: f64 = select(
        &samples,
        "sysscope_syscalls_total",
        &[("syscall", "getppid")],
    )
    .iter()
    .filter(|s| {
        s.labels["cgroup"].starts_with("/sysscope-test-card") || s.labels["cgroup"] == "other"
    })
    .map(|s| s.value)
    .sum();
    assert!(
        getppid >= 1500.0,
        "getppid calls of the 500 processes: {getppid}"
    );
}

#[test]
fn pid_label_is_opt_in() {
    if !require_root("pid_label_is_opt_in") {
        return;
    }
    let exporter = Exporter::start(&format!("{ISOLATED}[labels]\npid = true\n"), &[]);
    let cg = TestCgroup::new("sysscope-test-pid");
    let child = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&cg.dir)
        .args(["getppid", "42"])
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let samples = parse_samples(&exporter.scrape());
    let s = select(
        &samples,
        "sysscope_syscalls_total",
        &[("cgroup", &cg.rel), ("syscall", "getppid")],
    );
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].labels.get("pid"), Some(&pid));
    assert_eq!(s[0].value, 42.0);
}

/// The `fs` label sysscope gives the filesystem holding `path`, from statfs(2)'s `f_type`.
fn fs_label_of(path: &std::path::Path) -> String {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statfs is plain old data; all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the size statfs(2) writes.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
    sysscope::kernel::fd_class::fs_name(st.f_type as u32).into_owned()
}

/// An overlay mount (lower, upper and work directories in a temporary directory), unmounted on
/// drop.
struct Overlay {
    _dir: tempfile::TempDir,
    merged: std::path::PathBuf,
}

impl Overlay {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sub = |name: &str| {
            let p = dir.path().join(name);
            std::fs::create_dir(&p).unwrap();
            p
        };
        let (lower, upper, work, merged) = (sub("lower"), sub("upper"), sub("work"), sub("merged"));
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        let status = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &options])
            .arg(&merged)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t overlay failed: {status}");
        Self { _dir: dir, merged }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.merged).status();
    }
}

/// Reads and writes split by what their descriptor is: a child reads a file on the disk's
/// filesystem and one on tmpfs, and writes then reads a pipe and a socket pair, a known number
/// of times each; every (syscall, fd_kind, fs) series holds exactly that, and the series of a
/// syscall sum to its calls.
#[test]
fn reads_and_writes_are_split_by_descriptor_kind_and_filesystem() {
    if !require_root("reads_and_writes_are_split_by_descriptor_kind_and_filesystem") {
        return;
    }
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-fdkinds");
    let disk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(disk.path(), vec![b'x'; 4096]).unwrap();
    let shm = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
    std::fs::write(shm.path(), vec![b'y'; 4096]).unwrap();
    let (disk_fs, shm_fs) = (fs_label_of(disk.path()), fs_label_of(shm.path()));
    assert_eq!(shm_fs, "tmpfs");
    assert_ne!(
        disk_fs, shm_fs,
        "the temporary directory must not be on tmpfs"
    );
    let disk_path = disk.path().to_str().unwrap();
    let shm_path = shm.path().to_str().unwrap();
    let overlay = Overlay::new();
    let overlay_file = overlay.merged.join("data");
    std::fs::write(&overlay_file, vec![b'o'; 4096]).unwrap();
    assert_eq!(fs_label_of(&overlay_file), "overlay");
    // Disk file 100 reads; tmpfs file 70 reads, pipe 200, socket pair 300 (each a write then
    // a read); a file of an overlay mount (as containers see their image) 30 reads.
    run_workload_joined(
        &cg,
        &[
            "fd-kinds",
            disk_path,
            "100",
            "0",
            "0",
            "fd-kinds",
            shm_path,
            "70",
            "200",
            "300",
            "fd-kinds",
            overlay_file.to_str().unwrap(),
            "30",
            "0",
            "0",
        ],
    );

    let samples = parse_samples(&exporter.scrape());
    let series = |syscall: &'static str, labels: &[(&'static str, &str)]| {
        let mut want = vec![
            ("cgroup", cg.rel.as_str()),
            ("comm", WORKLOAD_COMM),
            ("syscall", syscall),
        ];
        want.extend_from_slice(labels);
        sum(&samples, "sysscope_syscalls_total", &want)
    };
    let context: String = select(&samples, "sysscope_syscalls_total", &[("cgroup", &cg.rel)])
        .iter()
        .map(|s| format!("{:?} {}\n", s.labels, s.value))
        .collect();
    fn file_on(fs: &str) -> [(&'static str, &str); 2] {
        [("fd_kind", "file"), ("fs", fs)]
    }
    assert_eq!(
        series("read", &file_on(&disk_fs)),
        100.0,
        "reads of a file on {disk_fs}:\n{context}"
    );
    assert_eq!(series("read", &file_on("tmpfs")), 70.0, "{context}");
    assert_eq!(series("read", &file_on("overlay")), 30.0, "{context}");
    assert_eq!(series("read", &[("fd_kind", "pipe")]), 200.0, "{context}");
    assert_eq!(series("read", &[("fd_kind", "socket")]), 300.0, "{context}");
    assert_eq!(series("write", &[("fd_kind", "pipe")]), 200.0, "{context}");
    assert_eq!(
        series("write", &[("fd_kind", "socket")]),
        300.0,
        "{context}"
    );
    // Joining the cgroup is one write, to cgroup.procs on the cgroup filesystem.
    assert_eq!(series("write", &file_on("cgroup2")), 1.0, "{context}");
    // The split loses nothing: the series of read sum to every read made (100 + 70 + 200 +
    // 300 + 30), and the histogram counts agree.
    assert_eq!(series("read", &[]), 700.0, "{context}");
    assert_eq!(
        sum(
            &samples,
            "sysscope_syscall_duration_seconds_count",
            &[
                ("cgroup", cg.rel.as_str()),
                ("syscall", "read"),
                ("fd_kind", "pipe")
            ]
        ),
        200.0
    );
    // Syscalls without a descriptor carry neither label.
    for s in select(&samples, "sysscope_syscalls_total", &[("cgroup", &cg.rel)]) {
        let classified = matches!(s.labels["syscall"].as_str(), "read" | "write");
        assert_eq!(
            s.labels.contains_key("fd_kind"),
            classified,
            "{:?}",
            s.labels
        );
    }
}

/// `syscalls.descriptor_kinds = false` turns the split off: the same reads are counted, in one
/// series without `fd_kind` or `fs`.
#[test]
fn descriptor_kinds_can_be_turned_off() {
    if !require_root("descriptor_kinds_can_be_turned_off") {
        return;
    }
    let config = format!("{ISOLATED}[syscalls]\ndescriptor_kinds = false\n");
    let exporter = Exporter::start(&config, &[]);
    let cg = TestCgroup::new("sysscope-test-fdkinds-off");
    let shm = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
    std::fs::write(shm.path(), vec![b'y'; 64]).unwrap();
    run_workload_joined(
        &cg,
        &["fd-kinds", shm.path().to_str().unwrap(), "40", "50", "60"],
    );
    let samples = parse_samples(&exporter.scrape());
    let reads = select(
        &samples,
        "sysscope_syscalls_total",
        &[("cgroup", cg.rel.as_str()), ("syscall", "read")],
    );
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert_eq!(reads[0].value, 150.0);
    assert!(!reads[0].labels.contains_key("fd_kind"), "{reads:?}");
}

/// A process that changes its name after sysscope read it (as a child does at exec: a name
/// read between its fork and its exec is the parent thread's) has the calls it makes under
/// new keys labelled with its new name, although sysscope caches names for seconds. Seen in
/// the scrape soak: up to 4 million calls of a freshly spawned workload were labelled with the
/// test thread's name.
#[test]
fn calls_after_a_rename_carry_the_new_name() {
    if !require_root("calls_after_a_rename_carry_the_new_name") {
        return;
    }
    let exporter = Exporter::start(ISOLATED, &[]);
    let first = TestCgroup::new("sysscope-test-rename-a");
    let second = TestCgroup::new("sysscope-test-rename-b");
    let mut child = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&first.dir)
        .args(["set-name", "before-exec", "getppid", "10", "wait-stdin"])
        .args(["set-name", "after-exec", "join-cgroup"])
        .arg(&second.dir)
        .args(["getppid", "1000", "wait-stdin"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The child's calls in the first cgroup carry the name it took (its name from the exec
    // was read and cached before, for its first calls), and sysscope caches this one.
    let before = [
        ("cgroup", first.rel.as_str()),
        ("comm", "before-exec"),
        ("syscall", "getppid"),
    ];
    let named = eventually(Duration::from_secs(10), || {
        (sum(
            &parse_samples(&exporter.scrape()),
            "sysscope_syscalls_total",
            &before,
        ) == 10.0)
            .then_some(())
    });
    assert!(
        named.is_some(),
        "the calls after the first rename do not carry its name"
    );
    let mut stdin = child.stdin.take().unwrap();
    use std::io::Write;
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
    // The 1000 calls in the second cgroup, under whatever name they are labelled...
    let in_second = [("cgroup", second.rel.as_str()), ("syscall", "getppid")];
    let mut samples = Vec::new();
    let counted = eventually(Duration::from_secs(10), || {
        samples = parse_samples(&exporter.scrape());
        (sum(&samples, "sysscope_syscalls_total", &in_second) == 1000.0).then_some(())
    });
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(
        counted.is_some(),
        "the second cgroup's calls were not all counted"
    );
    // ...all carry the new one.
    let after = [
        ("cgroup", second.rel.as_str()),
        ("comm", "after-exec"),
        ("syscall", "getppid"),
    ];
    assert_eq!(
        sum(&samples, "sysscope_syscalls_total", &after),
        1000.0,
        "{:?}",
        select(&samples, "sysscope_syscalls_total", &in_second)
    );
}
