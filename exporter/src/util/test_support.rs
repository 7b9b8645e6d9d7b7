//! What a test needs of the machine it runs on, checked one way for the unit tests (this file
//! is a `#[cfg(test)]` module of the library) and the integration tests (which include it by
//! path): without it the test is skipped with a message, except under `CI=true`, where a
//! skipped test would hide a broken pipeline, so it fails instead.

/// Whether `test` can run, needing `what` (e.g. "root to load eBPF programs"), which this
/// machine has when `met`.
pub(crate) fn require(test: &str, what: &str, met: bool) -> bool {
    if met {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{test}: needs {what}, and CI=true forbids skipping");
    }
    eprintln!("SKIPPED {test}: needs {what}");
    false
}

/// Whether `test`, which loads eBPF programs or creates maps, can run: it needs root.
pub(crate) fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    require(
        test,
        "root to load eBPF programs (run the suite as root)",
        root,
    )
}
