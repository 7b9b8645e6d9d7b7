//! Progress on stderr for long runs: a line redrawn every second on a terminal, one line every
//! [`PLAIN_EVERY`] otherwise (logs stay readable), nothing with `--quiet`.

use std::{
    io::Write,
    time::{Duration, Instant},
};

/// How often a progress line is printed when stderr is not a terminal.
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(10);
/// How often the terminal line is redrawn.
const TTY_EVERY: Duration = Duration::from_secs(1);
/// Runs shorter than this show no progress at all.
const SHOW_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Progress {
    tool: &'static str,
    enabled: bool,
    tty: bool,
    started: Instant,
    last: Option<Instant>,
    drawn: bool,
}

impl Progress {
    pub(crate) fn new(tool: &'static str, quiet: bool) -> Self {
        Self {
            tool,
            enabled: !quiet,
            tty: super::is_tty(2),
            started: Instant::now(),
            last: None,
            drawn: false,
        }
    }

    /// Shows `status` (e.g. "12,345 syscalls") with the elapsed time, when it is time to.
    pub(crate) fn tick(&mut self, status: impl FnOnce() -> String) {
        if !self.enabled || self.started.elapsed() < SHOW_AFTER {
            return;
        }
        let every = if self.tty { TTY_EVERY } else { PLAIN_EVERY };
        if self.last.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        let line = format!(
            "sysscope {}: {:.0} s elapsed, {} (Ctrl-C to stop)",
            self.tool,
            self.started.elapsed().as_secs_f64(),
            status()
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{line}");
            self.drawn = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// Clears the terminal line before the results are printed.
    pub(crate) fn done(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done();
    }
}

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
