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

use crate::config::ProbeStatsMode;

/// How long statistics stay on in each sampling period.
pub const WINDOW: Duration = Duration::from_secs(1);
/// Time from the start of one sampling window to the start of the next.
pub const PERIOD: Duration = Duration::from_secs(30);

/// Run time and run count of one program.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunTotals {
    pub run_time: Duration,
    pub runs: u64,
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
pub struct RunTimeStats {
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

fn enable() -> Option<OwnedFd> {
    match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!(error = %e, "cannot enable BPF run-time statistics; probe cost metrics will read 0");
            None
        }
    }
}

/// (run time ns, runs) of this process's programs, by id.
fn snapshot() -> HashMap<u32, (u64, u64)> {
    let ours = own_program_ids();
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ours.contains(&p.id()))
        .map(|p| (p.id(), (p.run_time().as_nanos() as u64, p.run_count())))
        .collect()
}

/// Ids of the eBPF programs this process holds open.
fn own_program_ids() -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(fds) = std::fs::read_dir("/proc/self/fdinfo") else {
        return ids;
    };
    for fd in fds.flatten() {
        if let Ok(text) = std::fs::read_to_string(fd.path()) {
            ids.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("prog_id:"))
                    .filter_map(|v| v.trim().parse::<u32>().ok()),
            );
        }
    }
    ids
}

fn sample(shared: &Shared, started: Instant) {
    let mut last_end = started;
    loop {
        let Some(fd) = enable() else {
            if shared.sleep(PERIOD) {
                return;
            }
            continue;
        };
        let t0 = Instant::now();
        let before = snapshot();
        let stop = shared.sleep(WINDOW);
        let after = snapshot();
        let t1 = Instant::now();
        drop(fd);
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
    pub fn start(mode: ProbeStatsMode) -> Self {
        let started = Instant::now();
        let shared = Arc::new(Shared::default());
        let (always, sampler) = match mode {
            ProbeStatsMode::Always => (enable(), None),
            ProbeStatsMode::Off => (None, None),
            ProbeStatsMode::Sampled => {
                let s = shared.clone();
                let handle = std::thread::Builder::new()
                    .name("sysscope-stats".into())
                    .spawn(move || sample(&s, started))
                    .map_err(
                        |e| tracing::warn!(error = %e, "cannot start the BPF statistics sampler"),
                    )
                    .ok();
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

    pub fn mode(&self) -> ProbeStatsMode {
        self.mode
    }

    /// Fraction of sysscope's run time that statistics were on.
    pub fn coverage(&self) -> f64 {
        match self.mode {
            ProbeStatsMode::Always if self._always.is_some() => 1.0,
            ProbeStatsMode::Sampled => {
                let on = self.shared.on_ns.load(Ordering::Relaxed) as f64;
                on / (self.started.elapsed().as_nanos() as f64).max(1.0)
            }
            _ => 0.0,
        }
    }

    /// Totals of program `id`: `kernel` (its own counters) in "always" mode, extrapolated from
    /// the samples in "sampled" mode, none when off.
    pub fn totals(&self, id: u32, kernel: RunTotals) -> Option<RunTotals> {
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
