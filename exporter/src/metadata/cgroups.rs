//! cgroup v2: finds the mount from `/proc/self/mountinfo` and resolves cgroup ids (the inode
//! number of a cgroup's directory, as `bpf_get_current_cgroup_id()` returns) to paths relative
//! to the v2 root ("/" for the root, "/system.slice/foo.service" below it). Paths read from
//! `/proc/<pid>/cgroup` are relative to this process's cgroup namespace instead;
//! [`namespace_root`] and [`join_namespace_path`] turn them into the same form.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no cgroup v2 (cgroup2) filesystem is mounted (looked in /proc/self/mountinfo); \
         mount one, e.g. `mount -t cgroup2 none /sys/fs/cgroup`"
    )]
    NotMounted,
}

/// Finds the cgroup2 mount point in mountinfo text that shows the whole hierarchy.
///
/// A mount of a subtree (root `/kubepods`) is skipped. Inside a cgroup namespace (a container
/// on a cgroup v2 host), mountinfo shows roots relative to the namespace's root: the
/// container's own cgroup2 mount has root `/` but holds only its own subtree, while the host's
/// hierarchy bind-mounted in shows as `/../..`. The mount reaching highest wins; among equals,
/// the first, as the kernel lists them.
pub fn find_v2_mount(mountinfo: &str) -> Option<PathBuf> {
    let mut best: Option<(usize, PathBuf)> = None;
    for (root, mp) in cgroup2_mounts(mountinfo) {
        let components: Vec<&str> = root.split('/').filter(|c| !c.is_empty()).collect();
        if !components.iter().all(|c| *c == "..") {
            continue;
        }
        let up = components.len();
        if best.as_ref().is_none_or(|(b, _)| up > *b) {
            best = Some((up, PathBuf::from(unescape_mountinfo(mp))));
        }
    }
    best.map(|(_, p)| p)
}

