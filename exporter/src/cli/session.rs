//! The target of a command-line tool and its lifetime: a command run in a fresh cgroup v2 of
//! its own (`-- CMD`; its children follow it there), a process (`--pid`), a cgroup and its
//! descendants (`--cgroup`), or a pod of this node or one of its containers (`--pod`, resolved
//! to its cgroup by [`super::pod`]).
//!
//! A command's cgroup is created under the v2 root before the probes load, and the command is
//! spawned only once they are attached, straight into the cgroup (`clone3` with
//! `CLONE_INTO_CGROUP`, so its first syscall in the cgroup is its `execve`, as `strace -c`
//! counts it; on kernels before 5.7 a `pre_exec` write to `cgroup.procs` moves it, and that one
//! write is counted too). The session lasts, like `strace -f`,
//! until the command and every process left in its cgroup have exited. The cgroup is removed
//! afterwards. `--duration` and Ctrl-C stop it early; a command still running then is
//! terminated (SIGTERM, then SIGKILL after a grace period), as `perf stat` does.

use std::{
    collections::HashSet,
    ffi::{CString, OsStr},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{
            ffi::OsStrExt,
            fs::PermissionsExt,
            process::{CommandExt, ExitStatusExt},
        },
    },
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
    time::{Duration, Instant},
};

use super::{parse_duration, pod::PodTarget, signals, CliError};
use crate::{
    config::KubernetesConfig,
    kernel::LoadOptions,
    metadata::cgroups::{self, id_of},
};

/// What to measure; shared by `summary`, `trace` and `diagnose`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TargetArgs {
    /// Measure this running process (every thread of it; not its children: use a cgroup or
    /// `-- CMD` to follow those).
    #[arg(short = 'p', long, value_name = "PID")]
    pub pid: Option<u32>,

    /// Measure every process in this cgroup v2 and its descendant cgroups: a path relative to
    /// the cgroup v2 root (e.g. /system.slice/nginx.service) or an absolute path below it.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,

    /// Measure every container of a pod on this node: NAMESPACE/NAME (resolved through the
    /// Kubernetes API when credentials are there, else the kubelet's log directories) or the
    /// pod's UID.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub pod: Option<String>,

    /// With --pod: only this container of the pod.
    #[arg(long, value_name = "NAME", requires = "pod")]
    pub container: Option<String>,

    /// Stop after this long (e.g. 500ms, 10s, 2m). Without it: until the command (and all its
    /// children) exit, or until Ctrl-C.
    #[arg(short = 'd', long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// No progress line on stderr.
    #[arg(short = 'q', long)]
    pub(crate) quiet: bool,

    /// The command to run, after `--`, in a fresh cgroup of its own (its children included).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The command and every process of its cgroup exited.
    Exited,
    /// `--duration` elapsed.
    Duration,
    /// SIGINT or SIGTERM.
    Interrupted,
    /// The process or cgroup being measured disappeared.
    TargetGone,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exited => "exited",
            Self::Duration => "duration elapsed",
            Self::Interrupted => "interrupted",
            Self::TargetGone => "target gone",
        }
    }
}

/// The resolved target.
#[derive(Debug)]
pub(crate) enum Target {
    Command {
        argv: Vec<String>,
        program: PathBuf,
        cgroup: OwnedCgroup,
    },
    Pid {
        pid: u32,
        comm: String,
    },
    Cgroup {
        dir: PathBuf,
        rel: String,
        /// The pod (or container) the cgroup was resolved from, for `--pod`.
        pod: Option<PodTarget>,
    },
}

/// Which kernel entries belong to the target.
#[derive(Debug, Clone)]
pub(crate) enum Filter {
    /// A cgroup directory and its descendants (ids refreshed by [`Filter::refresh`]).
    Cgroups {
        dir: PathBuf,
        ids: HashSet<u64>,
    },
    Tgid(u32),
}

impl Filter {
    pub(crate) fn matches(&self, cgroup_id: u64, tgid: u32) -> bool {
        match self {
            Self::Cgroups { ids, .. } => ids.contains(&cgroup_id),
            Self::Tgid(t) => *t == tgid,
        }
    }

