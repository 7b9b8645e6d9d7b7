//! What sysscope needs of the kernel and how it says so: the kernel's BTF from a file
//! (`--btf.path`) when `/sys/kernel/btf` is not visible, as in a container without the mount.

use std::process::Command;

use crate::common::*;

/// Runs the exporter in a mount namespace where `/sys/kernel/btf` is an empty tmpfs.
const HIDE_BTF: &[&str] = &[
    "unshare",
    "--mount",
    "--",
    "sh",
    "-c",
    "mount -t tmpfs none /sys/kernel/btf && exec \"$0\" \"$@\"",
];

#[test]
fn btf_path_replaces_a_hidden_sys_kernel_btf() {
    if !require_root("btf_path_replaces_a_hidden_sys_kernel_btf") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("vmlinux");
    std::fs::copy("/sys/kernel/btf/vmlinux", &copy).unwrap();
    let config = "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n";

    // Without the file: refused, saying what is missing and what to do.
    let out = Command::new(HIDE_BTF[0])
        .args(&HIDE_BTF[1..])
        .arg(sysscope_bin())
        .arg("--config.check")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("/sys/kernel/btf/vmlinux") && err.contains("--btf.path"),
        "{err}"
    );

    // With a copy of it: the probes load, attach and count a child's calls exactly.
    let port = free_port();
    let btf_arg = format!("--btf.path={}", copy.display());
    let mut exporter = Exporter::spawn_wrapped(port, config, &[&btf_arg], &[], HIDE_BTF);
    exporter.wait_ready(std::time::Duration::from_secs(60));
    let cg = TestCgroup::new("sysscope-test-btf-path");
    run_workload_joined(&cg, &["getppid", "4321"]);
    let samples = parse_samples(&exporter.scrape());
    assert_eq!(
        sum(
            &samples,
            "sysscope_syscalls_total",
            &[("cgroup", cg.rel.as_str()), ("syscall", "getppid")]
        ),
        4321.0
    );
    // The block probes' offsets came from the file too.
    assert_eq!(
        sum(
            &samples,
            "sysscope_collector_up",
            &[("collector", "block_io")]
        ),
        1.0
    );
}

#[test]
fn a_bad_btf_path_is_named() {
    if !require_root("a_bad_btf_path_is_named") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, [0xde, 0xad, 0xbe, 0xef].repeat(64)).unwrap();
    for (path, problem) in [
        (dir.path().join("missing"), "No such file"),
        (garbage, "is not BTF"),
    ] {
        let out = Command::new(sysscope_bin())
            .arg(format!("--btf.path={}", path.display()))
            .arg("--config.check")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--btf.path")
                && err.contains(path.to_str().unwrap())
                && err.contains(problem),
            "{err}"
        );
    }
}

/// A kernel without a feature the probes need is named with the feature and the kernel that
/// brought it (here an older kernel's verifier refusal, injected for `sys_enter`), by
/// `--config.check` (non-zero) and in the start-up log alike.
#[test]
fn a_missing_kernel_feature_is_named_with_its_kernel() {
    if !require_root("a_missing_kernel_feature_is_named_with_its_kernel") {
        return;
    }
    let out = Command::new(sysscope_bin())
        .arg("--config.check")
        .env(
            sysscope::kernel::features::FAULT_ENV,
            "sys_enter=task_storage",
        )
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("lacks task-local storage for tracing programs")
            && text.contains("Linux 5.13+")
            && text.contains("`sys_enter`"),
        "{text}"
    );
    // The kernel's own words follow, short: not a whole verifier dump.
    assert!(
        text.contains("cannot use helper bpf_task_storage_get"),
        "{text}"
    );
}
