//! The command-line tools on the real kernel with the real probes: `summary` against
//! `strace -c -f` on the same deterministic command, `trace` output parsed as Trace Event
//! Format with exact slice counts, `diagnose` naming each scripted pattern first, `top`
//! showing a workload's cgroup (from its own probes, and from a running exporter, with TLS and
//! basic auth too), and the privilege check.

use std::{
    collections::BTreeMap,
    io::{BufReader, Write},
    path::Path,
    process::{Command, Stdio},
};

use crate::common::*;

/// (calls, errors) per syscall from a `strace -c` style table (strace's or sysscope's).
fn parse_c_table(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "% time seconds usecs/call calls [errors] syscall"
        if f.len() < 5 || f[0].starts_with('-') || f[0] == "%" {
            continue;
        }
        let Ok(calls) = f[3].parse::<u64>() else {
            continue;
        };
        let (errors, name) = if f.len() >= 6 {
            (f[4].parse().unwrap_or(0), f[5])
        } else {
            (0, f[4])
        };
        if name != "total" {
            out.insert(name.to_string(), (calls, errors));
        }
    }
    out
}

fn within(a: u64, b: u64, ratio: f64) -> bool {
    (a as f64 - b as f64).abs() <= ratio * a.max(b) as f64
}

/// `sysscope trace -q -o OUT -- COMMAND...`: (exit code, stdout, stderr).
fn trace_quietly(out: &std::path::Path, command: &[&str]) -> (i32, String, String) {
    let mut args = vec!["trace", "-q", "-o", out.to_str().unwrap(), "--"];
    args.extend_from_slice(command);
    sysscope(&args)
}

/// Runs sysscope with `args`; returns (exit code, stdout, stderr). cargo's LD_LIBRARY_PATH is
/// removed so the workload's dynamic loader makes the same calls as from a shell, and glibc
/// keeps one malloc arena so threads map and trim the same memory on every run.
fn sysscope(args: &[&str]) -> (i32, String, String) {
    run_sysscope(args, &[("MALLOC_ARENA_MAX", "1")])
}

fn scratch_file(dir: &Path, name: &str) -> String {
    dir.join(name).to_str().unwrap().to_string()
}

