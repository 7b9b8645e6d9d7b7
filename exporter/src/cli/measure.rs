//! The measuring loop shared by `summary`, `trace` and `diagnose`: load the probes for the
//! target, point their filter at it, start it, read the syscall maps and/or the trace stream
//! (`crate::kernel::trace`; and, for `trace`, the target's block I/O, see [`super::block`])
//! until the session ends, and report what the probes dropped.

use std::time::{Duration, Instant};

use super::{
    block::{self, BlockStream},
    profile::{DropCounters, ProbeDrops, Profile, ProfileReader},
    progress::{thousands, Progress},
    session::{Session, StopReason},
    sink::EventSink,
    CliError,
};
use crate::{
    config::Config,
    kernel::{self, trace::TraceEvents, Probes},
    util::error::Chain,
};

/// How often the syscall maps are read during a run (and exited processes reclaimed).
const MAP_READ_EVERY: Duration = Duration::from_secs(1);
/// How long one loop iteration waits for trace records (or sleeps without a stream).
const TICK: Duration = Duration::from_millis(100);

/// What a run asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wants {
    /// Read the syscall counters (`summary`, `diagnose`).
    pub(crate) profile: bool,
    /// Stream every call of the target (`trace`, `diagnose`).
    pub events: bool,
    /// Trace ring buffer size in bytes (with `events`).
    pub ring_buffer_bytes: u32,
    /// Also the target's block I/O (`trace`): totals and requests to the sink; the ring
    /// buffer of requests gets this many bytes. 0: no block I/O.
    pub(crate) block_ring_buffer_bytes: u32,
    pub(crate) quiet: bool,
}

/// cgroup CPU time (`cpu.stat`) consumed during the run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuUsage {
    pub user: Duration,
    pub system: Duration,
}

/// What a run measured.
#[derive(Debug)]
pub struct Measurement {
    pub(crate) profile: Profile,
    pub wall: Duration,
    pub stop: StopReason,
    pub drops: ProbeDrops,
    /// CPU time of the target's cgroup, when the target is one.
    pub cpu: Option<CpuUsage>,
    /// Trace records received.
    pub events: u64,
    /// Why the target's block I/O was not recorded, when it was asked for and could not be.
    pub(crate) block_off: Option<String>,
}

/// The configuration the tools load probes with: the user's limits, no slow-call sampling.
pub(crate) fn tool_config(config: &Config) -> Config {
    let mut c = config.clone();
    c.slow_calls.enabled = false;
    c
}

/// Points the probes' in-kernel trace filter at the session's target (its cgroup, or its
/// pid). The probes must have been loaded with `session.load_options()`.
fn set_target_filter(probes: &mut Probes, session: &Session) -> Result<(), CliError> {
    let cgroup = match session.cgroup_dir() {
        Some(dir) => Some(
            std::fs::File::open(dir)
                .map_err(|e| CliError::io(format!("opening {}", dir.display()), e))?,
        ),
        None => None,
    };
    kernel::trace::set_target_filter(probes, cgroup.as_ref(), session.pid())?;
    Ok(())
}

fn read_cpu_stat(session: &Session) -> Option<CpuUsage> {
    let text = std::fs::read_to_string(session.cgroup_dir()?.join("cpu.stat")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
    };
    Some(CpuUsage {
        user: Duration::from_micros(field("user_usec ")?),
        system: Duration::from_micros(field("system_usec ")?),
    })
}

