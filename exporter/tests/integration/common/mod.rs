//! Shared helpers of the real-kernel integration tests: root checks, fresh cgroups, a running
//! exporter, and a parser for the exposition text.
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

// One rule for skipping tests, shared with the library's unit tests.
#[path = "../../../src/util/test_support.rs"]
mod test_support;
pub(crate) use test_support::{require, require_root};

/// The cgroup v2 mount of this machine.
pub fn cgroup_root() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    sysscope::metadata::cgroups::find_v2_mount(&text).expect("cgroup v2 mounted")
}

/// Every exporter a test starts sees every process of the node. Tests that flood the node
/// (thousands of processes, cgroups or syscall keys) would push the series of tests running
/// beside them over those exporters' budgets, so they run alone ([`alone`]); every other test
/// shares the node while it holds a [`TestCgroup`] or an [`Exporter`].
static NODE: std::sync::RwLock<()> = std::sync::RwLock::new(());

thread_local! {
    /// This thread's hold on [`NODE`]: alone, or shared by this many cgroups (one read lock
    /// per thread, so a writer waiting between two reads of one thread cannot deadlock it).
    static NODE_HOLD: std::cell::RefCell<NodeHold> = const { std::cell::RefCell::new(NodeHold::None) };
}

enum NodeHold {
    None,
    Shared(std::sync::RwLockReadGuard<'static, ()>, usize),
    Alone,
}

/// Runs the calling test alone on the node until the guard is dropped.
pub fn alone() -> AloneGuard {
    let guard = NODE.write().unwrap_or_else(|e| e.into_inner());
    NODE_HOLD.with(|h| *h.borrow_mut() = NodeHold::Alone);
    AloneGuard { _guard: guard }
}

pub struct AloneGuard {
    _guard: std::sync::RwLockWriteGuard<'static, ()>,
}

impl Drop for AloneGuard {
    fn drop(&mut self) {
        NODE_HOLD.with(|h| *h.borrow_mut() = NodeHold::None);
    }
}

/// A share of the node for a test that loads the probes by other means (the command-line
/// tools): they see every process too.
pub fn share_node() -> impl Drop {
    NodeShare::take()
}

/// A share of the node, held by each [`TestCgroup`] and each [`Exporter`]. Taken and dropped
/// on the test's own thread (the hold is counted per thread).
struct NodeShare;

impl NodeShare {
    fn take() -> Self {
        NODE_HOLD.with(|h| {
            let mut hold = h.borrow_mut();
            match &mut *hold {
                NodeHold::Alone => {}
                NodeHold::Shared(_, n) => *n += 1,
                NodeHold::None => {
                    let guard = NODE.read().unwrap_or_else(|e| e.into_inner());
                    *hold = NodeHold::Shared(guard, 1);
                }
            }
        });
        NodeShare
    }
}

impl Drop for NodeShare {
    fn drop(&mut self) {
        NODE_HOLD.with(|h| {
            let mut hold = h.borrow_mut();
            if let NodeHold::Shared(_, n) = &mut *hold {
                *n -= 1;
                if *n == 0 {
                    *hold = NodeHold::None;
                }
            }
        });
    }
}

/// A fresh cgroup v2 directory, removed on drop.
pub struct TestCgroup {
    pub dir: PathBuf,
    /// Path relative to the v2 root, as sysscope labels it.
    pub rel: String,
    _node: NodeShare,
}

impl TestCgroup {
    pub fn new(prefix: &str) -> Self {
        Self::at(&format!(
            "{prefix}-{}-{}",
            std::process::id(),
            rand_suffix()
        ))
    }

    /// A cgroup at `rel` (slashes allowed: parents are created too).
    pub fn at(rel: &str) -> Self {
        let rel = rel.trim_start_matches('/');
        let dir = cgroup_root().join(rel);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self {
            dir,
            rel: format!("/{rel}"),
            _node: NodeShare::take(),
        }
    }

    /// The cgroup id sysscope's probes see for tasks inside.
    pub fn id(&self) -> u64 {
        sysscope::metadata::cgroups::id_of(&self.dir).unwrap()
    }

    /// A command whose process moves itself into this cgroup before it execs.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        command_in_cgroup(&self.dir, program)
    }
}

