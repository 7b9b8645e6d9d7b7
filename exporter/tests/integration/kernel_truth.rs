//! What the kernel really did, where the raw syscall tracepoints alone mislead: calls a seccomp
//! filter denies (they reach `sys_exit` without a `sys_enter`), a new task's first return from
//! `fork`, interrupted calls and `rt_sigreturn`'s restored "return value". Real probes on the
//! real kernel; the ground truth is what the workload knows it did, and `strace -c -f` on the
//! same program.

use std::{collections::BTreeMap, process::Command};

use crate::common::*;

/// As the exact-count tests of `syscalls`: the budget must not fold this test's series.
const ISOLATED: &str = "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n";

/// (calls, errors) per syscall of a `strace -c` table.
fn strace_table(text: &str) -> BTreeMap<String, (u64, u64)> {
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

/// `strace -c -f` of the workload with `args`: (calls, errors) per syscall.
fn strace_of_workload(args: &[&str]) -> BTreeMap<String, (u64, u64)> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("strace.txt");
    let status = Command::new("strace")
        .args(["-c", "-f", "-o"])
        .arg(&out)
        .arg(workload_bin())
        .args(args)
        .status()
        .expect("strace is installed (scripts/setup.sh --test)");
    assert!(status.success(), "strace {args:?}: {status}");
    strace_table(&std::fs::read_to_string(&out).unwrap())
}

fn missed_exits(samples: &[Sample]) -> f64 {
    sum(
        samples,
        "sysscope_probe_missed_events_total",
        &[("reason", "syscall_exit_without_enter")],
    )
}

/// The cgroup's series of `metric` for `syscall` (and `errno`, when given), summed.
fn of(samples: &[Sample], cg: &TestCgroup, metric: &str, syscall: &str, errno: &str) -> f64 {
    let mut want = vec![("cgroup", cg.rel.as_str()), ("syscall", syscall)];
    if !errno.is_empty() {
        want.push(("errno", errno));
    }
    sum(samples, metric, &want)
}