/// Runs `session` to its end. `sink` receives every trace record when `wants.events`;
/// `on_tick` runs every iteration with the monotonic time (for samplers).
pub(crate) fn run(
    session: &mut Session,
    config: &Config,
    tool: &'static str,
    wants: Wants,
    sink: &mut dyn EventSink,
) -> Result<Measurement, CliError> {
    let mut options = session.load_options();
    if wants.events {
        options.trace_ring_buffer_bytes = wants.ring_buffer_bytes;
        options.trace_max_threads = config.limits.max_threads;
    }
    let mut block_off = None;
    let block_plan = if wants.block_ring_buffer_bytes > 0 {
        match block::plan(config) {
            Ok(plan) => {
                options.block_io = Some(plan.probe);
                options.block_trace = true;
                options.block_trace_ring_buffer_bytes = wants.block_ring_buffer_bytes;
                Some(plan)
            }
            Err(why) => {
                block_off = Some(why);
                None
            }
        }
    } else {
        None
    };
    let mut probes = Probes::load(&tool_config(config), &options)?;
    let drop_counters = DropCounters::take(&mut probes)?;
    set_target_filter(&mut probes, session)?;
    let mut reader = if wants.profile {
        Some(ProfileReader::attach(&mut probes, tool)?)
    } else {
        None
    };
    let mut stream = if wants.events {
        Some(TraceEvents::attach(&mut probes, tool)?)
    } else {
        None
    };
    // Optional: without it the syscalls are still traced.
    let mut blocks = match &block_plan {
        Some(plan) => match BlockStream::attach(&mut probes, config, plan) {
            Ok(b) => Some(b),
            Err(e) => {
                block_off = Some(Chain(&e).to_string());
                None
            }
        },
        None => None,
    };
    if let Some(why) = &block_off {
        eprintln!("sysscope {tool}: no block I/O tracks: {why}");
    }
    let cpu_before = read_cpu_stat(session);
    session.start()?;
    if !wants.quiet && session.child_pid().is_none() {
        let until = if session.pid().is_some() {
            "until it exits"
        } else {
            "until the cgroup is removed"
        };
        let limit = match session.duration() {
            Some(d) => format!("for {}", crate::util::duration::format(&d)),
            None => until.to_string(),
        };
        eprintln!(
            "sysscope {tool}: measuring {} {limit}; Ctrl-C to stop",
            session.describe()
        );
    }
    sink.start(session.started_ns());
    let mut progress = Progress::new(tool, wants.quiet);
    let mut profile = Profile::default();
    let mut calls = 0u64;
    let mut last_read = Instant::now();
    let stop = loop {
        match stream.as_mut() {
            Some(s) => {
                s.wait(TICK, blocks.as_ref().map(BlockStream::fd));
                s.drain(|e| sink.event(e));
            }
            None => std::thread::sleep(TICK),
        }
        if let Some(b) = blocks.as_mut() {
            b.drain(sink);
            sink.block_totals(b.totals());
        }
        sink.tick(super::monotonic_ns());
        if let Some(stop) = session.poll() {
            break stop;
        }
        if let Some(r) = reader.as_mut() {
            if last_read.elapsed() >= MAP_READ_EVERY {
                let filter = &session.filter;
                calls += r.poll_into(&mut profile, |cg, tgid| filter.matches(cg, tgid));
                last_read = Instant::now();
            }
        }
        let received = stream.as_ref().map(|s| s.received).unwrap_or(0);
        progress.tick(|| {
            if wants.profile {
                format!("{} syscalls", thousands(calls))
            } else {
                format!("{} events", thousands(received))
            }
        });
    };
    let wall = session.elapsed();
    // Final reads: everything the target did until now.
    if let Some(r) = reader.as_mut() {
        session.filter.refresh();
        let filter = &session.filter;
        r.poll_into(&mut profile, |cg, tgid| filter.matches(cg, tgid));
    }
    if let Some(s) = stream.as_mut() {
        s.drain(|e| sink.event(e));
    }
    // Direct I/O completes before the call that issued it returns: by now every request of
    // an exited command is in the maps.
    if let Some(b) = blocks.as_mut() {
        b.drain(sink);
        sink.block_totals(b.totals());
    }
    progress.done();
    let cpu = match (cpu_before, read_cpu_stat(session)) {
        (Some(a), Some(b)) => Some(CpuUsage {
            user: b.user.saturating_sub(a.user),
            system: b.system.saturating_sub(a.system),
        }),
        _ => None,
    };
    let drops = drop_counters.read();
    if drops.map_full > 0 || drops.threads_full > 0 {
        eprintln!(
            "sysscope {tool}: warning: {} syscalls on this node could not be counted (kernel \
             maps full: raise [limits] in the config file); the counts may be low",
            thousands(drops.map_full + drops.threads_full)
        );
    }
    let events = stream.map(|s| s.received).unwrap_or(0);
    // Detach every probe before the results are written.
    drop(probes);
    Ok(Measurement {
        profile,
        wall,
        stop,
        drops,
        cpu,
        events,
        block_off,
    })
}

/// Checks privileges first, so a missing capability is reported before anything is created.
pub(crate) fn preflight() -> Result<(), CliError> {
    kernel::preflight().map_err(CliError::from)
}
