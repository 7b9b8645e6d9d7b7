//! Builds the eBPF object (`ebpf/probes`, nightly, bpfel target) that the exporter embeds, and
//! records what `sysscope --version` and `sysscope_build_info` report: the source revision, the
//! build date and the compiler.
//!
//! Set `AYA_BUILD_SKIP=1` to build user space alone (e.g. for `cargo doc`); the binary then
//! refuses to load probes.
//!
//! The revision is `SYSSCOPE_REVISION` when set (a build from a source tarball, or a release
//! script that marks a dirty tree), else the commit git reports for this checkout, else
//! "unknown". The date is `SOURCE_DATE_EPOCH` when set (reproducible builds), else the time this
//! script ran.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    build_info(&manifest_dir);
    let probes_dir = manifest_dir.join("../ebpf/probes").canonicalize()?;
    let abi_dir = manifest_dir.join("../ebpf/abi").canonicalize()?;
    println!("cargo:rerun-if-changed={}", abi_dir.display());
    let probes_dir = probes_dir.to_str().expect("utf-8 path");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "sysscope-probes",
            root_dir: probes_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}

fn build_info(manifest_dir: &Path) {
    println!("cargo:rerun-if-env-changed=SYSSCOPE_REVISION");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let revision = match std::env::var("SYSSCOPE_REVISION") {
        Ok(r) if !r.trim().is_empty() => r.trim().to_string(),
        _ => git_revision(manifest_dir).unwrap_or_else(|| "unknown".into()),
    };
    println!("cargo:rustc-env=SYSSCOPE_BUILD_REVISION={revision}");

    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        });
    let date = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(epoch));
    println!("cargo:rustc-env=SYSSCOPE_BUILD_DATE={date}");

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SYSSCOPE_BUILD_RUSTC={rustc_version}");
    println!(
        "cargo:rustc-env=SYSSCOPE_BUILD_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
}

/// HEAD's commit, and the files whose change means HEAD moved (so cargo reruns this script
/// after a commit or a checkout). None outside a git checkout or without git.
fn git_revision(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let revision = git(&["rev-parse", "--verify", "HEAD"])?;
    // HEAD names a branch; the branch's own ref moves on each commit; packed-refs when git
    // packs it. Worktrees keep HEAD apart from the shared refs: git resolves both paths.
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched.into_iter().flatten() {
        let path = dir.join(path);
        // A path that does not exist would make cargo rerun this script on every build.
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Some(revision)
}
