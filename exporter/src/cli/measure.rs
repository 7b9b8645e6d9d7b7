//! The measuring loop shared by `summary`, `trace` and `diagnose`: load the probes for the
//! target, point their filter at it, start it, read the syscall maps and/or the trace stream
//! (`crate::kernel::trace`; and, for `trace`, the target's block I/O, see [`super::block`])
//! until the session ends, and report what the probes dropped.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

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
    kernel::{
        self, block_io::BlockIoPlan, syscalls::OffCpuEvents, trace::TraceEvents, LoadOptions,
        Probes,
    },
    metadata::{
        cgroups,
        cpu_bandwidth::{BandwidthReader, CpuBandwidth},
    },
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
    /// CPU quota throttling of the target's cgroup during the run, when it has a quota.
    pub(crate) throttling: Option<CpuBandwidth>,
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
    // A trace shows each call's stretches off CPU: the syscall programs (counting only the
    // target) keep the calls in flight, and the scheduler programs stream the stretches.
    let off_cpu = wants.events && config.syscalls.time_by_state;
    let (block_plan, mut block_off) = plan_load(config, &wants, off_cpu, &mut options);
    let mut probes = Probes::load(&tool_config(config), &options)?;
    let drop_counters = DropCounters::take(&mut probes)?;
    set_target_filter(&mut probes, session)?;
    let mut readers = Readers::attach(&mut probes, config, tool, &wants, off_cpu, block_plan)?;
    if let Some(why) = readers.block_off.take() {
        block_off = Some(why);
    }
    if let Some(why) = &block_off {
        eprintln!("sysscope {tool}: no block I/O tracks: {why}");
    }
    let usage_before = CgroupUsage::read(session);
    session.start()?;
    announce(session, tool, &wants);
    sink.start(session.started_ns());
    let mut progress = Progress::new(tool, wants.quiet);
    let mut profile = Profile {
        by_state: readers.profile.is_some() && probes.time_by_state(),
        ..Profile::default()
    };
    let mut calls = 0u64;
    let mut last_read = Instant::now();
    let stop = loop {
        readers.wait_and_drain(sink);
        sink.tick(super::monotonic_ns());
        if let Some(stop) = session.poll() {
            break stop;
        }
        if let Some(r) = readers.profile.as_mut() {
            if last_read.elapsed() >= MAP_READ_EVERY {
                let filter = &session.filter;
                calls += r.poll_into(&mut profile, |cg, tgid| filter.matches(cg, tgid));
                last_read = Instant::now();
            }
        }
        let received = readers.events.as_ref().map(|s| s.received).unwrap_or(0);
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
    if let Some(r) = readers.profile.as_mut() {
        session.filter.refresh();
        let filter = &session.filter;
        r.poll_into(&mut profile, |cg, tgid| filter.matches(cg, tgid));
    }
    // Direct I/O completes before the call that issued it returns: by now every request of
    // an exited command is in the maps.
    readers.drain(sink);
    progress.done();
    let (cpu, throttling) = usage_before.since(session);
    let drops = drop_counters.read();
    if drops.map_full > 0 || drops.threads_full > 0 {
        eprintln!(
            "sysscope {tool}: warning: {} syscalls on this node could not be counted (kernel \
             maps full: raise [limits] in the config file); the counts may be low",
            thousands(drops.map_full + drops.threads_full)
        );
    }
    let events = readers.events.map(|s| s.received).unwrap_or(0);
    // Detach every probe before the results are written.
    drop(probes);
    Ok(Measurement {
        profile,
        wall,
        stop,
        drops,
        cpu,
        throttling,
        events,
        block_off,
    })
}

/// Sizes the ring buffers `wants` needs in `options`, and plans the block I/O programs: the
/// plan, or why there are no block I/O tracks.
fn plan_load(
    config: &Config,
    wants: &Wants,
    off_cpu: bool,
    options: &mut LoadOptions,
) -> (Option<BlockIoPlan>, Option<String>) {
    if wants.events {
        options.trace_ring_buffer_bytes = wants.ring_buffer_bytes;
        options.trace_max_threads = config.limits.max_threads;
        if off_cpu {
            options.state_trace_ring_buffer_bytes = (wants.ring_buffer_bytes / 4).max(page_size());
        }
    }
    if wants.block_ring_buffer_bytes == 0 {
        return (None, None);
    }
    match block::plan(config) {
        Ok(plan) => {
            options.block_io = Some(plan.probe);
            options.block_trace = true;
            options.block_trace_ring_buffer_bytes = wants.block_ring_buffer_bytes;
            (Some(plan), None)
        }
        Err(why) => (None, Some(why)),
    }
}