    /// Picks up descendant cgroups created since the last call.
    pub(crate) fn refresh(&mut self) {
        if let Self::Cgroups { dir, ids } = self {
            ids.extend(descendant_ids(dir));
        }
    }
}

/// Inode ids (cgroup ids) of `dir` and every directory below it.
pub(crate) fn descendant_ids(dir: &Path) -> HashSet<u64> {
    let mut ids = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(id) = id_of(&d) {
            ids.insert(id);
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(e.path());
                }
            }
        }
    }
    ids
}

/// A cgroup created for a command; emptied and removed on drop.
#[derive(Debug)]
pub(crate) struct OwnedCgroup {
    pub dir: PathBuf,
    /// Path relative to the v2 root, as the metrics label it.
    pub rel: String,
    pub id: u64,
    root: PathBuf,
}

impl OwnedCgroup {
    /// Creates `<v2 root>/sysscope-<tool>-<pid>[-n]`.
    pub(crate) fn create(tool: &str) -> Result<Self, CliError> {
        let root = cgroups::v2_mount()?;
        let base = format!("sysscope-{tool}-{}", std::process::id());
        for n in 0..100 {
            let name = if n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            };
            let dir = root.join(&name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let id = id_of(&dir)
                        .map_err(|e| CliError::io(format!("reading {}", dir.display()), e))?;
                    return Ok(Self {
                        dir,
                        rel: format!("/{name}"),
                        id,
                        root,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                // A container's view of the host's hierarchy (the DaemonSet mounts it
                // read-only): a running target needs no cgroup of its own.
                Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                    return Err(CliError::Usage(format!(
                        "cannot run a command here: the cgroup v2 hierarchy at {} is \
                         read-only (as in the sysscope DaemonSet's pod), and `-- CMD` runs the \
                         command in a cgroup of its own; measure what runs already with --pod \
                         NAMESPACE/NAME, --pid or --cgroup",
                        root.display()
                    )))
                }
                Err(e) => {
                    return Err(CliError::io(
                        format!("creating cgroup {}", dir.display()),
                        e,
                    ))
                }
            }
        }
        Err(CliError::Usage(format!(
            "cannot create a cgroup named {base}-N under {}: too many exist",
            root.display()
        )))
    }

    /// Whether any process is left in the cgroup (or below it).
    pub(crate) fn populated(&self) -> bool {
        populated(&self.dir)
    }

    fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut stack = vec![self.dir.clone()];
        while let Some(d) = stack.pop() {
            if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(&d) {
                for e in entries.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        stack.push(e.path());
                    }
                }
            }
        }
        pids
    }

    /// Ends every process left: SIGTERM, then SIGKILL after `grace`.
    pub(crate) fn terminate(&self, grace: Duration) {
        for pid in self.pids() {
            // SAFETY: signalling processes in the cgroup we created for the command.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let until = Instant::now() + grace;
        while self.populated() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.populated() {
            if std::fs::write(self.dir.join("cgroup.kill"), b"1").is_err() {
                for pid in self.pids() {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            let until = Instant::now() + Duration::from_secs(2);
            while self.populated() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for OwnedCgroup {
    fn drop(&mut self) {
        // Anything still inside (only possible if terminating failed) moves to the root so
        // the directory can go.
        let root_procs = self.root.join("cgroup.procs");
        for _ in 0..100 {
            for pid in self.pids() {
                let _ = std::fs::write(&root_procs, pid.to_string());
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(cgroup = %self.dir.display(), "could not remove the command's cgroup");
    }
}

/// `populated` from `cgroup.events` (true when unreadable, so callers keep waiting only while
/// the directory exists).
fn populated(dir: &Path) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(text) => text.lines().any(|l| l.trim() == "populated 1"),
        Err(_) => false,
    }
}

/// Finds `name` the way execvp would, in the parent, so the child execs exactly once.
pub(crate) fn resolve_program(name: &str) -> Result<PathBuf, CliError> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return if p.exists() {
            Ok(p)
        } else {
            Err(CliError::NoSuchFile(name.to_string()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(CliError::CommandNotFound(name.to_string()))
}

/// One measurement: its target, its clock, and the command it runs.
pub(crate) struct Session {
    pub target: Target,
    pub filter: Filter,
    duration: Option<Duration>,
    /// pid of the command, once spawned.
    child: Option<i32>,
    status: Option<ExitStatus>,
    started: Instant,
    started_ns: u64,
    signals_at_start: usize,
    first_signal: Option<Instant>,
    last_refresh: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// How long after a Ctrl-C a command gets to exit by itself before it is stopped.
const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// How long a command left running at the end gets between SIGTERM and SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(2);
/// How often descendant cgroups are looked for.
const REFRESH_EVERY: Duration = Duration::from_millis(500);

impl Session {
    /// Validates the target and, for a command, creates its cgroup (nothing runs yet).
    /// Ctrl-C is caught from here on, so an interrupted start still removes the cgroup.
    pub(crate) fn new(
        args: &TargetArgs,
        tool: &str,
        kubernetes: &KubernetesConfig,
    ) -> Result<Self, CliError> {
        signals::install();
        let signals_at_start = signals::count();
        let given = [
            args.pid.is_some(),
            args.cgroup.is_some(),
            args.pod.is_some(),
            !args.command.is_empty(),
        ]
        .iter()
        .filter(|x| **x)
        .count();
        if given != 1 {
            return Err(CliError::Usage(format!(
                "give exactly one target: `sysscope {tool} -- CMD [ARGS...]`, `--pid PID`, \
                 `--cgroup PATH` or `--pod NAMESPACE/NAME` (see `sysscope {tool} --help`)"
            )));
        }
        let (target, filter) = if let Some(pid) = args.pid {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map_err(|_| CliError::NoSuchProcess(pid))?
                .trim_end()
                .to_string();
            // Threads are not processes: a tid would match nothing.
            let tgid = tgid_of(pid).ok_or(CliError::NoSuchProcess(pid))?;
            if tgid != pid {
                return Err(CliError::Usage(format!(
                    "{pid} is a thread of process {tgid}: give the process id (`--pid {tgid}`)"
                )));
            }
            (Target::Pid { pid, comm }, Filter::Tgid(pid))
        } else if let Some(path) = &args.cgroup {
            let root = cgroups::v2_mount()?;
            let (dir, rel) = resolve_cgroup(&root, path)?;
            let ids = descendant_ids(&dir);
            (
                Target::Cgroup {
                    dir: dir.clone(),
                    rel,
                    pod: None,
                },
                Filter::Cgroups { dir, ids },
            )
        } else if let Some(pod) = &args.pod {
            let root = cgroups::v2_mount()?;
            let pod = super::pod::resolve(pod, args.container.as_deref(), &root, kubernetes)?;
            let dir = pod.dir.clone();
            let ids = descendant_ids(&dir);
            (
                Target::Cgroup {
                    dir: dir.clone(),
                    rel: pod.rel.clone(),
                    pod: Some(pod),
                },
                Filter::Cgroups { dir, ids },
            )
        } else {
            // Resolve before creating anything: a typo fails fast and leaves no cgroup.
            let program = resolve_program(&args.command[0])?;
            let cgroup = OwnedCgroup::create(tool)?;
            let filter = Filter::Cgroups {
                dir: cgroup.dir.clone(),
                ids: HashSet::from([cgroup.id]),
            };
            (
                Target::Command {
                    argv: args.command.clone(),
                    program,
                    cgroup,
                },
                filter,
            )
        };
        Ok(Self {
            target,
            filter,
            duration: args.duration,
            child: None,
            status: None,
            started: Instant::now(),
            started_ns: super::monotonic_ns(),
            signals_at_start,
            first_signal: None,
            last_refresh: Instant::now(),
        })
    }

    /// Probe load options for this target: the in-kernel target filter (used by the trace
    /// programs, and by the syscall programs, which count the target only).
    pub(crate) fn load_options(&self) -> LoadOptions {
        let mut o = LoadOptions {
            syscalls_target_only: true,
            ..LoadOptions::default()
        };
        match &self.target {
            Target::Command { cgroup, .. } => o.trace_cgroup_id = cgroup.id,
            Target::Cgroup { dir, .. } => o.trace_cgroup_id = id_of(dir).unwrap_or(0),
            Target::Pid { .. } => o.trace_filter_tgids = true,
        }
        o
    }

    /// The cgroup directory being measured, if the target is one.
    pub(crate) fn cgroup_dir(&self) -> Option<&Path> {
        match &self.target {
            Target::Command { cgroup, .. } => Some(&cgroup.dir),
            Target::Cgroup { dir, .. } => Some(dir),
            Target::Pid { .. } => None,
        }
    }

    /// The tgid being measured, for `--pid`.
    pub(crate) fn pid(&self) -> Option<u32> {
        match &self.target {
            Target::Pid { pid, .. } => Some(*pid),
            _ => None,
        }
    }

    /// Starts the clock and, for a command, runs it (the probes must be attached by now).
    pub(crate) fn start(&mut self) -> Result<(), CliError> {
        if signals::count() > self.signals_at_start {
            return Err(CliError::Interrupted);
        }
        // The clock starts before the spawn, so the command's execve lies inside the trace.
        self.started = Instant::now();
        self.started_ns = super::monotonic_ns();
        if let Target::Command {
            argv,
            program,
            cgroup,
        } = &self.target
        {
            self.child = Some(spawn_in_cgroup(argv, program, &cgroup.dir)?);
        }
        Ok(())
    }

    /// When the measurement started (CLOCK_MONOTONIC ns, the probes' clock).
    pub(crate) fn started_ns(&self) -> u64 {
        self.started_ns
    }

    /// The `--duration` limit, if any.
    pub(crate) fn duration(&self) -> Option<Duration> {
        self.duration
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The pid of the command, once started.
    pub(crate) fn child_pid(&self) -> Option<u32> {
        self.child.map(|pid| pid as u32)
    }

    /// Checks, without blocking, whether the session is over.
    pub(crate) fn poll(&mut self) -> Option<StopReason> {
        if self.last_refresh.elapsed() >= REFRESH_EVERY {
            self.filter.refresh();
            self.last_refresh = Instant::now();
        }
        let signals = signals::count() - self.signals_at_start;
        if signals > 0 && self.first_signal.is_none() {
            self.first_signal = Some(Instant::now());
        }
        if let Some(d) = self.duration {
            if self.started.elapsed() >= d {
                return Some(StopReason::Duration);
            }
        }
        match &self.target {
            Target::Command { cgroup, .. } => {
                if self.status.is_none() {
                    if let Some(pid) = self.child {
                        self.status = reap(pid, false);
                    }
                }
                if self.status.is_some() && !cgroup.populated() {
                    return Some(StopReason::Exited);
                }
                // Ctrl-C reaches the command too: give it a moment to exit by itself, unless
                // asked twice.
                if signals >= 2
                    || self
                        .first_signal
                        .is_some_and(|t| t.elapsed() >= INTERRUPT_GRACE)
                {
                    return Some(StopReason::Interrupted);
                }
            }
            Target::Pid { pid, .. } => {
                if signals > 0 {
                    return Some(StopReason::Interrupted);
                }
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return Some(StopReason::TargetGone);
                }
            }
            Target::Cgroup { dir, .. } => {
                if signals > 0 {
                    return Some(StopReason::Interrupted);
                }
                if !dir.exists() {
                    return Some(StopReason::TargetGone);
                }
            }
        }
        None
    }

    /// Ends the session: stops what is left of a command and removes its cgroup. Returns the
    /// exit code to end with: the command's (128 + signal if it was killed), else 0.
    pub(crate) fn finish(mut self) -> u8 {
        let mut code = 0u8;
        if let Target::Command { cgroup, .. } = &self.target {
            if cgroup.populated() {
                cgroup.terminate(TERMINATE_GRACE);
            }
            if self.status.is_none() {
                if let Some(pid) = self.child {
                    self.status = reap(pid, true);
                }
            }
            code = self.status.map(exit_code).unwrap_or(1);
        }
        // Dropping the target removes the command's cgroup.
        drop(self.target);
        code
    }

    /// A one-line description for headers and messages.
    pub(crate) fn describe(&self) -> String {
        match &self.target {
            Target::Command { argv, cgroup, .. } => {
                let mut cmd = argv.join(" ");
                if cmd.len() > 60 {
                    cmd.truncate(57);
                    cmd.push_str("...");
                }
                match self.child_pid() {
                    Some(pid) => format!("`{cmd}` (pid {pid}, cgroup {})", cgroup.rel),
                    None => format!("`{cmd}` (cgroup {})", cgroup.rel),
                }
            }
            Target::Pid { pid, comm } => format!("pid {pid} ({comm})"),
            Target::Cgroup { rel, pod: None, .. } => format!("cgroup {rel}"),
            Target::Cgroup {
                rel, pod: Some(p), ..
            } => format!("{} (cgroup {rel})", p.describe()),
        }
    }

    /// The target as JSON, for the tools' machine-readable outputs.
    pub(crate) fn describe_json(&self) -> serde_json::Value {
        match &self.target {
            Target::Command { argv, cgroup, .. } => serde_json::json!({
                "kind": "command",
                "argv": argv,
                "pid": self.child_pid(),
                "cgroup": cgroup.rel,
            }),
            Target::Pid { pid, comm } => serde_json::json!({
                "kind": "pid", "pid": pid, "comm": comm,
            }),
            Target::Cgroup { rel, pod: None, .. } => serde_json::json!({
                "kind": "cgroup", "cgroup": rel,
            }),
            Target::Cgroup { pod: Some(p), .. } => p.describe_json(),
        }
    }
}

/// Waits for child `pid` (blocking or not); `None` while it runs.
fn reap(pid: i32, block: bool) -> Option<ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, if block { 0 } else { libc::WNOHANG }) };
        if r == pid {
            return Some(ExitStatus::from_raw(status));
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

/// Exit code of a finished command, as shells report it.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        _ => 1,
    }
}

fn tgid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Resolves `--cgroup PATH` to (directory, path relative to the v2 root).
pub(crate) fn resolve_cgroup(root: &Path, path: &str) -> Result<(PathBuf, String), CliError> {
    let not_found = || CliError::NoSuchCgroup {
        path: path.to_string(),
        root: root.display().to_string(),
    };
    let p = Path::new(path);
    let dir = if p.starts_with(root) {
        p.to_path_buf()
    } else {
        root.join(path.trim_start_matches('/'))
    };
    if !dir.is_dir() || !dir.join("cgroup.procs").exists() {
        return Err(not_found());
    }
    let rel = dir
        .strip_prefix(root)
        .map_err(|_| not_found())?
        .to_string_lossy()
        .trim_end_matches('/')
        .to_string();
    Ok((dir, format!("/{rel}")))
}

/// Spawns `argv` inside `cgroup`; returns its pid.
fn spawn_in_cgroup(argv: &[String], program: &Path, cgroup: &Path) -> Result<i32, CliError> {
    match clone_into_cgroup(argv, program, cgroup) {
        Ok(pid) => Ok(pid),
        // Kernels before 5.7 (no clone3 or no CLONE_INTO_CGROUP).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::EINVAL | libc::E2BIG)
            ) =>
        {
            tracing::debug!(error = %e, "clone3(CLONE_INTO_CGROUP) unavailable, joining in pre_exec");
            spawn_joining(argv, program, cgroup)
        }
        Err(source) => Err(CliError::Spawn {
            command: argv[0].clone(),
            source,
        }),
    }
}

/// `struct clone_args` (CLONE_ARGS_SIZE_VER2, with the cgroup field).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

fn cstring(s: &[u8]) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// fork + exec with the child created directly in `cgroup`: no syscall of ours runs in the
/// cgroup before the command's `execve`. Everything the child needs is prepared before the
/// clone; the child only calls execve (and write + _exit if it fails).
fn clone_into_cgroup(argv: &[String], program: &Path, cgroup: &Path) -> std::io::Result<i32> {
    let dir = std::fs::File::open(cgroup)?;
    let prog = cstring(program.as_os_str().as_bytes())?;
    let args = argv
        .iter()
        .map(|a| cstring(a.as_bytes()))
        .collect::<std::io::Result<Vec<_>>>()?;
    let env = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            cstring(&kv)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut argp: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // A close-on-exec pipe tells the parent whether execve failed (and why).
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut ca = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    let wr_raw = wr.as_raw_fd();
    // The command starts with SIGPIPE at its default, not inherited as ignored (the Rust
    // runtime ignores it here): set it around the clone rather than in the child.
    // SAFETY: plain signal(2) calls; the previous disposition is restored below.
    let old_pipe = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // SAFETY: clone3 with a valid, fully initialised clone_args of the size passed. In the
    // child (pid 0) only async-signal-safe calls run: execve, write, _exit, on memory prepared
    // before the clone.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut ca as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            libc::execve(prog.as_ptr(), argp.as_ptr(), envp.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(wr_raw, (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    let clone_error = std::io::Error::last_os_error();
    // SAFETY: restoring the disposition saved above.
    unsafe { libc::signal(libc::SIGPIPE, old_pipe) };
    drop(wr);
    if pid < 0 {
        return Err(clone_error);
    }
    let pid = pid as i32;
    let mut buf = [0u8; 4];
    let n = loop {
        // SAFETY: reading at most 4 bytes into buf from our pipe.
        let n = unsafe { libc::read(rd.as_raw_fd(), buf.as_mut_ptr().cast(), 4) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        break n;
    };
    if n == 4 {
        reap(pid, true);
        return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(buf)));
    }
    Ok(pid)
}

/// The fallback: a `pre_exec` write to `cgroup.procs` moves the child before it execs (that
/// write is then the first call counted in the cgroup). Only async-signal-safe calls run
/// between fork and exec.
fn spawn_joining(argv: &[String], program: &Path, cgroup: &Path) -> Result<i32, CliError> {
    let procs_path = cgroup.join("cgroup.procs");
    let c_path = CString::new(procs_path.as_os_str().as_bytes())
        .map_err(|_| CliError::Usage(format!("bad cgroup path {}", procs_path.display())))?;
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c_path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(CliError::io(
            format!("opening {}", procs_path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: fd was just opened and is owned here.
    let procs = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = procs.as_raw_fd();
    let mut cmd = Command::new(program);
    cmd.arg0(OsStr::new(&argv[0])).args(&argv[1..]);
    // SAFETY: only write(2) runs between fork and exec; it is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::write(raw, b"0\n".as_ptr().cast(), 2);
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| CliError::Spawn {
        command: argv[0].clone(),
        source,
    })?;
    drop(procs);
    Ok(child.id() as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_programs_like_execvp() {
        assert!(resolve_program("sh").unwrap().is_absolute());
        assert!(matches!(
            resolve_program("surely-not-a-command-xyz"),
            Err(CliError::CommandNotFound(_))
        ));
        assert_eq!(
            resolve_program("/bin/sh").unwrap(),
            PathBuf::from("/bin/sh")
        );
    }

    #[test]
    fn cgroup_paths_resolve_relative_or_absolute() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/cgroup.procs"), "").unwrap();
        let (d, rel) = resolve_cgroup(dir.path(), "/a/b").unwrap();
        assert_eq!(rel, "/a/b");
        assert_eq!(d, dir.path().join("a/b"));
        let abs = dir.path().join("a/b");
        let (_, rel) = resolve_cgroup(dir.path(), abs.to_str().unwrap()).unwrap();
        assert_eq!(rel, "/a/b");
        assert!(matches!(
            resolve_cgroup(dir.path(), "/nope"),
            Err(CliError::NoSuchCgroup { .. })
        ));
    }

    #[test]
    fn filters_match_by_cgroup_or_tgid() {
        let f = Filter::Tgid(42);
        assert!(f.matches(1, 42) && !f.matches(1, 43));
        let f = Filter::Cgroups {
            dir: PathBuf::from("/x"),
            ids: HashSet::from([7]),
        };
        assert!(f.matches(7, 1) && !f.matches(8, 1));
    }

    #[test]
    fn exit_codes_like_shells() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