/// The (root, mount point) of every cgroup2 mount in mountinfo text, as the kernel writes
/// them (the mount point escaped).
fn cgroup2_mounts(mountinfo: &str) -> impl Iterator<Item = (&str, &str)> {
    mountinfo.lines().filter_map(|line| {
        // "36 35 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw"
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next() != Some("cgroup2") {
            return None;
        }
        let mut fields = left.split_whitespace();
        let root = fields.nth(3)?;
        Some((root, fields.next()?))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
pub fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let oct = &bytes[i + 1..i + 4];
            if oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let oct = std::str::from_utf8(oct).unwrap_or("");
                if let Ok(v) = u8::from_str_radix(oct, 8) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Locates the cgroup v2 mount of this machine.
pub fn v2_mount() -> Result<PathBuf, CgroupError> {
    v2_mount_from(Path::new("/proc/self/mountinfo"))
}

/// [`v2_mount`] from a given mountinfo file.
pub(crate) fn v2_mount_from(mountinfo: &Path) -> Result<PathBuf, CgroupError> {
    let text = std::fs::read_to_string(mountinfo).map_err(|source| CgroupError::Read {
        path: mountinfo.display().to_string(),
        source,
    })?;
    find_v2_mount(&text).ok_or(CgroupError::NotMounted)
}

/// Label value used for a cgroup id that no longer exists and was never seen.
pub(crate) const UNRESOLVED: &str = "(unresolved)";

/// What is known of a cgroup id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolution {
    Known(Arc<str>),
    /// Not found by this cycle's walk, which may predate the cgroup: ask again next cycle.
    Pending,
    /// Removed before its path could be read.
    Gone,
}

/// cgroup id -> path, rebuilt from a walk of the hierarchy when an unknown id shows up.
#[derive(Debug)]
pub struct CgroupResolver {
    root: PathBuf,
    paths: HashMap<u64, Arc<str>>,
    /// Whether this collection cycle already walked the hierarchy.
    scanned_this_cycle: bool,
    /// When the latest walk started.
    last_walk: Option<Instant>,
    /// Ids a walk did not find (cgroups removed before we saw them), retried after a while.
    missing: HashMap<u64, Instant>,
    retry_missing: Duration,
}

impl CgroupResolver {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            paths: HashMap::new(),
            scanned_this_cycle: false,
            last_walk: None,
            missing: HashMap::new(),
            retry_missing: Duration::from_secs(30),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Starts a collection cycle: the next unknown id may walk the hierarchy again.
    pub(crate) fn new_cycle(&mut self) {
        self.scanned_this_cycle = false;
    }

    /// The path of cgroup `id`, or `UNRESOLVED` while it is not known (see `lookup`).
    pub fn resolve(&mut self, id: u64) -> Arc<str> {
        match self.lookup(id) {
            Resolution::Known(p) => p,
            Resolution::Pending | Resolution::Gone => Arc::from(UNRESOLVED),
        }
    }

    /// Looks cgroup `id` up. An unknown id walks the hierarchy, once per cycle: if that walk
    /// (made now, after the kernel saw the id) does not find it, the cgroup is gone. If the
    /// cycle's walk was made earlier, the cgroup may be newer than the walk: `Pending`, and the
    /// next cycle decides. Gone ids are not looked for again for a while.
    pub(crate) fn lookup(&mut self, id: u64) -> Resolution {
        if let Some(known) = self.known(id) {
            return known;
        }
        if self.scanned_this_cycle {
            return Resolution::Pending;
        }
        self.walk_for(id)
    }

    /// What is already known of `id` without a walk: its path, or that it was recently found
    /// gone.
    fn known(&self, id: u64) -> Option<Resolution> {
        if let Some(p) = self.paths.get(&id) {
            return Some(Resolution::Known(p.clone()));
        }
        match self.missing.get(&id) {
            Some(at) if at.elapsed() < self.retry_missing => Some(Resolution::Gone),
            _ => None,
        }
    }

    /// Walks the hierarchy, then answers for `id`: found, or gone (remembered for a while).
    fn walk_for(&mut self, id: u64) -> Resolution {
        self.rescan();
        self.found_or_gone(id)
    }

    fn found_or_gone(&mut self, id: u64) -> Resolution {
        match self.paths.get(&id) {
            Some(p) => Resolution::Known(p.clone()),
            None => {
                self.missing.insert(id, Instant::now());
                Resolution::Gone
            }
        }
    }

    /// Looks up cgroup `id`, which existed at `seen_at` (e.g. it keys an entry of a map read
    /// that ended then; not when it began: a cgroup created during the read is in it). Unlike
    /// `lookup` this never answers `Pending`: a walk started after `seen_at` finds every
    /// cgroup that still exists, so an id it did not find is gone, and an older walk is
    /// simply repeated. At most one walk per `seen_at`.
    pub(crate) fn lookup_seen(&mut self, id: u64, seen_at: Instant) -> Resolution {
        if let Some(known) = self.known(id) {
            return known;
        }
        if self.last_walk.is_none_or(|walk| walk < seen_at) {
            return self.walk_for(id);
        }
        self.found_or_gone(id)
    }

    /// Walks the hierarchy, adding every cgroup found; ids of removed cgroups are kept so
    /// their last series keep their label until they are retired.
    pub(crate) fn rescan(&mut self) {
        self.scanned_this_cycle = true;
        self.last_walk = Some(Instant::now());
        self.missing
            .retain(|_, at| at.elapsed() < Duration::from_secs(300));
        let mut stack = vec![(self.root.clone(), String::from("/"))];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            self.paths
                .entry(meta.ino())
                .or_insert_with(|| Arc::from(rel.as_str()));
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let child_rel = if rel == "/" {
                        format!("/{name}")
                    } else {
                        format!("{rel}/{name}")
                    };
                    stack.push((entry.path(), child_rel));
                }
            }
        }
    }

    /// Records the path of `id` found by another walk of the hierarchy (e.g. the CPU
    /// collector's), so resolving it does not walk the hierarchy again.
    pub(crate) fn learn(&mut self, id: u64, path: &str) {
        self.missing.remove(&id);
        self.paths.entry(id).or_insert_with(|| Arc::from(path));
    }

    /// Forgets ids that are not in `keep` and whose directory is gone, bounding the cache.
    pub fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        let root = self.root.clone();
        self.paths
            .retain(|id, path| keep(*id) || root.join(path.trim_start_matches('/')).exists());
    }

    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }
}