/// A command whose process moves itself into the cgroup `dir` (any name, UTF-8 or not)
/// before it execs.
pub fn command_in_cgroup(dir: &Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
    use std::os::unix::ffi::OsStrExt;
    let mut cmd = Command::new(program);
    let procs = std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).unwrap();
    // SAFETY: only async-signal-safe calls (open, write, close) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let r = libc::write(fd, b"0\n".as_ptr().cast(), 2);
            libc::close(fd);
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Move stragglers out, then remove (retrying briefly while the last ones exit).
        let root_procs = cgroup_root().join("cgroup.procs");
        for _ in 0..50 {
            if let Ok(pids) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
                for pid in pids.lines() {
                    let _ = std::fs::write(&root_procs, pid);
                }
            }
            // Child cgroups a test made inside go first, deepest first.
            remove_child_dirs(&self.dir);
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn remove_child_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_child_dirs(&entry.path());
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

pub fn rand_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{nanos:08x}")
}

pub fn workload_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sysscope-workload")
}

pub fn sysscope_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sysscope")
}

/// The comm the kernel gives the workload binary (15 characters at most).
pub const WORKLOAD_COMM: &str = "sysscope-worklo";

/// Runs a workload in `cg` and waits for it to succeed.
pub fn run_workload(cg: &TestCgroup, args: &[&str]) {
    let status = cg
        .command(workload_bin())
        .args(args)
        .status()
        .expect("spawn workload");
    assert!(status.success(), "workload {args:?} failed: {status}");
}

/// Runs a workload that joins `cg` itself once started, so that exactly the calls of `args`
/// (plus the write and close of joining) happen inside the cgroup: the dynamic loader's
/// start-up calls stay outside.
pub fn run_workload_joined(cg: &TestCgroup, args: &[&str]) {
    let status = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&cg.dir)
        .args(args)
        .status()
        .expect("spawn workload");
    assert!(status.success(), "workload {args:?} failed: {status}");
}

/// eBPF program ids held open by process `pid` (from /proc/<pid>/fdinfo).
pub fn bpf_program_ids_of(pid: u32) -> Vec<u64> {
    bpf_object_ids_of(pid, "prog_id:")
}

/// eBPF map ids held open by process `pid` (from /proc/<pid>/fdinfo).
pub fn bpf_map_ids_of(pid: u32) -> Vec<u64> {
    bpf_object_ids_of(pid, "map_id:")
}

