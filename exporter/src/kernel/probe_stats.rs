//! The kernel's BPF run-time statistics behind `sysscope_probe_run_seconds_total`,
//! `sysscope_probe_runs_total` and `sysscope_probe_stats_coverage_ratio`
//! (`collection.probe_stats`).
//!
//! While statistics are on, the kernel reads its clock before and after every run of every
//! eBPF program on the machine: on the 2-vCPU VM of docs/performance.md that costs more per
//! syscall than sysscope's probes themselves. So by default they are only *sampled*: turned on
//! (with `BPF_ENABLE_STATS`) for [`WINDOW`] every [`PERIOD`], and each window's run time and run
//! count are extrapolated to the time since the previous window. The counters stay monotonic,
//! their ratio (time per run) is measured exactly within the windows, and their rates are
//! estimates. "always" keeps statistics on (exact counters), "off" never turns them on.
//! Holders of `BPF_ENABLE_STATS` elsewhere on the machine keep statistics on regardless; in
//! sampled mode only the deltas inside sysscope's windows are used, so they change nothing.
//!
//! `BPF_ENABLE_STATS` needs CAP_SYS_ADMIN each time statistics are turned on, and the exporter
//! gives that capability up once its probes are attached (privileges.rs). So in sampled mode
//! the switching is done by a helper process ([`StatsHelper`]): the same binary started with
//! [`HELPER_ARG`], which keeps CAP_SYS_ADMIN and nothing else, reads one byte at a time from a
//! pipe only the exporter holds (`1`: statistics on, `0`: off), answers on another, and exits
//! when the exporter goes away (the pipe closes).
//!
//! Where sysscope may not switch them (no CAP_SYS_ADMIN, as in the Kubernetes DaemonSet), the
//! node's `kernel.bpf_stats_enabled = 1` keeps them on for every program: both modes then read
//! them as if sysscope held them (sampled windows, or the exact counters).

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{config::ProbeStatsMode, util::error::Chain};

/// How long statistics stay on in each sampling period.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);
/// Time from the start of one sampling window to the start of the next.
pub(crate) const PERIOD: Duration = Duration::from_secs(30);

/// Run time and run count of one program.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RunTotals {
    pub(crate) run_time: Duration,
    pub(crate) runs: u64,
}

#[derive(Default)]
struct Shared {
    /// Program id -> extrapolated totals.
    estimates: Mutex<HashMap<u32, (f64, f64)>>,
    /// Nanoseconds statistics were on, over all windows.
    on_ns: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl Shared {
    /// Sleeps for `d` unless asked to stop; true when asked to stop.
    fn sleep(&self, d: Duration) -> bool {
        let stop = self.stop.lock().expect("stats stop lock");
        let (stop, _) = self
            .wake
            .wait_timeout_while(stop, d, |stop| !*stop)
            .expect("stats stop lock");
        *stop
    }
}

/// Keeps run-time statistics on as `collection.probe_stats` asks, for as long as it lives.
pub(crate) struct RunTimeStats {
    mode: ProbeStatsMode,
    started: Instant,
    shared: Arc<Shared>,
    sampler: Option<JoinHandle<()>>,
    /// "always": held for the whole run.
    _always: Option<OwnedFd>,
}

impl std::fmt::Debug for RunTimeStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunTimeStats")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// The argument that makes the binary the statistics helper.
pub const HELPER_ARG: &str = "--internal.bpf-stats-helper";

/// When the binary was started as the statistics helper, serves the exporter's requests and
/// returns the exit status; `None` otherwise. Called first thing by every binary that loads
/// the probes.
pub fn run_helper_if_asked() -> Option<i32> {
    if std::env::args_os().nth(1).as_deref() != Some(std::ffi::OsStr::new(HELPER_ARG)) {
        return None;
    }
    // Nothing but switching statistics: CAP_SYS_ADMIN alone, no_new_privs.
    if let Err(e) = crate::privileges::drop_to(1 << crate::privileges::CAP_SYS_ADMIN) {
        eprintln!("sysscope statistics helper: {e}");
        return Some(1);
    }
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut held: Option<OwnedFd> = None;
    let mut byte = [0u8; 1];
    use std::io::{Read, Write};
    // EOF (the exporter exited or dropped the pipe) ends the helper.
    while let Ok(1) = stdin.read(&mut byte) {
        let answer = match byte[0] {
            b'1' => {
                if held.is_none() {
                    held = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
                }
                if held.is_some() {
                    b'1'
                } else {
                    b'0'
                }
            }
            _ => {
                held = None;
                b'0'
            }
        };
        if stdout
            .write_all(&[answer])
            .and_then(|()| stdout.flush())
            .is_err()
        {
            break;
        }
    }
    Some(0)
}

/// The statistics helper process, seen from the exporter.
struct StatsHelper {
    child: std::process::Child,
    to: std::process::ChildStdin,
    from: std::process::ChildStdout,
}

impl StatsHelper {
    fn spawn() -> std::io::Result<Self> {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .arg(HELPER_ARG)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let to = child.stdin.take().expect("piped stdin");
        let from = child.stdout.take().expect("piped stdout");
        Ok(Self { child, to, from })
    }

