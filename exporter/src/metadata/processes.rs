//! Process names: tgid -> `comm` from `/proc/<tgid>/comm`, cached briefly; for processes that
//! have already exited, the probes hand over the comm they saw at exit.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

/// Label value for a process that exited before its name could be read.
pub(crate) const UNKNOWN_COMM: &str = "(exited)";

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

    /// The current comm of `tgid`, re-read when older than the TTL (a process may exec);
    /// `UNKNOWN_COMM` for a process gone before its name could be read.
    pub fn resolve(&mut self, tgid: u32) -> Arc<str> {
        self.lookup(tgid).unwrap_or_else(|| Arc::from(UNKNOWN_COMM))
    }

    /// Like [`Self::resolve`], but `None` instead of the placeholder: a process that exited
    /// between a map read and this lookup has no readable name until its exit record arrives.
    pub(crate) fn lookup(&mut self, tgid: u32) -> Option<Arc<str>> {
        if let Some((comm, at)) = self.cache.get(&tgid) {
            if at.elapsed() < self.ttl {
                return Some(comm.clone());
            }
        }
        // Gone: keep the last name we knew, if any.
        self.read_fresh(tgid).or_else(|| self.cached(tgid))
    }

    /// Like [`Self::lookup`], but a name cached before `since` is read again (a process may
    /// have been renamed by its exec since: a child read between fork and exec has its
    /// parent's name). A name from an exit record is kept. A process gone before the read
    /// has no name: its exit record, read next, carries the one it ended with.
    pub(crate) fn lookup_since(&mut self, tgid: u32, since: Instant) -> Option<Arc<str>> {
        match self.cache.get(&tgid) {
            Some((comm, at)) if *at >= since => Some(comm.clone()),
            _ => self
                .read_fresh(tgid)
                .or_else(|| self.cached(tgid).filter(|_| self.alive(tgid))),
        }
    }

    /// Reads `/proc/<tgid>/comm` and caches what it finds.
    fn read_fresh(&mut self, tgid: u32) -> Option<Arc<str>> {
        let comm = self.read(tgid)?;
        self.cache.insert(tgid, (comm.clone(), Instant::now()));
        Some(comm)
    }

    fn cached(&self, tgid: u32) -> Option<Arc<str>> {
        self.cache.get(&tgid).map(|(c, _)| c.clone())
    }

    /// Records the name the kernel saw when the process exited (authoritative from then on).
    pub(crate) fn set_exited(&mut self, tgid: u32, comm: &[u8; 16]) {
        let name = comm_from_bytes(comm);
        // Far-future timestamp: never re-read /proc for a pid that may be reused.
        let at = Instant::now() + Duration::from_secs(3600 * 24);
        self.cache.insert(tgid, (name, at));
    }

    pub(crate) fn forget(&mut self, tgid: u32) {
        self.cache.remove(&tgid);
    }

    pub fn alive(&self, tgid: u32) -> bool {
        self.proc_root.join(tgid.to_string()).exists()
    }

    /// Reads `/proc/<tgid>/comm`. A process may exit at any point, so every failure (gone,
    /// zombie, permission) is `None`. A comm is any 15 bytes the process chose: read at most
    /// 64 bytes (a fake or odd /proc cannot make us read more) and accept invalid UTF-8.
    fn read(&self, tgid: u32) -> Option<Arc<str>> {
        use std::io::Read;
        let file = std::fs::File::open(self.proc_root.join(format!("{tgid}/comm"))).ok()?;
        let mut bytes = Vec::with_capacity(32);
        file.take(64).read_to_end(&mut bytes).ok()?;
        if bytes.is_empty() {
            // An exited process' entry can read as empty: not a name.
            return None;
        }
        let end = bytes
            .iter()
            .position(|&b| b == b'\n' || b == 0)
            .unwrap_or(bytes.len())
            .min(16);
        let name = String::from_utf8_lossy(&bytes[..end]);
        if name.is_empty() {
            return None;
        }
        Some(Arc::from(sanitize(&name).as_str()))
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
pub fn sanitize(name: &str) -> String {
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

    /// A fake /proc: one live process with a name, one whose name is not UTF-8, one with an
    /// empty comm, one with an oversized file; processes then vanish between reads.
    #[test]
    fn vanishing_and_odd_proc_entries() {
        let root = tempfile::tempdir().unwrap();
        let mk = |pid: u32, comm: &[u8]| {
            let dir = root.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("comm"), comm).unwrap();
        };
        mk(10, b"python3\n");
        mk(11, b"caf\xc3\n\xff\xfe\n");
        mk(12, b"");
        mk(13, &[b'A'; 1 << 20]);
        mk(14, b"tab\there\x1b[31m\n");
        let mut r = CommResolver::new(root.path().to_path_buf(), Duration::ZERO);
        assert_eq!(&*r.resolve(10), "python3");
        assert!(r.alive(10));
        // Invalid UTF-8 is kept as a name, not mistaken for an exited process.
        assert_eq!(&*r.resolve(11), "caf\u{fffd}");
        assert_eq!(&*r.resolve(12), UNKNOWN_COMM);
        assert_eq!(&*r.resolve(13), "AAAAAAAAAAAAAAAA");
        assert_eq!(&*r.resolve(14), "tab?here?[31m");
        // The process exits: its directory vanishes. The last known name is kept.
        std::fs::remove_dir_all(root.path().join("10")).unwrap();
        assert!(!r.alive(10));
        assert_eq!(&*r.resolve(10), "python3");
        // Its comm file vanishes while the directory is still listed (a zombie being reaped).
        std::fs::remove_file(root.path().join("11/comm")).unwrap();
        assert_eq!(&*r.resolve(11), "caf\u{fffd}");
        // A process never seen that is already gone.
        assert_eq!(&*r.resolve(99), UNKNOWN_COMM);
        // The pid is reused by a new process: after forget, the new name is read.
        r.forget(10);
        mk(10, b"bash\n");
        assert_eq!(&*r.resolve(10), "bash");
        // A /proc root that does not exist at all.
        let mut gone = CommResolver::new("/nonexistent/proc".into(), Duration::ZERO);
        assert_eq!(&*gone.resolve(1), UNKNOWN_COMM);
        assert!(!gone.alive(1));
    }

    /// A child's name read between its fork and its exec is its parent's: a key seen for the
    /// first time afterwards reads the name again, within the TTL, once per `since`.
    #[test]
    fn new_keys_read_a_name_older_than_the_cycle_again() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("20");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("comm"), b"parent-thread\n").unwrap();
        let mut r = CommResolver::new(root.path().to_path_buf(), Duration::from_secs(3600));
        assert_eq!(&*r.resolve(20), "parent-thread");
        // The child execs.
        std::fs::write(dir.join("comm"), b"trainer\n").unwrap();
        let cycle = Instant::now();
        // Within the TTL the cached name stands for keys already named...
        assert_eq!(&*r.lookup(20).unwrap(), "parent-thread");
        // ...but a new key reads it again, and the fresh read serves the rest of the cycle.
        assert_eq!(&*r.lookup_since(20, cycle).unwrap(), "trainer");
        std::fs::write(dir.join("comm"), b"renamed\n").unwrap();
        assert_eq!(&*r.lookup_since(20, cycle).unwrap(), "trainer");
        // An exit record's name is never replaced by /proc (the pid may be reused).
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"gone");
        r.set_exited(20, &comm);
        assert_eq!(&*r.lookup_since(20, Instant::now()).unwrap(), "gone");
        // Alive but its name unreadable: the cached name.
        let mut g = CommResolver::new(root.path().to_path_buf(), Duration::from_secs(3600));
        assert_eq!(&*g.resolve(20), "renamed");
        std::fs::remove_file(dir.join("comm")).unwrap();
        assert_eq!(&*g.lookup_since(20, Instant::now()).unwrap(), "renamed");
        // Gone before the new read: no name until its exit record (the cached one may be
        // from before an exec); a plain lookup still gives the last known one.
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(g.lookup_since(20, Instant::now()), None);
        assert_eq!(&*g.lookup(20).unwrap(), "renamed");
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
