//! Build information: the version, revision, build date and compiler baked in at build time
//! (exporter/build.rs sets them), for `sysscope --version`, `sysscope_build_info`, span and
//! OTLP resources. A leaf: it imports nothing from the crate, so every layer may name the
//! version without depending on the agent.

/// The crate version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The source revision: `SYSSCOPE_REVISION` at build time, else the git commit the tree was
/// built from, else "unknown" (a build outside a git checkout).
pub const REVISION: &str = env!("SYSSCOPE_BUILD_REVISION");
/// When the binary was built (RFC 3339, UTC; `SOURCE_DATE_EPOCH` when set).
pub const BUILD_DATE: &str = env!("SYSSCOPE_BUILD_DATE");
/// The compiler, as `rustc -V` prints it.
pub const RUSTC: &str = env!("SYSSCOPE_BUILD_RUSTC");
/// The target triple the binary was built for.
pub const TARGET: &str = env!("SYSSCOPE_BUILD_TARGET");

/// What `sysscope --version` prints after the name, one field per line.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\nrevision:   ",
    env!("SYSSCOPE_BUILD_REVISION"),
    "\nbuild date: ",
    env!("SYSSCOPE_BUILD_DATE"),
    "\nrustc:      ",
    env!("SYSSCOPE_BUILD_RUSTC"),
    "\ntarget:     ",
    env!("SYSSCOPE_BUILD_TARGET"),
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Built from a git checkout, the revision is that checkout's commit: never "unknown"
    /// (the release builds' complaint), and the same in `--version` and `sysscope_build_info`.
    #[test]
    fn revision_is_the_checkouts_commit() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let head = std::process::Command::new("git")
            .args(["-C", dir, "rev-parse", "--verify", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        match (option_env!("SYSSCOPE_REVISION"), head) {
            (Some(set), _) if !set.trim().is_empty() => assert_eq!(REVISION, set.trim()),
            (_, Some(head)) => assert_eq!(REVISION, head),
            (_, None) => {
                if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                    panic!("CI builds from a git checkout, but git found no HEAD in {dir}");
                }
                eprintln!("SKIPPED revision_is_the_checkouts_commit: not a git checkout");
            }
        }
        assert!(LONG_VERSION.contains(REVISION));
    }

    #[test]
    fn long_version_names_every_field() {
        let lines: Vec<&str> = LONG_VERSION.lines().collect();
        assert_eq!(lines[0], VERSION);
        assert!(lines[1].starts_with("revision:") && !lines[1].ends_with(' '));
        // 2026-11-27T14:49:00Z
        let date = lines[2].strip_prefix("build date: ").unwrap();
        assert_eq!(date.len(), 20, "{date}");
        assert!(date.ends_with('Z') && date.as_bytes()[10] == b'T', "{date}");
        assert!(lines[3].contains("rustc 1."), "{}", lines[3]);
        assert!(lines[4].ends_with("-linux-gnu"), "{}", lines[4]);
    }
}