    /// Asks for statistics on (`true`) or off; true when the helper says they are on.
    fn switch(&mut self, on: bool) -> bool {
        use std::io::{Read, Write};
        let mut answer = [0u8; 1];
        self.to.write_all(if on { b"1" } else { b"0" }).is_ok()
            && self.from.read_exact(&mut answer).is_ok()
            && answer[0] == b'1'
    }
}

impl Drop for StatsHelper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the node keeps statistics on for every program (`sysctl kernel.bpf_stats_enabled=1`,
/// readable without privileges, in a container too).
fn on_system_wide() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|v| v.trim() == "1")
}

fn enable() -> Option<OwnedFd> {
    match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(e) => {
            if !on_system_wide() {
                tracing::warn!(error = %Chain(&e), "cannot enable BPF run-time statistics (set kernel.bpf_stats_enabled = 1 on the node where sysscope may not); probe cost metrics will read 0");
            }
            None
        }
    }
}

/// (run time ns, runs) of this process's programs, by id, from the fdinfo of the program
/// descriptors it holds: the kernel writes both counters there, so reading them needs no
/// capability (enumerating programs by id would need CAP_SYS_ADMIN, which is given up).
fn snapshot() -> HashMap<u32, (u64, u64)> {
    let mut out = HashMap::new();
    for info in crate::util::fdinfo::own() {
        let field = |name: &str| info.field(name);
        if let (Some(id), Some(run_time), Some(runs)) =
            (field("prog_id:"), field("run_time_ns:"), field("run_cnt:"))
        {
            out.insert(id as u32, (run_time, runs));
        }
    }
    out
}

fn sample(shared: &Shared, started: Instant, mut helper: StatsHelper) {
    let mut last_end = started;
    let mut warned = false;
    loop {
        // Either switch will do: the helper's, or the node's sysctl holding them on.
        if !helper.switch(true) && !on_system_wide() {
            if !warned {
                tracing::warn!("the statistics helper cannot enable BPF run-time statistics (it needs CAP_SYS_ADMIN, or kernel.bpf_stats_enabled = 1 on the node); probe cost metrics will read 0");
                warned = true;
            }
            if shared.sleep(PERIOD) {
                return;
            }
            continue;
        }
        let t0 = Instant::now();
        let before = snapshot();
        let stop = shared.sleep(WINDOW);
        let after = snapshot();
        let t1 = Instant::now();
        helper.switch(false);
        let on = t1 - t0;
        shared
            .on_ns
            .fetch_add(on.as_nanos() as u64, Ordering::Relaxed);
        // This window stands for the time since the previous one ended.
        let scale = (t1 - last_end).as_secs_f64() / on.as_secs_f64().max(1e-9);
        last_end = t1;
        {
            let mut est = shared.estimates.lock().expect("stats estimates lock");
            for (id, (rt, runs)) in &after {
                // A program loaded during the window has run only while statistics were on.
                let (rt0, runs0) = before.get(id).copied().unwrap_or_default();
                let e = est.entry(*id).or_default();
                e.0 += rt.saturating_sub(rt0) as f64 * scale;
                e.1 += runs.saturating_sub(runs0) as f64 * scale;
            }
        }
        if stop || shared.sleep(PERIOD.saturating_sub(t1 - t0)) {
            return;
        }
    }
}

impl RunTimeStats {
    pub(crate) fn start(mode: ProbeStatsMode) -> Self {
        let started = Instant::now();
        let shared = Arc::new(Shared::default());
        let (always, sampler) = match mode {
            ProbeStatsMode::Always => (enable(), None),
            ProbeStatsMode::Off => (None, None),
            ProbeStatsMode::Sampled => {
                let s = shared.clone();
                let handle = StatsHelper::spawn()
                    .map_err(|e| tracing::warn!(error = %Chain(&e), "cannot start the BPF statistics helper; probe cost metrics will read 0"))
                    .ok()
                    .and_then(|helper| {
                        std::thread::Builder::new()
                            .name("sysscope-stats".into())
                            .spawn(move || sample(&s, started, helper))
                            .map_err(|e| tracing::warn!(error = %Chain(&e), "cannot start the BPF statistics sampler"))
                            .ok()
                    });
                (None, handle)
            }
        };
        Self {
            mode,
            started,
            shared,
            sampler,
            _always: always,
        }
    }

    /// Fraction of sysscope's run time that statistics were on.
    pub(crate) fn coverage(&self) -> f64 {
        match self.mode {
            ProbeStatsMode::Always if self._always.is_some() || on_system_wide() => 1.0,
            ProbeStatsMode::Sampled => {
                let on = self.shared.on_ns.load(Ordering::Relaxed) as f64;
                on / (self.started.elapsed().as_nanos() as f64).max(1.0)
            }
            _ => 0.0,
        }
    }

    /// Totals of program `id`: `kernel` (its own counters) in "always" mode, extrapolated from
    /// the samples in "sampled" mode, none when off.
    pub(crate) fn totals(&self, id: u32, kernel: RunTotals) -> Option<RunTotals> {
        match self.mode {
            ProbeStatsMode::Always => Some(kernel),
            ProbeStatsMode::Off => None,
            ProbeStatsMode::Sampled => {
                let est = self.shared.estimates.lock().expect("stats estimates lock");
                let (ns, runs) = est.get(&id).copied().unwrap_or_default();
                Some(RunTotals {
                    run_time: Duration::from_nanos(ns as u64),
                    runs: runs as u64,
                })
            }
        }
    }
}

impl Drop for RunTimeStats {
    fn drop(&mut self) {
        *self.shared.stop.lock().expect("stats stop lock") = true;
        self.shared.wake.notify_all();
        if let Some(handle) = self.sampler.take() {
            let _ = handle.join();
        }
    }
}