fn context(text: &str, cg: &TestCgroup) -> String {
    text.lines()
        .filter(|l| l.contains(cg.rel.as_str()) && !l.contains("_bucket"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A call a seccomp filter denies never reaches `sys_enter` (seccomp runs first); it is still
/// a call the process made, with the errno the filter chose: counted exactly, as strace counts
/// it.
#[test]
fn calls_a_seccomp_filter_denies_are_counted_with_their_errno() {
    if !require_root("calls_a_seccomp_filter_denies_are_counted_with_their_errno") {
        return;
    }
    const N: u64 = 1000;
    let n = N.to_string();
    let truth = strace_of_workload(&["seccomp-getppid", &n]);
    assert_eq!(truth.get("getppid"), Some(&(N, N)), "strace: {truth:?}");

    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-seccomp");
    run_workload_joined(&cg, &["seccomp-getppid", &n]);
    let text = exporter.scrape();
    let samples = parse_samples(&text);
    let calls = of(&samples, &cg, "sysscope_syscalls_total", "getppid", "");
    let eperm = of(
        &samples,
        &cg,
        "sysscope_syscall_errors_total",
        "getppid",
        "EPERM",
    );
    eprintln!("seccomp-denied getppid: strace {truth:?}; sysscope calls {calls}, EPERM {eperm}");
    let series = context(&text, &cg);
    assert_eq!(
        (calls, eperm),
        (N as f64, N as f64),
        "getppid calls and EPERM errors; the cgroup's series:\n{series}"
    );
    // No duration was seen: every denied call lies in the first bucket.
    assert_eq!(
        of(
            &samples,
            &cg,
            "sysscope_syscall_duration_seconds_count",
            "getppid",
            ""
        ),
        N as f64
    );
    // Every other call the workload made after joining (the filter's prctl calls, its exit)
    // is counted too; no error but the filter's.
    assert_eq!(
        of(&samples, &cg, "sysscope_syscalls_total", "prctl", ""),
        truth["prctl"].0 as f64,
        "prctl; the cgroup's series:\n{series}"
    );
    assert_eq!(
        sum(
            &samples,
            "sysscope_syscall_errors_total",
            &[("cgroup", cg.rel.as_str())]
        ),
        N as f64,
        "errors; the cgroup's series:\n{series}"
    );
}

/// A forked child returns from `fork` without having entered it: no call, and no missed
/// event. (Before, every child counted one missed event, so the counter tracked the fork rate
/// and hid real losses.)
#[test]
fn a_new_tasks_first_return_is_not_a_missed_event() {
    if !require_root("a_new_tasks_first_return_is_not_a_missed_event") {
        return;
    }
    const N: u64 = 500;
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-forks");
    let before = missed_exits(&parse_samples(&exporter.scrape()));
    run_workload(&cg, &["fork-children", &N.to_string(), "3", "forked"]);
    let text = exporter.scrape();
    let samples = parse_samples(&text);
    let after = missed_exits(&samples);
    let forks = of(&samples, &cg, "sysscope_syscalls_total", "clone", "")
        + of(&samples, &cg, "sysscope_syscalls_total", "fork", "")
        + of(&samples, &cg, "sysscope_syscalls_total", "clone3", "");
    eprintln!(
        "{N} children: missed exits {before} -> {after}; fork calls counted {forks}; getppid {}",
        getppid_calls(&samples, &cg)
    );
    assert_eq!(getppid_calls(&samples, &cg), 3.0 * N as f64);
    // The parent's calls are counted once each, the children's first returns not at all.
    assert_eq!(forks, N as f64, "{}", context(&text, &cg));
    assert_eq!(
        after - before,
        0.0,
        "exits without entry counted while {N} children started (node-wide)"
    );
}

/// `pause()` ended by a handled signal without SA_RESTART: the process sees EINTR; the kernel's
/// exit says ERESTARTNOHAND (its restart code, turned into EINTR at signal delivery), which is
/// the name sysscope keeps. The `rt_sigreturn` of each handler returns the interrupted call's
/// restored -EINTR: no error of its own.
#[test]
fn interrupted_calls_keep_their_restart_code_and_sigreturn_no_error() {
    if !require_root("interrupted_calls_keep_their_restart_code_and_sigreturn_no_error") {
        return;
    }
    const N: u64 = 100;
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-pause");
    run_workload_joined(&cg, &["pause-interrupted", &N.to_string()]);
    let text = exporter.scrape();
    let samples = parse_samples(&text);
    let series = context(&text, &cg);
    let pause = of(&samples, &cg, "sysscope_syscalls_total", "pause", "");
    let restart = of(
        &samples,
        &cg,
        "sysscope_syscall_errors_total",
        "pause",
        "ERESTARTNOHAND",
    );
    let sigreturn = of(&samples, &cg, "sysscope_syscalls_total", "rt_sigreturn", "");
    let sigreturn_errors = of(
        &samples,
        &cg,
        "sysscope_syscall_errors_total",
        "rt_sigreturn",
        "",
    );
    eprintln!(
        "{N} interrupted pauses: pause {pause}, ERESTARTNOHAND {restart}, rt_sigreturn \
         {sigreturn}, its errors {sigreturn_errors}"
    );
    assert_eq!(pause, N as f64, "{series}");
    assert_eq!(restart, N as f64, "{series}");
    assert_eq!(sigreturn, N as f64, "{series}");
    assert_eq!(sigreturn_errors, 0.0, "{series}");
}

/// A signal that interrupts user code: `rt_sigreturn` restores whatever the return register
/// held, here -22 (-EINVAL) kept there by a spin loop, 1,000 times a second. No error.
#[test]
fn sigreturn_of_a_register_holding_an_errno_records_no_error() {
    if !require_root("sigreturn_of_a_register_holding_an_errno_records_no_error") {
        return;
    }
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-sigreturn");
    let out = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&cg.dir)
        .args(["spin-errno-register", "1000"])
        .output()
        .expect("spawn workload");
    assert!(out.status.success(), "workload: {out:?}");
    let signals: f64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("signals="))
        .and_then(|v| v.parse().ok())
        .expect("workload prints signals=");
    let text = exporter.scrape();
    let samples = parse_samples(&text);
    let sigreturn = of(&samples, &cg, "sysscope_syscalls_total", "rt_sigreturn", "");
    let errors = sum(
        &samples,
        "sysscope_syscall_errors_total",
        &[("cgroup", cg.rel.as_str())],
    );
    eprintln!("spin with -22 in the register: {signals} signals, rt_sigreturn {sigreturn}, errors {errors}");
    assert!(signals >= 10.0, "only {signals} signals in a second");
    assert_eq!(sigreturn, signals, "{}", context(&text, &cg));
    assert_eq!(errors, 0.0, "{}", context(&text, &cg));
}

/// The 32-bit (ia32) program of the tests below: `N` (its first argument) `getppid` calls
/// through `syscall(2)`, so the C library cannot answer any from a cache; then `F` (its
/// second, if any) children forked one after another, each making one `getppid` and ending
/// with `_exit` (`exit_group`). Returning from `main` ends it with `exit_group`.
const GETPPID_32: &str = r#"
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 0;
    long forks = argc > 2 ? atol(argv[2]) : 0;
    for (long i = 0; i < n; i++)
        syscall(SYS_getppid);
    for (long i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            syscall(SYS_getppid);
            _exit(0);
        }
        int status;
        if (waitpid(pid, &status, 0) != pid || status != 0)
            return 1;
    }
    return 0;
}
"#;

