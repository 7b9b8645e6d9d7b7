//! Process names: tgid -> `comm` from `/proc/<tgid>/comm`, cached briefly; for processes that
//! have already exited, the probes hand over the comm they saw at exit.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

/// Label value for a process that exited before its name could be read.
pub const UNKNOWN_COMM: &str = "(exited)";

#[derive(Debug)]
pub struct CommResolver {
    proc_root: std::path::PathBuf,
    cache: HashMap<u32, (Arc<str>, Instant)>,
    ttl: Duration,
}

impl Default for CommResolver {
    fn default() -> Self {
        Self::new("/proc".into(), Duration::from_secs(5))
    }
}

impl CommResolver {
    pub fn new(proc_root: std::path::PathBuf, ttl: Duration) -> Self {
        Self {
            proc_root,
            cache: HashMap::new(),
            ttl,
        }
    }

    /// The current comm of `tgid`, re-read when older than the TTL (a process may exec).
    pub fn resolve(&mut self, tgid: u32) -> Arc<str> {
        if let Some((comm, at)) = self.cache.get(&tgid) {
            if at.elapsed() < self.ttl {
                return comm.clone();
            }
        }
        match self.read(tgid) {
            Some(comm) => {
                self.cache.insert(tgid, (comm.clone(), Instant::now()));
                comm
            }
            // Gone: keep the last name we knew, if any.
            None => self
                .cache
                .get(&tgid)
                .map(|(c, _)| c.clone())
                .unwrap_or_else(|| Arc::from(UNKNOWN_COMM)),
        }
    }

    /// Records the name the kernel saw when the process exited (authoritative from then on).
    pub fn set_exited(&mut self, tgid: u32, comm: &[u8; 16]) {
        let name = comm_from_bytes(comm);
        // Far-future timestamp: never re-read /proc for a pid that may be reused.
        let at = Instant::now() + Duration::from_secs(3600 * 24);
        self.cache.insert(tgid, (name, at));
    }

    pub fn forget(&mut self, tgid: u32) {
        self.cache.remove(&tgid);
    }

    pub fn alive(&self, tgid: u32) -> bool {
        self.proc_root.join(tgid.to_string()).exists()
    }

    fn read(&self, tgid: u32) -> Option<Arc<str>> {
        let text = std::fs::read_to_string(self.proc_root.join(format!("{tgid}/comm"))).ok()?;
        let name = text.trim_end_matches('\n');
        Some(Arc::from(sanitize(name).as_str()))
    }

    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

/// A NUL-terminated kernel comm as a label value.
pub fn comm_from_bytes(comm: &[u8; 16]) -> Arc<str> {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    let name = String::from_utf8_lossy(&comm[..end]);
    if name.is_empty() {
        Arc::from(UNKNOWN_COMM)
    } else {
        Arc::from(sanitize(&name).as_str())
    }
}

/// comm is chosen by the process (prctl PR_SET_NAME): keep label values printable.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_comm() {
        let mut r = CommResolver::default();
        let me = std::process::id();
        let expected = std::fs::read_to_string(format!("/proc/{me}/comm")).unwrap();
        assert_eq!(&*r.resolve(me), expected.trim_end());
    }

    #[test]
    fn exited_comm_wins_and_unknown_is_labelled() {
        let mut r = CommResolver::default();
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"train");
        r.set_exited(u32::MAX - 1, &comm);
        assert_eq!(&*r.resolve(u32::MAX - 1), "train");
        assert_eq!(&*r.resolve(u32::MAX - 2), UNKNOWN_COMM);
    }

    #[test]
    fn comm_bytes_are_sanitized() {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"a\nb\x01");
        assert_eq!(&*comm_from_bytes(&comm), "a?b?");
        assert_eq!(&*comm_from_bytes(&[0u8; 16]), UNKNOWN_COMM);
        assert_eq!(&*comm_from_bytes(&[b'x'; 16]), "xxxxxxxxxxxxxxxx");
    }
}