#[test]
fn summary_matches_strace_c_f() {
    if !require_root("summary_matches_strace_c_f") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Both runs use one copy of the workload, so they run exactly the same program.
    let workload = dir.path().join("sysscope-workload");
    std::fs::copy(workload_bin(), &workload).unwrap();
    let workload = workload.to_str().unwrap();
    let steps = |file: &str| -> Vec<String> {
        [
            "getppid",
            "20000",
            "openat-missing",
            "500",
            "write-fsync",
            file,
            "40",
            "100",
            "stat",
            "/",
            "300",
            "getppid-threads",
            "3",
            "5000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };

    // Ground truth: strace -c -f on the same command.
    let strace_out = dir.path().join("strace.txt");
    let status = Command::new("strace")
        .env_remove("LD_LIBRARY_PATH")
        .env("MALLOC_ARENA_MAX", "1")
        .arg("-c")
        .arg("-f")
        .arg("-o")
        .arg(&strace_out)
        .arg(workload)
        .args(steps(&scratch_file(dir.path(), "a")))
        .status()
        .expect("strace is installed (scripts/setup.sh --test)");
    assert!(status.success());
    let truth = parse_c_table(&std::fs::read_to_string(&strace_out).unwrap());
    // 20000 on the main thread, 3 x 5000 on three threads: -f follows threads.
    assert_eq!(truth.get("getppid"), Some(&(35000, 0)), "strace: {truth:?}");

    // The table.
    let b = scratch_file(dir.path(), "b");
    let mut args = vec!["summary", "-q", "--"];
    args.push(workload);
    let s = steps(&b);
    args.extend(s.iter().map(String::as_str));
    let (code, table, err) = sysscope(&args);
    assert_eq!(code, 0, "{err}");
    assert!(table.starts_with("% time     seconds  usecs/call     calls    errors syscall\n"));
    assert!(table.trim_end().ends_with("total"), "{table}");
    let ours = parse_c_table(&table);
    assert_eq!(ours.get("getppid"), Some(&(35000, 0)), "{table}");
    assert_eq!(ours.get("openat").map(|r| r.1), Some(500), "{table}");
    assert_eq!(ours.get("fsync"), Some(&(40, 0)), "{table}");
    for name in truth.keys().chain(ours.keys()) {
        // How often threads wait for each other (joins, the allocator's locks) depends on how
        // they interleave, which strace changes: not a count both runs must share.
        if name == "futex" {
            continue;
        }
        let t = truth.get(name).copied().unwrap_or((0, 0));
        let o = ours.get(name).copied().unwrap_or((0, 0));
        if t.0 >= 10 || o.0 >= 10 {
            assert!(
                within(t.0, o.0, 0.02),
                "{name}: strace {} calls, sysscope {}\nstrace: {truth:?}\nsysscope: {ours:?}",
                t.0,
                o.0
            );
            assert_eq!(t.1, o.1, "{name}: errors strace {} sysscope {}", t.1, o.1);
        }
    }

    // The JSON says the same.
    let c = scratch_file(dir.path(), "c");
    let mut args = vec!["summary", "-q", "--json", "-S", "calls", "--"];
    args.push(workload);
    let s = steps(&c);
    args.extend(s.iter().map(String::as_str));
    let (code, json, err) = sysscope(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("--json parses");
    let rows = v["syscalls"].as_array().unwrap();
    assert_eq!(rows[0]["syscall"], "getppid", "sorted by calls");
    let get = |name: &str| rows.iter().find(|r| r["syscall"] == name).unwrap();
    assert_eq!(get("getppid")["calls"], 35000);
    assert_eq!(get("openat")["errnos"]["ENOENT"], 500);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["target"]["kind"], "command");
    let total: u64 = rows.iter().map(|r| r["calls"].as_u64().unwrap()).sum();
    assert_eq!(v["total"]["calls"].as_u64().unwrap(), total);
}

#[test]
fn summary_propagates_exit_codes_and_removes_its_cgroup() {
    if !require_root("summary_propagates_exit_codes_and_removes_its_cgroup") {
        return;
    }
    let child = Command::new(sysscope_bin())
        .args(["summary", "-q", "--", "sh", "-c", "exit 7"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert!(!cgroup_root()
        .join(format!("sysscope-summary-{pid}"))
        .exists());
    // A missing command fails before anything runs, like a shell.
    let (code, _, err) = sysscope(&["summary", "--", "surely-not-a-command-xyz"]);
    assert_eq!(code, 127, "{err}");
    assert!(err.contains("command not found"), "{err}");
}

/// Starts `sysscope args` with stderr piped and waits for its "measuring" line.
// The caller waits for the child it gets back.
#[allow(clippy::zombie_processes)]
fn start_measuring(args: &[&str]) -> (std::process::Child, BufReader<std::process::ChildStderr>) {
    let child = Command::new(sysscope_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    until_measuring(child)
}

#[test]
fn summary_of_a_pid_and_of_a_cgroup() {
    if !require_root("summary_of_a_pid_and_of_a_cgroup") {
        return;
    }
    let cg = TestCgroup::new("sysscope-test-cli-targets");
    // The workload waits for a line, makes 3000 getppid calls, waits again, then exits.
    let mut work = cg
        .command(workload_bin())
        .args(["wait-stdin", "getppid", "3000", "wait-stdin"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = work.id().to_string();
    let (by_pid, _e1) = start_measuring(&["summary", "--json", "--pid", &pid]);
    let (by_cgroup, _e2) = start_measuring(&["summary", "--json", "--cgroup", &cg.rel]);
    let mut stdin = work.stdin.take().unwrap();
    writeln!(stdin).unwrap();
    drop(stdin);
    assert!(work.wait().unwrap().success());

    // --pid ends when the process is gone.
    let out = by_pid.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stopped"], "target gone");
    let calls = |v: &serde_json::Value, name: &str| {
        v["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["syscall"] == name)
            .map(|r| r["calls"].as_u64().unwrap())
    };
    assert_eq!(calls(&v, "getppid"), Some(3000), "{v}");

    // --cgroup runs until Ctrl-C (SIGINT), then prints what it saw.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(by_cgroup.id() as i32, libc::SIGINT) };
    let out = by_cgroup.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stopped"], "interrupted");
    assert_eq!(calls(&v, "getppid"), Some(3000), "{v}");
    assert_eq!(v["target"]["cgroup"], cg.rel.as_str());
}

fn trace_json(path: &Path) -> (serde_json::Value, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("trace parses as JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents").clone();
    (v, events)
}

#[test]
fn trace_writes_trace_event_format_with_exact_slices() {
    if !require_root("trace_writes_trace_event_format_with_exact_slices") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace.json");
    const N: usize = 2000;
    const M: usize = 7;
    let (code, _, err) = trace_quietly(
        &out,
        &[
            workload_bin(),
            "getppid",
            &N.to_string(),
            "openat-missing",
            &M.to_string(),
            "futex-contention",
            "3",
            "50",
            "sleep",
            "3",
            "100",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("nothing dropped"), "{err}");
    let (v, events) = trace_json(&out);
    let pid = v["otherData"]["target"]["pid"].as_u64().unwrap();
    let slices: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "syscall")
        .collect();
    for s in &slices {
        assert!(s["ts"].as_f64().unwrap() >= 0.0 && s["dur"].as_f64().unwrap() >= 0.0);
        assert_eq!(
            s["pid"].as_u64(),
            Some(pid),
            "only the target is traced: {s}"
        );
        assert!(s["tid"].as_u64().is_some() && s["name"].is_string());
    }
    let named = |n: &str| slices.iter().filter(|s| s["name"] == n).count();
    assert_eq!(named("getppid"), N);
    let failed: Vec<_> = slices
        .iter()
        .filter(|s| s["name"] == "openat" && s["args"]["errno"] == "ENOENT")
        .collect();
    assert_eq!(failed.len(), M);
    assert_eq!(
        failed[0]["args"]["path"],
        format!("/nonexistent-sysscope/{pid}").as_str()
    );
    assert_eq!(named("execve"), 1);
    // Metadata: the process and each of its threads (main + 3 workers) are named.
    let meta = |kind: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == kind)
            .collect()
    };
    let procs = meta("process_name");
    assert!(procs
        .iter()
        .any(|e| e["pid"].as_u64() == Some(pid) && e["args"]["name"] == WORKLOAD_COMM));
    let threads: Vec<_> = meta("thread_name")
        .into_iter()
        .filter(|e| e["pid"].as_u64() == Some(pid))
        .collect();
    assert!(threads.len() >= 4, "{threads:?}");
    let tids: std::collections::BTreeSet<u64> =
        slices.iter().map(|s| s["tid"].as_u64().unwrap()).collect();
    assert_eq!(tids.len(), threads.len());
    // CPU counter tracks (sampled every 100 ms over a run of 300 ms and more) on the node
    // track, and the drop accounting.
    let cpu: Vec<_> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "CPU utilization (%)")
        .collect();
    assert!(cpu.len() >= 2, "{cpu:?}");
    let user = cpu[0]["args"]["user"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&user));
    assert!(procs
        .iter()
        .any(|e| e["pid"] == 0 && e["args"]["name"] == "node"));
    assert_eq!(named("nanosleep"), 3);
    assert_eq!(v["otherData"]["dropped_ring_buffer_full"], 0);
    assert_eq!(v["otherData"]["dropped_over_max_events"], 0);
    assert_eq!(
        v["otherData"]["events_written"].as_u64().unwrap() as usize,
        slices.len()
    );
}

#[test]
fn trace_limits_and_text_log() {
    if !require_root("trace_limits_and_text_log") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("limited.json");
    let (code, _, err) = sysscope(&[
        "trace",
        "-q",
        "--max-events",
        "100",
        "-o",
        out.to_str().unwrap(),
        "--",
        workload_bin(),
        "getppid",
        "500",
    ]);
    assert_eq!(code, 0, "{err}");
    let (v, events) = trace_json(&out);
    let slices = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "syscall")
        .count();
    assert_eq!(slices, 100);
    let over = v["otherData"]["dropped_over_max_events"].as_u64().unwrap();
    assert!(over >= 400, "{over}");
    assert!(err.contains("over --max-events"), "{err}");

    let (code, text, err) = sysscope(&[
        "trace",
        "-q",
        "--text",
        "-o",
        "-",
        "--",
        workload_bin(),
        "getppid",
        "321",
        "openat-missing",
        "3",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| l.contains(" getppid() = ")).count(),
        321
    );
    let enoent: Vec<_> = lines
        .iter()
        .filter(|l| {
            l.contains("openat(") && l.contains("= -1 ENOENT (No such file or directory) <")
        })
        .collect();
    assert_eq!(enoent.len(), 3, "{text}");
    assert!(
        enoent[0].contains("\"/nonexistent-sysscope/"),
        "{}",
        enoent[0]
    );
    assert!(lines.last().unwrap().starts_with("# sysscope trace:"));
}

#[test]
fn diagnose_names_each_scripted_pattern_first() {
    if !require_root("diagnose_names_each_scripted_pattern_first") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = scratch_file(dir.path(), "data");
    std::fs::write(&data, vec![7u8; 4 << 20]).unwrap();
    let fsync_file = scratch_file(dir.path(), "fsync");
    let small = scratch_file(dir.path(), "small");
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("futex-contention", vec!["futex-contention", "4", "1500"]),
        ("metadata-storm", vec!["stat", "/", "20000"]),
        ("metadata-storm", vec!["openat-missing", "5000"]),
        ("open-close-churn", vec!["open-close", &data, "3000"]),
        (
            "read-dominated",
            vec!["read-file", &data, "67108864", "65536"],
        ),
        ("tiny-transfers", vec!["read-file", &data, "320000", "16"]),
        ("tiny-transfers", vec!["small-writes", &small, "20000", "8"]),
        ("mmap-heavy", vec!["mmap", "2000", "64"]),
        ("epoll-idle", vec!["epoll-wait", "20", "10"]),
        ("sleep-loop", vec!["sleep", "20", "5"]),
        (
            "fsync-per-write",
            vec!["write-fsync", &fsync_file, "100", "100"],
        ),
    ];
    for (expected, steps) in cases {
        let mut args = vec!["diagnose", "-q", "--json", "--"];
        args.push(workload_bin());
        args.extend(steps.iter().copied());
        let (code, out, err) = sysscope(&args);
        assert_eq!(code, 0, "{steps:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("diagnose --json parses");
        let verdicts = v["verdicts"].as_array().unwrap();
        assert!(!verdicts.is_empty(), "{steps:?}: no verdict\n{out}");
        assert_eq!(
            verdicts[0]["id"], expected,
            "{steps:?} should be diagnosed as {expected} first:\n{out}"
        );
        assert!(!verdicts[0]["evidence"].as_array().unwrap().is_empty());
        assert!(verdicts[0]["fix"].as_str().unwrap().len() > 20);
    }
    // The text form says the same thing, with evidence and a fix.
    let (code, text, _) = sysscope(&["diagnose", "-q", "--", workload_bin(), "sleep", "20", "5"]);
    assert_eq!(code, 0);
    assert!(text.contains("1. [sleep-loop]"), "{text}");
    assert!(
        text.contains("evidence:") && text.contains("fix:"),
        "{text}"
    );
}

#[test]
fn top_shows_the_busy_cgroup_without_a_terminal() {
    if !require_root("top_shows_the_busy_cgroup_without_a_terminal") {
        return;
    }
    let cg = TestCgroup::new("sysscope-test-top");
    let mut work = busy(&cg);
    let (code, out, err) = sysscope(&["top", "--count", "2", "--interval", "700ms", "-n", "200"]);
    let _ = work.kill();
    let _ = work.wait();
    assert_eq!(code, 0, "{err}");
    // Two frames, each with a header; the workload's cgroup with getppid as its top syscall.
    assert_eq!(out.matches("sysscope top - ").count(), 2, "{out}");
    assert_busy_row(&out, &cg);
}

/// A workload in `cg` calling getppid until killed: however long loading the probes takes on
/// a loaded machine, it is still making calls when the frames are taken.
fn busy(cg: &TestCgroup) -> std::process::Child {
    cg.command(workload_bin())
        .args(["loop-getppid", "60", "1"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// `top`'s output has a row for `cg` (the last, with several frames) with getppid in it.
fn assert_busy_row(out: &str, cg: &TestCgroup) {
    let row = out
        .lines()
        .rev()
        .find(|l| l.contains(&cg.rel))
        .unwrap_or_else(|| panic!("{} not in:\n{out}", cg.rel));
    assert!(row.contains("getppid"), "{row}");
}

#[test]
fn tools_say_when_they_lack_privileges() {
    if !require_root("tools_say_when_they_lack_privileges") {
        return;
    }
    for tool in ["summary", "trace", "diagnose"] {
        let out = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(sysscope_bin())
            .args([tool, "-o", "/dev/null", "--", "true"])
            .output()
            .expect("setpriv (util-linux)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(77), "{tool}: {err}");
        assert!(
            err.contains("CAP_BPF") && err.contains("run as root"),
            "{err}"
        );
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(sysscope_bin())
        .args(["top", "--count", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(77));
}

#[test]
fn help_has_examples() {
    for tool in ["summary", "trace", "diagnose", "top"] {
        let (code, out, _) = sysscope(&[tool, "--help"]);
        assert_eq!(code, 0);
        assert!(out.contains("Examples:"), "{tool} --help:\n{out}");
    }
    let (code, _, err) = sysscope(&["summary", "--pid", "1", "--", "true"]);
    assert_eq!(code, 2, "two targets are refused");
    assert!(err.contains("exactly one target"), "{err}");
}

#[test]
fn top_from_a_running_exporter_needs_no_privileges() {
    if !require_root("top_from_a_running_exporter_needs_no_privileges") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let cg = TestCgroup::new("sysscope-test-top-from");
    let mut work = busy(&cg);
    let url = format!("http://127.0.0.1:{}/metrics", exporter.port);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(sysscope_bin())
        .args([
            "top", "--from", &url, "--count", "1", "-i", "1s", "-n", "200",
        ])
        .output()
        .unwrap();
    let _ = work.kill();
    let _ = work.wait();
    let text = stdout_of_success(&out);
    assert_busy_row(&text, &cg);
}

#[test]
fn top_from_an_exporter_with_tls_and_basic_auth() {
    if !require_root("top_from_an_exporter_with_tls_and_basic_auth") {
        return;
    }
    let pki = crate::security::pki();
    let dir = pki.dir.path();
    // Cost 4 keeps the test fast; what is checked is that top sends the credentials.
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n\
             basic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .unwrap();
    let password_file = dir.join("password");
    std::fs::write(&password_file, "s3cret\n").unwrap();
    let port = free_port();
    let mut exporter = Exporter::spawn_on(
        port,
        TEST_CONFIG,
        &[&format!("--web.config.file={}", web.display())],
    );
    let url = format!("https://127.0.0.1:{port}/metrics");
    let https = crate::security::client(&pki.ca, None);
    exporter.wait_for(|| {
        https
            .get(&url)
            .basic_auth("prometheus", Some("s3cret"))
            .send()
            .is_ok_and(|r| r.status() == 200)
    });
    let cg = TestCgroup::new("sysscope-test-top-tls");
    let mut work = busy(&cg);
    let ca = dir.join("ca.pem").display().to_string();
    let top = |extra: &[&str], password: Option<&str>| {
        let mut command = Command::new(sysscope_bin());
        command
            .args([
                "top", "--from", &url, "--count", "1", "-i", "1s", "-n", "200",
            ])
            .args(extra)
            .env_remove("SYSSCOPE_FROM_PASSWORD");
        if let Some(password) = password {
            command.env("SYSSCOPE_FROM_PASSWORD", password);
        }
        let out = command.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let with_ca = ["--from-ca-file", ca.as_str()];
    let frames = [
        // The password from the environment, then from a file.
        top(
            &[&with_ca[..], &["--from-user", "prometheus"]].concat(),
            Some("s3cret"),
        ),
        top(
            &[
                &with_ca[..],
                &["--from-user", "prometheus", "--from-password-file"],
                &[password_file.to_str().unwrap()],
            ]
            .concat(),
            None,
        ),
    ];
    // Refused: no credentials, a wrong password, a CA that did not sign the server's
    // certificate, and a user without a password.
    let no_credentials = top(&with_ca, None);
    let wrong = top(
        &[&with_ca[..], &["--from-user", "prometheus"]].concat(),
        Some("wrong"),
    );
    let stranger = dir.join("stranger.pem");
    std::fs::write(&stranger, crate::security::ca("unrelated CA").pem()).unwrap();
    let untrusted = top(
        &[
            "--from-ca-file",
            stranger.to_str().unwrap(),
            "--from-user",
            "prometheus",
        ],
        Some("s3cret"),
    );
    let no_password = top(
        &[&with_ca[..], &["--from-user", "prometheus"]].concat(),
        None,
    );
    let _ = work.kill();
    let _ = work.wait();
    for (code, out, err) in &frames {
        assert_eq!(*code, Some(0), "{err}");
        assert_busy_row(out, &cg);
    }
    for (what, (code, _, err)) in [("no credentials", &no_credentials), ("wrong", &wrong)] {
        assert_eq!(*code, Some(1), "{what}: {err}");
        assert!(err.contains("401"), "{what}: {err}");
    }
    assert_eq!(untrusted.0, Some(1), "{}", untrusted.2);
    assert!(untrusted.2.contains(&url), "{}", untrusted.2);
    assert_eq!(no_password.0, Some(2), "{}", no_password.2);
    assert!(
        no_password.2.contains("SYSSCOPE_FROM_PASSWORD"),
        "{}",
        no_password.2
    );
}

/// The args of the last sample (by time) of counter track `name`.
fn last_counter<'a>(events: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == name)
        .max_by(|a, b| {
            a["ts"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["ts"].as_f64().unwrap())
        })
        .map(|e| &e["args"])
}

/// `--pid` follows one process: its block I/O is in the trace, that of another process in
/// the same cgroup writing to the same device at the same time is not.
#[test]
fn trace_of_a_pid_has_that_process_block_io_only() {
    if !require_root("trace_of_a_pid_has_that_process_block_io_only") {
        return;
    }
    const MIB: u64 = 1 << 20;
    let dev = LoopDevice::new(32 * MIB);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pid-block.json");
    let cg = TestCgroup::new("sysscope-test-trace-pid-io");
    // Both wait for a line, then become dd (exec keeps the pid): 3 MiB for the target,
    // 2 MiB elsewhere on the device for its neighbour in the same cgroup.
    let spawn_dd = |count: u64, seek: u64| {
        cg.command("sh")
            .arg("-c")
            .arg(format!(
                "read line; exec dd if=/dev/zero of={} bs=1M count={count} seek={seek} \
                 oflag=direct 2>/dev/null",
                dev.path
            ))
            .stdin(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut target = spawn_dd(3, 0);
    let mut neighbour = spawn_dd(2, 16);
    let pid = target.id().to_string();
    let (tracer, _err) = start_measuring(&["trace", "-o", out.to_str().unwrap(), "--pid", &pid]);
    for child in [&mut neighbour, &mut target] {
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin).unwrap();
    }
    assert!(neighbour.wait().unwrap().success());
    assert!(target.wait().unwrap().success());
    // --pid ends when the process is gone.
    let done = tracer.wait_with_output().unwrap();
    assert_eq!(done.status.code(), Some(0));

    let (_, events) = trace_json(&out);
    let bytes = last_counter(&events, &format!("{} bytes", dev.name))
        .unwrap_or_else(|| panic!("no `{} bytes` counter track", dev.name));
    assert_eq!(bytes["write"].as_u64(), Some(3 * MIB), "{bytes}");
    let slices: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| {
            e["ph"] == "X" && e["cat"] == "block" && e["args"]["device"] == dev.name.as_str()
        })
        .collect();
    let slice_bytes: u64 = slices
        .iter()
        .map(|s| s["args"]["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(slice_bytes, 3 * MIB);
    assert!(
        slices
            .iter()
            .all(|s| s["args"]["pid"].as_u64() == Some(target.id() as u64)),
        "a slice of another process: {slices:?}"
    );
}

#[test]
fn trace_has_the_targets_block_io_only() {
    if !require_root("trace_has_the_targets_block_io_only") {
        return;
    }
    const MIB: u64 = 1024 * 1024;
    const M_MIB: u64 = 8;
    let dev = LoopDevice::new(64 * MIB);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("block.json");
    // The exporter counts the same requests its own way (every cgroup, labelled), to
    // cross-check the number of requests the kernel issued. Its series budget is unbounded:
    // every process of the machine (other tests' too) is visible to it, and none of dd's
    // series may be folded.
    let exporter = Exporter::start(
        "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n",
        &[],
    );

    // Another workload writes to the same device, in its own cgroup, all along the trace.
    let other = TestCgroup::new("sysscope-test-trace-other-io");
    let rounds = dir.path().join("rounds");
    let mut noise = other
        .command("sh")
        .arg("-c")
        .arg(format!(
            "while :; do dd if=/dev/zero of={} bs=64k count=16 seek=512 oflag=direct \
             2>/dev/null; echo >> {}; done",
            dev.path,
            rounds.display()
        ))
        .spawn()
        .unwrap();
    let rounds_done = || {
        std::fs::read_to_string(&rounds)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    while rounds_done() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let before = rounds_done();

    // The target: exactly M MiB written with O_DIRECT, then read back with O_DIRECT.
    let script = format!(
        "dd if=/dev/zero of={d} bs=1M count={M_MIB} oflag=direct 2>/dev/null && \
         dd if={d} of=/dev/null bs=1M count={M_MIB} iflag=direct 2>/dev/null",
        d = dev.path
    );
    let (code, _, err) = trace_quietly(&out, &["sh", "-c", &script]);
    let during = rounds_done() - before;
    let _ = noise.kill();
    let _ = noise.wait();
    assert_eq!(code, 0, "{err}");
    assert!(during > 0, "the other workload did no I/O during the trace");
    assert!(!err.contains("no block I/O tracks"), "{err}");
    eprintln!("{err}");

    let (v, events) = trace_json(&out);
    let m = M_MIB * MIB;
    // Counter tracks named after the device end at exactly what dd moved: the other
    // workload's 1 MiB rounds on the same device are not the target's.
    let bytes = last_counter(&events, &format!("{} bytes", dev.name))
        .unwrap_or_else(|| panic!("no `{} bytes` counter track: {err}", dev.name));
    assert_eq!(bytes["write"].as_u64(), Some(m), "{bytes}");
    assert_eq!(bytes["read"].as_u64(), Some(m), "{bytes}");
    let requests = last_counter(&events, &format!("{} requests", dev.name)).unwrap();
    let (w_req, r_req) = (
        requests["write"].as_u64().unwrap(),
        requests["read"].as_u64().unwrap(),
    );
    // At least one request per 1 MiB call, whatever the device splits them into.
    assert!(w_req >= M_MIB && r_req >= M_MIB, "{requests}");
    // The exporter saw the same number of dd requests on the device outside the other
    // workload's cgroup (reads by udev probing the device are not dd's).
    let exporter_requests = |samples: &[Sample], op: &str| {
        let of = |extra: &[(&str, &str)]| {
            let mut want = vec![("device", dev.name.as_str()), ("op", op), ("comm", "dd")];
            want.extend_from_slice(extra);
            sum(samples, "sysscope_block_io_requests_total", &want) as u64
        };
        of(&[]) - of(&[("cgroup", other.rel.as_str())])
    };
    // The trace removes its cgroup when it ends, often before the exporter has read the
    // cgroup's path: the exporter then holds those requests back for its grace period (10 s)
    // before counting them as `cgroup="(unresolved)"`, so wait longer than that.
    let seen = eventually(std::time::Duration::from_secs(25), || {
        let s = parse_samples(&exporter.scrape());
        (exporter_requests(&s, "write") == w_req && exporter_requests(&s, "read") == r_req)
            .then_some(())
    });
    if seen.is_none() {
        let text = exporter.scrape();
        let s = parse_samples(&text);
        let block: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("sysscope_block_io_requests_total")
                    || l.starts_with("sysscope_collector_up")
                    || l.contains("block_")
                        && (l.starts_with("sysscope_map") || l.starts_with("sysscope_probe"))
            })
            .collect();
        panic!(
            "requests: trace write {w_req} read {r_req}, exporter write {} read {}; the \
             exporter's block I/O:\n{}",
            exporter_requests(&s, "write"),
            exporter_requests(&s, "read"),
            block.join("\n")
        );
    }
    // The counters start at zero at the trace's start.
    let first = events
        .iter()
        .find(|e| e["ph"] == "C" && e["name"] == format!("{} bytes", dev.name).as_str())
        .unwrap();
    assert_eq!(first["ts"].as_f64(), Some(0.0));
    assert_eq!(first["args"]["write"].as_u64(), Some(0));

    // One slice per request, on tracks named after the device, all of them dd's.
    let block_pid = events
        .iter()
        .find(|e| e["ph"] == "M" && e["args"]["name"] == "block I/O of the target")
        .expect("block process named")["pid"]
        .as_u64()
        .unwrap();
    let lanes: BTreeMap<u64, String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == block_pid)
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        lanes.values().any(|n| n == &dev.name),
        "device track names: {lanes:?}"
    );
    let slices: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "block")
        .collect();
    for op in ["write", "read"] {
        let of_op: Vec<_> = slices
            .iter()
            .filter(|s| s["name"] == op && s["args"]["device"] == dev.name.as_str())
            .collect();
        let sum: u64 = of_op
            .iter()
            .map(|s| s["args"]["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, m, "{op}: slices hold {sum} bytes");
        let expected = if op == "write" { w_req } else { r_req };
        assert_eq!(of_op.len() as u64, expected, "{op}: slices vs requests");
        for s in &of_op {
            assert_eq!(s["args"]["comm"], "dd", "{s}");
            assert!(lanes[&s["tid"].as_u64().unwrap()].starts_with(&dev.name));
            assert!(s["dur"].as_f64().unwrap() >= 0.0 && s["args"]["sector"].is_u64());
        }
    }
    // Slices of one track never overlap (viewers need them nested).
    let mut by_lane: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for s in &slices {
        let ts = s["ts"].as_f64().unwrap();
        by_lane
            .entry(s["tid"].as_u64().unwrap())
            .or_default()
            .push((ts, ts + s["dur"].as_f64().unwrap()));
    }
    for spans in by_lane.values_mut() {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0 + 1e-3, "overlap: {w:?}");
        }
    }
    let totals = &v["otherData"]["block_io"];
    assert_eq!(
        totals["totals"][&dev.name]["write"]["bytes"].as_u64(),
        Some(m)
    );
    assert_eq!(totals["requests_dropped_over_max_events"], 0);
    assert_eq!(
        v["otherData"]["block_io_requests_dropped_ring_buffer_full"],
        0
    );
    // The syscalls are still all there: each dd reads and writes M_MIB blocks of 1 MiB.
    for call in ["read", "write"] {
        let n = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == "syscall" && e["name"] == call)
            .filter(|e| e["args"]["ret"].as_u64() == Some(MIB))
            .count();
        assert_eq!(n as u64, 2 * M_MIB, "{call}");
    }

    // The text log ends with the totals.
    let (code, text, err) = sysscope(&[
        "trace", "-q", "--text", "-o", "-", "--", "sh", "-c", &script,
    ]);
    assert_eq!(code, 0, "{err}");
    for op in ["write", "read"] {
        let line = format!("# block I/O {} {op}: {m} bytes in ", dev.name);
        assert!(text.lines().any(|l| l.starts_with(&line)), "{text}");
    }
}

#[test]
fn trace_without_block_tracepoints_still_traces_syscalls() {
    if !require_root("trace_without_block_tracepoints_still_traces_syscalls") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("noblock.json");
    // The kernel's own attach failure, injected for the completion program.
    let run = Command::new(sysscope_bin())
        .env("SYSSCOPE_FAULT_ATTACH", "block_rq_complete")
        .args(["trace", "-q", "-o", out.to_str().unwrap(), "--"])
        .args([workload_bin(), "getppid", "50"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(
        err.contains("no block I/O tracks") && err.contains("block_rq_complete"),
        "{err}"
    );
    let (v, events) = trace_json(&out);
    let getppid = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "getppid")
        .count();
    assert_eq!(getppid, 50);
    assert!(v["otherData"]["block_io_off"]
        .as_str()
        .unwrap()
        .contains("block_rq_complete"));
    assert!(!events.iter().any(|e| e["cat"] == "block"));
}

/// `summary --by-fd`: the reads and writes of a command broken down by what they read or
/// wrote, exactly as the command made them, and summing to the syscall's row.
#[test]
fn summary_breaks_reads_and_writes_down_by_descriptor() {
    if !require_root("summary_breaks_reads_and_writes_down_by_descriptor") {
        return;
    }
    let shm = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
    std::fs::write(shm.path(), vec![b'z'; 64]).unwrap();
    let shm_path = shm.path().to_str().unwrap();
    let steps = ["fd-kinds", shm_path, "40", "50", "60"];
    let mut args = vec!["summary", "-q", "--json", "--by-fd", "--", workload_bin()];
    args.extend(steps);
    let (code, json, err) = sysscope(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("--json parses");
    let by_fd = v["by_fd"].as_array().expect("by_fd rows");
    let calls = |syscall: &str, kind: &str, fs: Option<&str>| {
        by_fd
            .iter()
            .filter(|r| r["syscall"] == syscall && r["fd_kind"] == kind)
            .filter(|r| fs.is_none_or(|fs| r["fs"] == fs))
            .map(|r| r["calls"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(calls("read", "file", Some("tmpfs")), 40, "{by_fd:?}");
    assert_eq!(calls("read", "pipe", None), 50, "{by_fd:?}");
    assert_eq!(calls("read", "socket", None), 60, "{by_fd:?}");
    assert_eq!(calls("write", "pipe", None), 50, "{by_fd:?}");
    assert_eq!(calls("write", "socket", None), 60, "{by_fd:?}");
    // The breakdown of read sums to read's row (the dynamic loader's reads of the libraries
    // are files too).
    let rows = v["syscalls"].as_array().unwrap();
    let read_row = rows.iter().find(|r| r["syscall"] == "read").unwrap();
    let read_by_fd: u64 = by_fd
        .iter()
        .filter(|r| r["syscall"] == "read")
        .map(|r| r["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(read_row["calls"].as_u64().unwrap(), read_by_fd);

    // The table has a second part with the same rows.
    let mut args = vec!["summary", "-q", "--by-fd", "--", workload_bin()];
    args.extend(steps);
    let (code, table, err) = sysscope(&args);
    assert_eq!(code, 0, "{err}");
    let pipe_line = table
        .lines()
        .find(|l| l.ends_with(" read on pipe"))
        .unwrap_or_else(|| panic!("no `read on pipe` line:\n{table}"));
    let fields: Vec<&str> = pipe_line.split_whitespace().collect();
    assert_eq!(fields[3], "50", "{pipe_line}");
    assert!(table.contains(" read on file (tmpfs)"), "{table}");
}

/// `trace`: every read and write slice says what its descriptor was (`fd_kind`, `fs`).
#[test]
fn trace_slices_name_the_descriptor_kind() {
    if !require_root("trace_slices_name_the_descriptor_kind") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fd.json");
    let shm = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
    std::fs::write(shm.path(), vec![b'z'; 64]).unwrap();
    let (code, _, err) = trace_quietly(
        &out,
        &[
            workload_bin(),
            "fd-kinds",
            shm.path().to_str().unwrap(),
            "3",
            "4",
            "5",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (_, events) = trace_json(&out);
    let slices = |name: &str, kind: &str, fs: Option<&str>| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == name && e["args"]["fd_kind"] == kind)
            .filter(|e| fs.is_none_or(|fs| e["args"]["fs"] == fs))
            .count()
    };
    assert_eq!(slices("read", "file", Some("tmpfs")), 3);
    assert_eq!(slices("read", "pipe", None), 4);
    assert_eq!(slices("read", "socket", None), 5);
    assert_eq!(slices("write", "socket", None), 5);
    // Calls without a descriptor carry neither.
    assert!(events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "getppid" || e["name"] == "openat")
        .all(|e| e["args"]["fd_kind"].is_null()));
}

/// `diagnose` tells waiting on a pipe (its writer is the bottleneck) from reading data: a
/// process that reads its stdin, fed a byte every 25 ms by this test, is diagnosed as waiting
/// on a pipe, with the read time by descriptor in the evidence.
#[test]
fn diagnose_tells_a_pipe_wait_from_reading_data() {
    if !require_root("diagnose_tells_a_pipe_wait_from_reading_data") {
        return;
    }
    let mut work = Command::new(workload_bin())
        .arg("wait-stdin")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = work.id().to_string();
    let (diagnose, _err) = start_measuring(&["diagnose", "--json", "--pid", &pid]);
    let mut stdin = work.stdin.take().unwrap();
    for _ in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(25));
        stdin.write_all(b"x").unwrap();
        stdin.flush().unwrap();
    }
    writeln!(stdin).unwrap();
    drop(stdin);
    assert!(work.wait().unwrap().success());
    let out = diagnose.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let first = &v["verdicts"][0];
    assert_eq!(first["id"], "waiting-on-pipe", "{v:#}");
    assert!(
        first["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().contains("% pipe")),
        "{first:#}"
    );
}