/// Builds [`GETPPID_32`] with `gcc -m32 -static` into `dir`; `None` where this machine cannot
/// (not x86_64, or no 32-bit C library: `gcc-N-multilib`, installed by `scripts/setup.sh --test`).
fn build_32_bit_getppid(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let src = dir.join("getppid32.c");
    let bin = dir.join("getppid32");
    std::fs::write(&src, GETPPID_32).unwrap();
    let out = Command::new("gcc")
        // gcc-N-multilib, not gcc-multilib (which conflicts with the arm64 cross compiler
        // the VM matrix needs), so no /usr/include/asm link: the kernel's asm headers are
        // taken from the native directory, which serves -m32 too.
        .args([
            "-m32",
            "-static",
            "-O1",
            "-idirafter",
            "/usr/include/x86_64-linux-gnu",
            "-o",
        ])
        .arg(&bin)
        .arg(&src)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("gcc -m32: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    Some(bin)
}

/// An ia32 process on x86_64 calls through the compat table, whose numbers mean other calls
/// natively (i386 `getppid`, 64, is x86_64 `semget`; i386 `exit_group`, 252, is
/// `ioprio_get`). Its calls are counted under their own names, in the same series a 64-bit
/// process's would be, and its `exit_group` is counted at entry like a native one.
#[test]
fn calls_of_a_32_bit_process_are_named_from_its_table() {
    const TEST: &str = "calls_of_a_32_bit_process_are_named_from_its_table";
    if !require_root(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ia32_getppid_or_skip(TEST, dir.path()) else {
        return;
    };
    const N: u64 = 1000;
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-ia32");
    let status = cg
        .command(&bin)
        .arg(N.to_string())
        .status()
        .expect("spawn the 32-bit program");
    assert!(status.success(), "32-bit getppid: {status}");
    let text = exporter.scrape();
    let samples = parse_samples(&text);
    let series = context(&text, &cg);
    let calls = |name: &str| of(&samples, &cg, "sysscope_syscalls_total", name, "");
    eprintln!(
        "32-bit process, {N} getppid: getppid {}, semget {}, exit_group {}, ioprio_get {}; the \
         cgroup's series:\n{series}",
        calls("getppid"),
        calls("semget"),
        calls("exit_group"),
        calls("ioprio_get")
    );
    assert_eq!(
        calls("getppid"),
        N as f64,
        "getppid; the cgroup's series:\n{series}"
    );
    assert_eq!(
        calls("semget"),
        0.0,
        "semget; the cgroup's series:\n{series}"
    );
    assert_eq!(
        calls("exit_group"),
        1.0,
        "exit_group; the cgroup's series:\n{series}"
    );
    assert_eq!(
        calls("ioprio_get"),
        0.0,
        "ioprio_get; the cgroup's series:\n{series}"
    );
    assert_eq!(
        calls("invalid"),
        0.0,
        "invalid; the cgroup's series:\n{series}"
    );
}

/// The children of a 32-bit process return from its compat `clone` (or `fork`) without having
/// entered it: neither a call nor a missed event, as for a 64-bit parent; the parent's calls
/// are counted once each, under the native names. A 64-bit `execve` of a 32-bit program ends
/// as the i386 one, and is still one call with no missed event.
#[test]
fn a_32_bit_processs_children_first_return_is_no_call() {
    const TEST: &str = "a_32_bit_processs_children_first_return_is_no_call";
    if !require_root(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ia32_getppid_or_skip(TEST, dir.path()) else {
        return;
    };
    const F: u64 = 200;
    const EXECS: u64 = 200;
    let exporter = Exporter::start(ISOLATED, &[]);
    let cg = TestCgroup::new("sysscope-test-ia32-forks");
    let before = missed_exits(&parse_samples(&exporter.scrape()));
    let status = cg
        .command(&bin)
        .args(["0", &F.to_string()])
        .status()
        .expect("spawn the 32-bit program");
    assert!(status.success(), "32-bit forks: {status}");
    // 64-bit children exec'ing the 32-bit program: an exec that is switched out ends as the
    // i386 `execve`, and must still close its entry (no missed event).
    for _ in 0..EXECS {
        let status = cg.command(&bin).status().expect("spawn the 32-bit program");
        assert!(status.success(), "32-bit exec: {status}");
    }
    let text = exporter.scrape();
    let samples = parse_samples(&text);
    let series = context(&text, &cg);
    let calls = |name: &str| of(&samples, &cg, "sysscope_syscalls_total", name, "");
    let forks = calls("clone") + calls("fork") + calls("clone3");
    let after = missed_exits(&samples);
    eprintln!(
        "32-bit process, {F} children, {EXECS} execs: fork calls {forks}, getppid {}, execve {}, \
         exit_group {}, missed exits {before} -> {after}",
        calls("getppid"),
        calls("execve"),
        calls("exit_group")
    );
    assert_eq!(
        forks, F as f64,
        "fork calls; the cgroup's series:\n{series}"
    );
    assert_eq!(
        calls("getppid"),
        F as f64,
        "getppid; the cgroup's series:\n{series}"
    );
    assert_eq!(
        calls("execve"),
        (EXECS + 1) as f64,
        "execve; the cgroup's series:\n{series}"
    );
    assert_eq!(
        calls("exit_group"),
        (F + 1 + EXECS) as f64,
        "exit_group; the cgroup's series:\n{series}"
    );
    assert_eq!(
        after - before,
        0.0,
        "exits without entry counted while {F} 32-bit children started (node-wide)"
    );
}

/// The ia32 getppid program built in `dir`; `None` after saying why the test skips (failing
/// under CI) where it cannot be built.
fn ia32_getppid_or_skip(test: &str, dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let built = build_32_bit_getppid(dir);
    if !require(
        test,
        "gcc -m32 -static on x86_64 (gcc-N-multilib)",
        built.is_some(),
    ) {
        return None;
    }
    built
}
