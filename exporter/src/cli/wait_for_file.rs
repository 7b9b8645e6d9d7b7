//! `sysscope wait-for-file PATH`: returns once PATH exists, for an init container of an image
//! without a shell. The GPU Operator overlay runs it on the toolkit's
//! `/run/nvidia/validations/toolkit-ready`, as NVIDIA's own operands wait before they start.
//! Touches no probe, map or metric.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::parse_duration;

#[derive(Debug, clap::Args)]
pub struct WaitForFileArgs {
    /// The file to wait for.
    pub path: PathBuf,
    /// Give up after this long (exit status 1); without it, wait for as long as it takes.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// How often to look.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub interval: Duration,
}

/// Waits for the file; the exit status: 0 once it exists, 1 when the timeout passed first.
pub fn run(args: &WaitForFileArgs) -> u8 {
    let start = Instant::now();
    if !exists(&args.path) {
        tracing::info!(path = %args.path.display(), "waiting for the file");
    }
    while !exists(&args.path) {
        if args.timeout.is_some_and(|t| start.elapsed() >= t) {
            tracing::error!(path = %args.path.display(), waited = ?start.elapsed(), "the file did not appear");
            return 1;
        }
        std::thread::sleep(args.interval.max(Duration::from_millis(10)));
    }
    tracing::info!(path = %args.path.display(), waited = ?start.elapsed(), "the file exists");
    0
}

/// Whether `path` names something (a file, or whatever the writer made there).
fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(path: PathBuf, timeout: Option<Duration>) -> WaitForFileArgs {
        WaitForFileArgs {
            path,
            timeout,
            interval: Duration::from_millis(10),
        }
    }

    #[test]
    fn returns_once_the_file_appears_and_times_out_when_it_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("toolkit-ready");
        assert_eq!(
            run(&args(ready.clone(), Some(Duration::from_millis(50)))),
            1
        );
        let writer = {
            let ready = ready.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                std::fs::write(ready, "").unwrap();
            })
        };
        let start = Instant::now();
        assert_eq!(run(&args(ready, None)), 0);
        assert!(start.elapsed() >= Duration::from_millis(100));
        writer.join().unwrap();
    }
}