/// The cgroup id of a cgroup directory (what the probes see for tasks inside it).
pub fn id_of(dir: &Path) -> std::io::Result<u64> {
    Ok(std::fs::metadata(dir)?.ino())
}

/// The path of the `0::` (cgroup v2) line of `/proc/<pid>/cgroup` text.
pub(crate) fn parse_proc_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
        .filter(|p| p.starts_with('/'))
}

/// Why the root of this process's cgroup namespace was not found in the hierarchy.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NamespaceRootError {
    /// A file of `/proc/<pid>` could not be read.
    #[error(transparent)]
    Read(#[from] CgroupError),
    #[error(
        "no cgroup2 mount shows the root of this process's cgroup namespace, and no \
         cgroup.procs under {root} lists pid {pid} (at {own} in its namespace)"
    )]
    NotFound { root: String, pid: u32, own: String },
}

/// Where the root of the cgroup namespace of `proc_self` (`/proc/self`, the link to this
/// process's `/proc/<pid>`) is in the hierarchy `resolver` walks, as a path from its root.
///
/// `/proc/<pid>/cgroup` shows paths relative to the reader's cgroup namespace root
/// (cgroup_namespaces(7)): read from a container with a namespace of its own, another pod's
/// process is at `/../../../kubepods-burstable.slice/...`. The root is found, first that
/// answers:
/// 1. from a cgroup2 mount rooted at it (mountinfo root `/`: the mount a container runtime
///    gives its container, or the host's own outside any namespace): that directory's inode
///    is the root's cgroup id, which the resolver names;
/// 2. from the cgroup whose `cgroup.procs` lists this process (pids there are in the
///    reader's pid namespace, whichever that is), less this process's own path inside its
///    namespace: a namespace without a mount of its own (`unshare -C`).
///
/// A namespace's root never moves: callers keep the answer.
pub(crate) fn namespace_root(
    resolver: &mut CgroupResolver,
    proc_self: &Path,
) -> Result<Arc<str>, NamespaceRootError> {
    let read = |name: &str| {
        let path = proc_self.join(name);
        std::fs::read_to_string(&path).map_err(|source| CgroupError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    for (root, mp) in cgroup2_mounts(&read("mountinfo")?) {
        if root != "/" {
            continue;
        }
        let Ok(id) = id_of(Path::new(&unescape_mountinfo(mp))) else {
            continue;
        };
        if let Resolution::Known(path) = resolver.lookup_seen(id, Instant::now()) {
            return Ok(path);
        }
    }
    let own = parse_proc_cgroup(&read("cgroup")?).unwrap_or_default();
    let pid = std::fs::read_link(proc_self)
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or_else(std::process::id);
    let not_found = || NamespaceRootError::NotFound {
        root: resolver.root().display().to_string(),
        pid,
        own: own.clone(),
    };
    let host = cgroup_of_pid(resolver.root(), pid).ok_or_else(not_found)?;
    strip_path_suffix(&host, &own).ok_or_else(not_found)
}

/// The cgroup (a path from `root`) whose `cgroup.procs` lists `pid`.
fn cgroup_of_pid(root: &Path, pid: u32) -> Option<String> {
    let mut stack = vec![(root.to_path_buf(), String::from("/"))];
    while let Some((dir, rel)) = stack.pop() {
        if std::fs::read_to_string(dir.join("cgroup.procs"))
            .is_ok_and(|procs| procs.lines().any(|l| l.trim().parse() == Ok(pid)))
        {
            return Some(rel);
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let child = format!("{}/{name}", rel.trim_end_matches('/'));
                stack.push((entry.path(), child));
            }
        }
    }
    None
}

/// `path` without its last components `suffix` (`/a/b/c` less `/b/c` is `/a`).
fn strip_path_suffix(path: &str, suffix: &str) -> Option<Arc<str>> {
    let path: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let suffix: Vec<&str> = suffix.split('/').filter(|c| !c.is_empty()).collect();
    let keep = path.len().checked_sub(suffix.len())?;
    (path[keep..] == suffix[..]).then(|| Arc::from(format!("/{}", path[..keep].join("/"))))
}

/// A path from `/proc/<pid>/cgroup`, relative to a cgroup namespace whose root is at
/// `namespace_root` ([`namespace_root`]), as a path from the resolver's root; `None` when it
/// leads above that root (outside the hierarchy this process sees).
pub(crate) fn join_namespace_path(namespace_root: &str, path: &str) -> Option<String> {
    let mut out: Vec<&str> = namespace_root
        .split('/')
        .filter(|c| !c.is_empty())
        .collect();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            name => out.push(name),
        }
    }
    Some(format!("/{}", out.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every id of a map snapshot is resolved or found gone by one walk made after the
    /// snapshot: none waits for a later cycle (a cgroup removed meanwhile would wait forever).
    #[test]
    fn ids_of_a_snapshot_resolve_or_are_gone_after_one_walk() {
        let root = tempfile::tempdir().unwrap();
        let kept = root.path().join("kept");
        let removed = root.path().join("removed");
        std::fs::create_dir(&kept).unwrap();
        std::fs::create_dir(&removed).unwrap();
        let outside = tempfile::tempdir().unwrap().keep().join("later");
        std::fs::create_dir(&outside).unwrap();
        let kept_id = id_of(&kept).unwrap();
        let removed_id = id_of(&removed).unwrap();
        // Removed before any walk saw it (its processes exited, then it was removed).
        std::fs::remove_dir(&removed).unwrap();
        let mut r = CgroupResolver::new(root.path().into());
        r.new_cycle();
        // A walk earlier in the cycle (another collector) does not make later ids pending.
        r.rescan();
        // Created after that walk (made elsewhere and moved in, so that no inode number of
        // the removed directory can be reused for it).
        let later = root.path().join("later");
        std::fs::rename(&outside, &later).unwrap();
        let later_id = id_of(&later).unwrap();

        let seen_at = Instant::now();
        assert_eq!(r.lookup_seen(removed_id, seen_at), Resolution::Gone);
        assert_eq!(
            r.lookup_seen(later_id, seen_at),
            Resolution::Known(Arc::from("/later"))
        );
        assert_eq!(
            r.lookup_seen(kept_id, seen_at),
            Resolution::Known(Arc::from("/kept"))
        );
    }

    /// Why a reader passes the instant its read of a map ended, not began: a walk another
    /// thread makes during the read may predate a cgroup created meanwhile whose id the read
    /// then finds; to the read's start that walk looks recent enough, and the cgroup is taken
    /// for gone (its values labelled `(unresolved)` for good).
    #[test]
    fn ids_found_by_a_read_are_resolved_against_its_end() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let outside = elsewhere.path().join("new");
        std::fs::create_dir(&outside).unwrap();
        let new = root.path().join("new");
        let mut early = CgroupResolver::new(root.path().into());
        let mut late = CgroupResolver::new(root.path().into());

        let read_began = Instant::now();
        // Another thread walks during the read, before the cgroup exists.
        early.rescan();
        late.rescan();
        std::fs::rename(&outside, &new).unwrap();
        let new_id = id_of(&new).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let read_ended = Instant::now();

        assert_eq!(early.lookup_seen(new_id, read_began), Resolution::Gone);
        assert_eq!(
            late.lookup_seen(new_id, read_ended),
            Resolution::Known(Arc::from("/new"))
        );
    }

    #[test]
    fn paths_of_a_cgroup_namespace_join_its_root() {
        let root = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poda.slice/cri-containerd-a.scope";
        assert_eq!(
            join_namespace_path(root, "/../../../kubepods-burstable.slice/x.slice/y.scope")
                .as_deref(),
            Some("/kubepods.slice/kubepods-burstable.slice/x.slice/y.scope")
        );
        assert_eq!(join_namespace_path(root, "/").as_deref(), Some(root));
        assert_eq!(
            join_namespace_path(root, "/../../../../init.scope").as_deref(),
            Some("/init.scope")
        );
        assert_eq!(
            join_namespace_path(root, "/../../../../../init.scope"),
            None
        );
        assert_eq!(join_namespace_path("/", "/a/./b").as_deref(), Some("/a/b"));
        // Above the hierarchy this process sees.
        assert_eq!(join_namespace_path("/a", "/../../b"), None);
        assert_eq!(strip_path_suffix("/a/b/c", "/b/c").as_deref(), Some("/a"));
        assert_eq!(strip_path_suffix("/a/b", "/").as_deref(), Some("/a/b"));
        assert_eq!(strip_path_suffix("/a/b", "/x"), None);
        assert_eq!(strip_path_suffix("/a", "/a/b"), None);
    }

    /// The namespace's root is found from the mount a runtime gives its container, and
    /// without one (`unshare -C`) from the cgroup whose cgroup.procs lists this process.
    #[test]
    fn finds_the_root_of_a_cgroup_namespace_in_the_host_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        let ns_root = host.join("kubepods/besteffort/poda/ca");
        std::fs::create_dir_all(ns_root.join("child")).unwrap();
        std::fs::create_dir_all(host.join("kubepods/burstable/podb/cb")).unwrap();
        let me = dir.path().join("proc/4242");
        std::fs::create_dir_all(&me).unwrap();
        std::os::unix::fs::symlink("4242", dir.path().join("proc/self")).unwrap();
        let proc_self = dir.path().join("proc/self");
        let host_mount = format!(
            "1300 1280 0:30 /../../../.. {} ro - cgroup2 cgroup2 rw\n",
            host.display()
        );

        // 1. The container's own mount, rooted at the namespace's root.
        std::fs::write(
            me.join("mountinfo"),
            format!(
                "{host_mount}1290 1280 0:30 / {} ro - cgroup2 cgroup rw\n",
                ns_root.display()
            ),
        )
        .unwrap();
        std::fs::write(me.join("cgroup"), "0::/\n").unwrap();
        let mut r = CgroupResolver::new(host.clone());
        assert_eq!(
            namespace_root(&mut r, &proc_self).unwrap().as_ref(),
            "/kubepods/besteffort/poda/ca"
        );

        // 2. No such mount: this process (pid 4242, in /child of its namespace) is listed by
        // the cgroup.procs of the host's .../ca/child.
        std::fs::write(me.join("mountinfo"), &host_mount).unwrap();
        std::fs::write(me.join("cgroup"), "0::/child\n").unwrap();
        std::fs::write(
            host.join("kubepods/burstable/podb/cb/cgroup.procs"),
            "17\n42420\n",
        )
        .unwrap();
        std::fs::write(ns_root.join("child/cgroup.procs"), "99\n4242\n").unwrap();
        let mut r = CgroupResolver::new(host.clone());
        assert_eq!(
            namespace_root(&mut r, &proc_self).unwrap().as_ref(),
            "/kubepods/besteffort/poda/ca"
        );

        // Neither: an error that says what was looked for.
        std::fs::remove_file(ns_root.join("child/cgroup.procs")).unwrap();
        let e = namespace_root(&mut r, &proc_self).unwrap_err().to_string();
        assert!(e.contains("pid 4242") && e.contains("/child"), "{e}");
        assert!(namespace_root(&mut r, &dir.path().join("missing")).is_err());
    }

    #[test]
    fn finds_unified_mount_in_hybrid_layout() {
        let text = "\
25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 31 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
";
        assert_eq!(
            find_v2_mount(text),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn skips_bind_mounts_of_subtrees_and_v1() {
        let text = "\
40 31 0:27 /kubepods /host/cg rw - cgroup2 cgroup2 rw
33 31 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
41 31 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
";
        assert_eq!(find_v2_mount(text), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(
            find_v2_mount("33 31 0:28 / /x rw - cgroup cgroup rw\n"),
            None
        );
    }

    #[test]
    fn prefers_the_host_hierarchy_inside_a_cgroup_namespace() {
        // A container with its own cgroup namespace: the runtime's mount shows its subtree as
        // "/", the host's hierarchy mounted in as a volume shows as "/../../..".
        let text = "\
1290 1280 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw
1300 1280 0:30 /../../.. /host/sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw
";
        assert_eq!(
            find_v2_mount(text),
            Some(PathBuf::from("/host/sys/fs/cgroup"))
        );
        // Only the host's mount (as this kernel shows it after `unshare -C`).
        let text = "57 47 0:38 /../.. /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_v2_mount(text),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        // Roots that go up and then down again are subtrees of somewhere else.
        let text = "57 47 0:38 /../other / rw - cgroup2 cgroup2 rw\n";
        assert_eq!(find_v2_mount(text), None);
    }

    #[test]
    fn no_cgroup2_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        // Only cgroup v1 hierarchies (an old systemd "legacy" layout).
        let v1 = dir.path().join("v1");
        std::fs::write(
            &v1,
            "31 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n\
             33 31 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
             34 31 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        )
        .unwrap();
        let e = v2_mount_from(&v1).unwrap_err();
        assert!(matches!(e, CgroupError::NotMounted));
        let msg = e.to_string();
        assert!(
            msg.contains("cgroup v2") && msg.contains("mount -t cgroup2"),
            "{msg}"
        );
        // Only a subtree of cgroup2 is visible (a container with a bind mount): not the root.
        let sub = dir.path().join("sub");
        std::fs::write(
            &sub,
            "40 31 0:27 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        )
        .unwrap();
        assert!(matches!(v2_mount_from(&sub), Err(CgroupError::NotMounted)));
        // Unreadable mountinfo names the file.
        let e = v2_mount_from(&dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        // Empty and malformed lines are skipped, not fatal.
        let odd = dir.path().join("odd");
        std::fs::write(
            &odd,
            "\n - \ngarbage\n1 2 - cgroup2\n36 35 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
        )
        .unwrap();
        assert_eq!(
            v2_mount_from(&odd).unwrap(),
            PathBuf::from("/sys/fs/cgroup")
        );
    }

    /// Cgroups come and go while the tree is walked: the walk skips what vanished and
    /// resolves what stayed.
    #[test]
    fn walking_a_tree_that_changes_underneath() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("stable/child")).unwrap();
        let stable = id_of(&dir.path().join("stable/child")).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let root = dir.path().to_path_buf();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let d = root.join(format!("c{}/d", i % 16));
                    let _ = std::fs::create_dir_all(&d);
                    let _ = std::fs::remove_dir(&d);
                    let _ = std::fs::remove_dir(d.parent().unwrap());
                    i += 1;
                }
            })
        };
        let mut r = CgroupResolver::new(dir.path().to_path_buf());
        for _ in 0..200 {
            r.new_cycle();
            r.rescan();
            assert_eq!(&*r.resolve(stable), "/stable/child");
            r.retain(|_| false);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
    }

    #[test]
    fn optional_fields_and_escaped_mount_points() {
        // Optional fields ("shared:1 master:2") sit between the options and the separator.
        let text =
            "36 35 0:30 / /mnt/my\\040cgroups rw,nosuid shared:4 master:1 - cgroup2 none rw\n";
        assert_eq!(find_v2_mount(text), Some(PathBuf::from("/mnt/my cgroups")));
    }

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/trailing\04"), r"/trailing\04");
    }

    #[test]
    fn resolves_ids_of_a_directory_tree() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::create_dir_all(dir.path().join("c")).unwrap();
        let mut r = CgroupResolver::new(dir.path().to_path_buf());
        let id_root = id_of(dir.path()).unwrap();
        let id_b = id_of(&dir.path().join("a/b")).unwrap();
        let id_c = id_of(&dir.path().join("c")).unwrap();
        assert_eq!(&*r.resolve(id_root), "/");
        assert_eq!(&*r.resolve(id_b), "/a/b");
        assert_eq!(&*r.resolve(id_c), "/c");
        // A directory created after this cycle's walk is pending, then resolves next cycle.
        std::fs::create_dir_all(dir.path().join("d")).unwrap();
        let id_d = id_of(&dir.path().join("d")).unwrap();
        assert_eq!(r.lookup(id_d), Resolution::Pending);
        r.new_cycle();
        assert_eq!(&*r.resolve(id_d), "/d");
        // Removed directories keep their label until retained away.
        std::fs::remove_dir(dir.path().join("d")).unwrap();
        assert_eq!(&*r.resolve(id_d), "/d");
        r.retain(|_| false);
        r.new_cycle();
        assert_eq!(r.lookup(id_d), Resolution::Gone);
        assert_eq!(&*r.resolve(id_d), UNRESOLVED);
        assert_eq!(&*r.resolve(id_b), "/a/b");
    }
}
