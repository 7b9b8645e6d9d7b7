//! The command-line tools: `sysscope summary`, `trace`, `diagnose` and `top`; and
//! `wait-for-file`, the init step of an image without a shell.
//!
//! They answer what people use `strace -c`, `strace -f -T` and bpftrace for, from the same
//! probes as the exporter but loaded by the tool itself, for one target: a command run in a
//! fresh cgroup of its own (`-- CMD`), a process (`--pid`) or a cgroup (`--cgroup`).
//! `session` owns the target (spawning, waiting, stopping, the cgroup's removal),
//! `profile` turns the syscall maps (`SYSCALL_STATS`, `SYSCALL_ERRORS`, `PROCESS_EXITS`) into
//! per-syscall totals, `measure` hands the trace records and `block` the target's block
//! requests to `sink`, the leaf every tool implements (the streams never import a tool); one
//! module per subcommand renders the result. Every map and program is reached through the
//! kernel layer (`crate::kernel`): the tools decode, filter and render only.

pub(crate) mod block;
pub mod diagnose;
pub(crate) mod measure;
pub(crate) mod pod;
pub(crate) mod profile;
pub(crate) mod progress;
pub(crate) mod render;
pub(crate) mod session;
pub(crate) mod sink;
pub mod summary;
pub mod top;
pub mod trace;
pub mod wait_for_file;

use std::path::PathBuf;

use crate::{kernel::ProbeError, metadata::cgroups::CgroupError};

/// Exit code when the tool lacks the privileges to load probes (sysexits' EX_NOPERM).
pub(crate) const EXIT_NO_PERMISSION: u8 = 77;
/// Exit code for bad arguments.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code when the command to run cannot be found (as shells do).
pub(crate) const EXIT_NOT_FOUND: u8 = 127;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Probes(#[from] ProbeError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("command not found: {0} (not in $PATH)")]
    CommandNotFound(String),
    #[error("no such file: {0}")]
    NoSuchFile(String),
    #[error("cannot run {command}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    NoSuchPod(String),
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    #[error("cgroup {path} does not exist (give a path relative to the cgroup v2 root {root}, or an absolute path below it)")]
    NoSuchCgroup { path: String, root: String },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {message}")]
    Fetch { what: String, message: String },
    #[error("interrupted before the measurement started")]
    Interrupted,
}

impl CliError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }

    /// The exit code this error ends the tool with.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_)
            | Self::NoSuchProcess(_)
            | Self::NoSuchCgroup { .. }
            | Self::NoSuchPod(_) => EXIT_USAGE,
            Self::Probes(ProbeError::MissingCapability { .. }) => EXIT_NO_PERMISSION,
            Self::CommandNotFound(_) | Self::NoSuchFile(_) => EXIT_NOT_FOUND,
            Self::Interrupted => 130,
            _ => 1,
        }
    }
}

/// Where the output goes: a file, or standard output for `-` or no `-o`.
pub(crate) fn open_output(path: Option<&PathBuf>) -> Result<Box<dyn std::io::Write>, CliError> {
    match path {
        Some(p) if p.as_os_str() != "-" => {
            let f = std::fs::File::create(p)
                .map_err(|e| CliError::io(format!("creating {}", p.display()), e))?;
            Ok(Box::new(std::io::BufWriter::with_capacity(1 << 16, f)))
        }
        _ => Ok(Box::new(std::io::BufWriter::new(std::io::stdout().lock()))),
    }
}

pub(crate) use crate::util::duration::parse_arg as parse_duration;

/// Parses a byte size: "16MiB", "4096", "1GiB", "512KiB" (also k/M/G as powers of 1024).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 4096, 512KiB, 16MiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "k" | "K" | "KiB" | "KB" => 1 << 10,
        "M" | "MiB" | "MB" => 1 << 20,
        "G" | "GiB" | "GB" => 1 << 30,
        other => return Err(format!("`{other}` is not a size unit (KiB, MiB, GiB)")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Whether file descriptor `fd` is a terminal.
pub(crate) fn is_tty(fd: i32) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

pub(crate) use crate::util::clock::monotonic_ns;

/// SIGINT/SIGTERM received since [`signals::install`], counted so a second Ctrl-C can force.
pub(crate) mod signals {
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RECEIVED: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn on_signal(_sig: libc::c_int) {
        RECEIVED.fetch_add(1, Ordering::SeqCst);
    }

    /// Catches SIGINT and SIGTERM: the tools stop measuring and still print what they saw
    /// (a handler, not SIG_IGN, so a command they run starts with default dispositions).
    pub(crate) fn install() {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the handler only touches an atomic (async-signal-safe); the struct is
            // zeroed then filled as sigaction(2) requires.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as usize;
                libc::sigemptyset(&mut action.sa_mask);
                action.sa_flags = 0;
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
    }

    /// How many SIGINT/SIGTERM arrived so far.
    pub(crate) fn count() -> usize {
        RECEIVED.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("3 parsecs").is_err());
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_bytes("2G").unwrap(), 2 << 30);
        assert!(parse_bytes("12 furlongs").is_err());
    }
}