fn bpf_object_ids_of(pid: u32, field: &str) -> Vec<u64> {
    let mut ids = Vec::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for fd in fds.flatten() {
        if let Ok(info) = std::fs::read_to_string(fd.path()) {
            for line in info.lines() {
                if let Some(id) = line.strip_prefix(field) {
                    if let Ok(id) = id.trim().parse() {
                        ids.push(id);
                    }
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Every eBPF object of `kind` (`prog`, `map`, `link`) on the machine, as `bpftool -j KIND
/// show` describes it; none where bpftool fails.
pub fn bpftool_show(kind: &str) -> Vec<serde_json::Value> {
    let out = Command::new("bpftool")
        .args(["-j", kind, "show"])
        .output()
        .expect("bpftool");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Ids of every eBPF map on the machine (bpftool).
pub fn loaded_map_ids() -> Vec<u64> {
    bpftool_show("map")
        .iter()
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

/// Resident memory of process `pid` in KiB (VmRSS), if it is alive.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Sends raw bytes to the exporter and returns everything it answers before closing (or
/// until `timeout`).
pub fn raw_request(port: u16, bytes: &[u8], timeout: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    // A server may answer (e.g. 431) and close before reading everything we send.
    if let Err(e) = s.write_all(bytes) {
        if !matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ) {
            return Err(e);
        }
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // The timeout, or a reset (the server closed with unread input), ends the answer.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                break
            }
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

/// Ids of every eBPF program loaded on the machine (bpftool).
pub fn loaded_program_ids() -> Vec<u64> {
    bpftool_show("prog")
        .iter()
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

/// A port nothing listens on, for an exporter to bind. Taken below the kernel's ephemeral
/// range: the exporter binds only after loading its probes, and a port the kernel picked for
/// `bind(0)` can meanwhile become the local port of any outgoing connection (under the scrape
/// soaks there are thousands), so the exporter would fail with "address in use". Ports below
/// the range are only ever taken by an explicit bind; each is handed out once per test run.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    // Spread test runs of different processes apart; 10000.. is below every usual range.
    let (first, span) = (10_000u32, low.saturating_sub(10_000).max(1000));
    let start = std::process::id() % span;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < span, "no free port below {low}");
        let port = (first + (start + n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A running `sysscope` exporter, stopped with SIGTERM on drop.
pub struct Exporter {
    pub child: Child,
    pub port: u16,
    pub config: PathBuf,
    _dir: tempfile::TempDir,
    /// An exporter sees every process of the node: it must not run while a test floods it
    /// (its maps would fill and pids wrap around under it), even before its test takes a
    /// cgroup. Declared last: dropped after the process is stopped.
    _node: NodeShare,
}

/// Config every test starts from: no scrape caching, so each scrape reads the maps.
pub const TEST_CONFIG: &str = "[collection]\nmin_interval = \"0s\"\n";

impl Exporter {
    /// Starts the exporter with `config` (TOML) and extra flags, and waits until it is ready.
    pub fn start(config: &str, extra_args: &[&str]) -> Self {
        Self::start_on(free_port(), config, extra_args)
    }

    /// [`Exporter::start`] on a given port.
    pub fn start_on(port: u16, config: &str, extra_args: &[&str]) -> Self {
        let mut e = Self::spawn_on(port, config, extra_args);
        e.wait_ready(Duration::from_secs(30));
        e
    }

    /// Like [`Exporter::start`], with extra environment variables (e.g. `OTEL_*`).
    pub fn start_with_env(config: &str, extra_args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut e = Self::spawn_with_env(free_port(), config, extra_args, env);
        e.wait_ready(Duration::from_secs(30));
        e
    }

    /// Starts the exporter without waiting (for endpoints the plain-HTTP readiness check
    /// cannot reach, e.g. TLS); see [`Exporter::wait_for`].
    pub fn spawn_on(port: u16, config: &str, extra_args: &[&str]) -> Self {
        Self::spawn_with_env(port, config, extra_args, &[])
    }

    /// [`Exporter::spawn_on`] with extra environment variables.
    pub fn spawn_with_env(
        port: u16,
        config: &str,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_wrapped(port, config, extra_args, env, &[])
    }

    /// [`Exporter::spawn_with_env`] run through `wrapper` (a command that execs its arguments,
    /// e.g. `unshare --mount -- sh -c '...; exec "$0" "$@"'`), so the exporter's pid is the
    /// child's.
    pub fn spawn_wrapped(
        port: u16,
        config: &str,
        extra_args: &[&str],
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Self {
        let node = NodeShare::take();
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("sysscope.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(sysscope_bin());
                c
            }
            None => Command::new(sysscope_bin()),
        };
        let child = cmd
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!("--config.file={}", config_path.display()))
            .args(extra_args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sysscope");
        Self {
            child,
            port,
            config: config_path,
            _dir: dir,
            _node: node,
        }
    }

    /// Waits until `ready` holds (panics if the exporter exits or 30 s pass).
    pub fn wait_for(&mut self, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sysscope exited during start-up: {status}");
            }
            if ready() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sysscope not ready after 30 s");
    }

    /// Sends `signal` and waits; returns the exit status and how long it took.
    pub fn stop_with(&mut self, signal: i32) -> (std::process::ExitStatus, Duration) {
        let start = Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let status = self.child.wait().expect("wait sysscope");
        (status, start.elapsed())
    }

    pub fn wait_ready(&mut self, timeout: Duration) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sysscope exited during start-up: {status}");
            }
            if let Ok((200, _, _)) = http_get(self.port, "/-/ready", None) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sysscope not ready after {timeout:?}");
    }

    /// The metrics in Prometheus text format.
    pub fn scrape(&self) -> String {
        let (status, _, body) = http_get(self.port, "/metrics", None).expect("scrape");
        assert_eq!(status, 200, "scrape status");
        body
    }

    /// The metrics as OpenMetrics.
    pub fn scrape_openmetrics(&self) -> String {
        let (status, headers, body) = http_get(
            self.port,
            "/metrics",
            Some("application/openmetrics-text; version=1.0.0"),
        )
        .expect("scrape");
        assert_eq!(status, 200);
        assert!(
            headers
                .to_ascii_lowercase()
                .contains("application/openmetrics-text"),
            "{headers}"
        );
        body
    }

    /// Sends SIGTERM and waits; returns the exit status and how long it took.
    pub fn stop(&mut self) -> (std::process::ExitStatus, Duration) {
        let start = Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait sysscope");
        (status, start.elapsed())
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.stop();
        }
    }
}

/// Makes ring the process's TLS provider, as the binary does: reqwest's clients take it unless
/// given a TLS configuration.
pub fn tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A GET on loopback over a fresh connection: (status, the response head as text, body).
pub fn http_get(
    port: u16,
    path: &str,
    accept: Option<&str>,
) -> std::io::Result<(u16, String, String)> {
    static CLIENT: std::sync::OnceLock<reqwest::blocking::Client> = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(|| {
        tls_provider();
        reqwest::blocking::Client::builder()
            // Each request on a connection of its own, as a scraper or a probe opens it.
            .pool_max_idle_per_host(0)
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("HTTP client")
    });
    let mut request = client.get(format!("http://127.0.0.1:{port}{path}"));
    if let Some(accept) = accept {
        request = request.header(reqwest::header::ACCEPT, accept);
    }
    let response = request.send().map_err(std::io::Error::other)?;
    let mut head = format!("{:?} {}\r\n", response.version(), response.status());
    for (name, value) in response.headers() {
        head.push_str(&format!(
            "{name}: {}\r\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    let status = response.status().as_u16();
    let body = response.bytes().map_err(std::io::Error::other)?;
    Ok((status, head, String::from_utf8_lossy(&body).into_owned()))
}

/// One sample of the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses sample lines of the Prometheus text / OpenMetrics formats (comments skipped) with
/// the exporter's own reader; a line that does not parse fails the test.
pub fn parse_samples(text: &str) -> Vec<Sample> {
    sysscope::openmetrics::sample_lines(text)
        .map(|(line, sample)| {
            let s = sample.unwrap_or_else(|| panic!("not a sample line: {line}"));
            Sample {
                name: s.name,
                labels: s.labels.into_iter().collect(),
                value: s.value,
            }
        })
        .collect()
}

/// Samples named `name` whose labels include every pair of `want`.
pub fn select<'a>(samples: &'a [Sample], name: &str, want: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// Sum of the values of the selected samples (0 if none).
pub fn sum(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    select(samples, name, want).iter().map(|s| s.value).sum()
}

/// The getppid calls counted in `cg`, over every process name.
pub fn getppid_calls(samples: &[Sample], cg: &TestCgroup) -> f64 {
    sum(
        samples,
        "sysscope_syscalls_total",
        &[("cgroup", &cg.rel), ("syscall", "getppid")],
    )
}

/// Polls `f` until it returns Some or `timeout` passes.
pub fn eventually<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn path_exists(p: impl AsRef<Path>) -> bool {
    p.as_ref().exists()
}

/// A loop device backed by a sparse temporary file, detached on drop.
pub struct LoopDevice {
    /// `/dev/loopN`
    pub path: String,
    /// `loopN`, the kernel's disk name
    pub name: String,
    pub size: u64,
    _backing: tempfile::TempDir,
}

impl LoopDevice {
    pub fn new(size: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("backing.img");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(size))
            .expect("create backing file");
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .expect("losetup (util-linux) must be installed");
        assert!(
            out.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let name = path.trim_start_matches("/dev/").to_string();
        Self {
            path,
            name,
            size,
            _backing: dir,
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.path]).status();
    }
}

/// `bpftool map dump` of the exporter's map called `name`, as a list of entries.
pub fn dump_exporter_map(exporter: &Exporter, name: &str) -> Vec<serde_json::Value> {
    let map_id = bpf_map_ids_of(exporter.child.id())
        .into_iter()
        .find(|map_id| {
            let out = Command::new("bpftool")
                .args(["-j", "map", "show", "id", &map_id.to_string()])
                .output()
                .expect("bpftool");
            let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            info["name"] == name
        })
        .unwrap_or_else(|| panic!("the exporter holds its {name} map open"));
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "id", &map_id.to_string()])
        .output()
        .expect("bpftool");
    assert!(out.status.success(), "bpftool map dump id {map_id} failed");
    let entries: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bpftool prints JSON");
    entries
        .as_array()
        .expect("bpftool prints a list of entries")
        .clone()
}

/// A CPU quota (CFS bandwidth) on a test cgroup: `cpu.max` in the cgroup itself when the v2
/// hierarchy has the `cpu` controller, else (hybrid hosts) the v1 `cpu` cgroup of the same path,
/// which the cgroup's processes must join too ([`CpuQuota::join`]). The v1 cgroup, and the
/// parents created for it, are removed on drop (its tasks must have exited).
pub struct CpuQuota {
    /// Where `cpu.stat` and the quota are.
    pub dir: PathBuf,
    /// The v1 `cpu` cgroup to join as well (`join-cgroup DIR` of the workload), if any.
    pub join: Option<PathBuf>,
    /// The v1 directories created for it, parents first.
    created: Vec<PathBuf>,
}

impl CpuQuota {
    /// [`CpuQuota::new`] for `test`, which skips (or, under CI, fails) without a cpu controller.
    pub fn required(test: &str, cg: &TestCgroup, quota_us: u64, period_us: u64) -> Option<Self> {
        let quota = Self::new(cg, quota_us, period_us);
        let what = "the cpu controller (cgroup v2, or v1 on a hybrid host)";
        require(test, what, quota.is_some());
        quota
    }

    /// `quota_us` of every `period_us` for `cg`; `None` where no cpu controller is available.
    pub fn new(cg: &TestCgroup, quota_us: u64, period_us: u64) -> Option<Self> {
        let root = cgroup_root();
        let controllers =
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "cpu") {
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
            if cg.dir.join("cpu.max").exists() {
                std::fs::write(cg.dir.join("cpu.max"), format!("{quota_us} {period_us}")).ok()?;
                return Some(Self {
                    dir: cg.dir.clone(),
                    join: None,
                    created: Vec::new(),
                });
            }
        }
        // The v1 `cpu` hierarchy of a hybrid host, found as the exporter finds it.
        let v1 = sysscope::metadata::cpu_bandwidth::BandwidthReader::new(root)
            .v1_cpu_root()?
            .to_path_buf();
        let dir = v1.join(cg.rel.trim_start_matches('/'));
        let mut created: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|d| d.starts_with(&v1) && *d != v1 && !d.exists())
            .map(PathBuf::from)
            .collect();
        created.reverse();
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(dir.join("cpu.cfs_period_us"), period_us.to_string()).ok()?;
        std::fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string()).ok()?;
        Some(Self {
            dir: dir.clone(),
            join: Some(dir),
            created,
        })
    }

    /// The fields of its `cpu.stat`.
    pub fn stat(&self) -> std::collections::HashMap<String, u64> {
        std::fs::read_to_string(self.dir.join("cpu.stat"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        let Some(dir) = &self.join else { return };
        for _ in 0..50 {
            if std::fs::remove_dir(dir).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for parent in self.created.iter().rev().filter(|d| *d != dir) {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Reads `child`'s stderr (piped) until the `sysscope` tool it runs says it is measuring;
/// the child and the rest of its stderr. Panics if the tool exits first.
pub fn until_measuring(mut child: Child) -> (Child, BufReader<std::process::ChildStderr>) {
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if err.read_line(&mut line).unwrap() == 0 {
            let status = child.wait().unwrap();
            panic!("sysscope exited before measuring: {status}");
        }
        if line.contains("measuring") {
            return (child, err);
        }
    }
}

/// The standard output of a command that must have exited with 0 (its stderr otherwise).
pub fn stdout_of_success(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the `sysscope` binary with `args` and the variables `env` added, sharing the node
/// with the other tests; returns (exit code, stdout, stderr). cargo's LD_LIBRARY_PATH is
/// removed so the workload's dynamic loader makes the same calls as from a shell.
pub fn run_sysscope(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let _node = share_node();
    let out = Command::new(sysscope_bin())
        .env_remove("LD_LIBRARY_PATH")
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sysscope");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The 0.0.4 text and the OpenMetrics exposition written to files of a fresh directory, for
/// promtool and the reference parsers: (the directory, the text's path, the OpenMetrics path).
pub fn exposition_files(text: &str, om: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let text_path = dir.path().join("metrics.txt");
    let om_path = dir.path().join("metrics.om");
    std::fs::write(&text_path, text).unwrap();
    std::fs::write(&om_path, om).unwrap();
    (dir, text_path, om_path)
}

/// `promtool check metrics` (Prometheus' own parser and linter) on the 0.0.4 text at `path`.
pub fn promtool_check_metrics(path: &Path) -> std::process::Output {
    Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(path).unwrap())
        .output()
        .expect("promtool (Debian package prometheus) must be installed")
}
