//! Which processes have exited: one lifecycle for every collector whose kernel entries are
//! keyed by tgid (syscalls, block I/O).
//!
//! A process is known gone from its exit record (`PROCESS_EXITS`, queued by the probes'
//! `sched_process_exit` and drained by the syscall collector, which hands each record here)
//! or from /proc no longer listing it (a process whose record was lost to a full queue, or
//! that exited before sysscope started). A collector reclaims a process's entries, after
//! reading them one last time, once the process has been gone for the grace its entries
//! need: none for syscalls (a process's calls end with it), one reclaim check for block I/O
//! (requests it submitted may still complete after it exits, and would otherwise create the
//! entry again).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// How long a process stays known gone. Longer than any collector's grace; a pid that comes
/// round again after this is a new process.
pub(crate) const REMEMBER: Duration = Duration::from_secs(120);

/// Processes known gone, and since when.
#[derive(Debug, Default)]
pub(crate) struct Exits {
    since: HashMap<u32, Instant>,
}

impl Exits {
    /// The probes recorded `tgid`'s exit (or /proc no longer lists it) at `now`. The first
    /// report counts.
    pub(crate) fn gone(&mut self, tgid: u32, now: Instant) {
        self.since.entry(tgid).or_insert(now);
    }

    /// Whether `tgid` has been known gone for at least `grace` at `now`.
    pub(crate) fn gone_for(&self, tgid: u32, grace: Duration, now: Instant) -> bool {
        self.since
            .get(&tgid)
            .is_some_and(|at| now.saturating_duration_since(*at) >= grace)
    }

    /// Forgets processes gone for longer than [`REMEMBER`].
    pub(crate) fn expire(&mut self, now: Instant) {
        self.since
            .retain(|_, at| now.saturating_duration_since(*at) < REMEMBER);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.since.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_counts_from_the_first_report() {
        let t0 = Instant::now();
        let mut exits = Exits::default();
        assert!(
            !exits.gone_for(7, Duration::ZERO, t0),
            "unknown is not gone"
        );
        exits.gone(7, t0);
        exits.gone(7, t0 + Duration::from_secs(4));
        assert!(exits.gone_for(7, Duration::ZERO, t0));
        assert!(!exits.gone_for(7, Duration::from_secs(5), t0 + Duration::from_secs(4)));
        assert!(exits.gone_for(7, Duration::from_secs(5), t0 + Duration::from_secs(5)));
    }

    #[test]
    fn records_expire_so_a_reused_pid_is_a_new_process() {
        let t0 = Instant::now();
        let mut exits = Exits::default();
        exits.gone(7, t0);
        exits.gone(8, t0 + Duration::from_secs(60));
        exits.expire(t0 + REMEMBER);
        assert_eq!(exits.len(), 1);
        assert!(!exits.gone_for(7, Duration::ZERO, t0 + REMEMBER));
        assert!(exits.gone_for(8, Duration::ZERO, t0 + REMEMBER));
    }
}