/// What a measurement reads from the probes while the target runs.
struct Readers {
    /// The syscall counters (a profile), also for the off-CPU stretches of a trace (read,
    /// and their exited processes reclaimed).
    profile: Option<ProfileReader>,
    off_cpu: Option<OffCpuEvents>,
    events: Option<TraceEvents>,
    blocks: Option<BlockStream>,
    /// Why the block I/O stream could not attach (it is optional: the syscalls are still
    /// traced without it).
    block_off: Option<String>,
}

impl Readers {
    fn attach(
        probes: &mut Probes,
        config: &Config,
        tool: &'static str,
        wants: &Wants,
        off_cpu: bool,
        block_plan: Option<BlockIoPlan>,
    ) -> Result<Self, CliError> {
        let profile = if wants.profile || off_cpu {
            Some(ProfileReader::attach(probes, tool)?)
        } else {
            None
        };
        let off_cpu = if off_cpu {
            Some(OffCpuEvents::take(probes)?)
        } else {
            None
        };
        let events = if wants.events {
            Some(TraceEvents::attach(probes, tool)?)
        } else {
            None
        };
        let (mut blocks, mut block_off) = (None, None);
        if let Some(plan) = &block_plan {
            match BlockStream::attach(probes, config, plan) {
                Ok(b) => blocks = Some(b),
                Err(e) => block_off = Some(Chain(&e).to_string()),
            }
        }
        Ok(Self {
            profile,
            off_cpu,
            events,
            blocks,
            block_off,
        })
    }

    /// Waits a tick for trace records (or sleeps it), then hands what came to `sink`.
    fn wait_and_drain(&mut self, sink: &mut dyn EventSink) {
        match self.events.as_mut() {
            Some(s) => s.wait(TICK, self.blocks.as_ref().map(BlockStream::fd)),
            None => std::thread::sleep(TICK),
        }
        self.drain(sink);
    }

    /// Hands every record read so far to `sink`: calls, off-CPU stretches, block requests and
    /// their totals.
    fn drain(&mut self, sink: &mut dyn EventSink) {
        if let Some(s) = self.events.as_mut() {
            s.drain(|e| sink.event(e));
        }
        if let Some(o) = self.off_cpu.as_mut() {
            o.drain(|e| sink.off_cpu(e));
        }
        if let Some(b) = self.blocks.as_mut() {
            b.drain(sink);
            sink.block_totals(b.totals());
        }
    }
}

/// Tells the user what is measured and until when (not for a command it runs itself).
fn announce(session: &Session, tool: &'static str, wants: &Wants) {
    if wants.quiet || session.child_pid().is_some() {
        return;
    }
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

/// The target cgroup's CPU time and throttling at the start, to tell what the measurement
/// added.
struct CgroupUsage {
    cpu: Option<CpuUsage>,
    bandwidth: Option<(BandwidthReader, PathBuf)>,
    throttling: Option<CpuBandwidth>,
}

impl CgroupUsage {
    fn read(session: &Session) -> Self {
        let bandwidth = session.cgroup_dir().and_then(|dir| {
            Some((
                BandwidthReader::new(cgroups::v2_mount().ok()?),
                dir.to_path_buf(),
            ))
        });
        let throttling = bandwidth.as_ref().and_then(|(r, dir)| r.read_dir(dir));
        Self {
            cpu: read_cpu_stat(session),
            bandwidth,
            throttling,
        }
    }

    /// The CPU time and throttling since [`CgroupUsage::read`], where both reads succeeded.
    fn since(self, session: &Session) -> (Option<CpuUsage>, Option<CpuBandwidth>) {
        let cpu = match (self.cpu, read_cpu_stat(session)) {
            (Some(a), Some(b)) => Some(CpuUsage {
                user: b.user.saturating_sub(a.user),
                system: b.system.saturating_sub(a.system),
            }),
            _ => None,
        };
        let after = self.bandwidth.as_ref().and_then(|(r, dir)| r.read_dir(dir));
        let throttling = match (self.throttling, after) {
            (Some(before), Some(after)) => Some(after.since(&before)),
            _ => None,
        };
        (cpu, throttling)
    }
}

/// The page size (ring buffers are multiples of it), at least 4 KiB.
pub(crate) fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u32
}

/// Checks privileges first, so a missing capability is reported before anything is created.
pub(crate) fn preflight() -> Result<(), CliError> {
    kernel::preflight().map_err(CliError::from)
}
