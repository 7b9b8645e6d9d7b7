//! The kernel-access layer: the only code that loads programs and touches maps. Its modules
//! mirror the probe families of `ebpf/probes/src` (`syscalls`, `fd_class`, ...) beside what
//! they share (the loader here, batched and cumulative map reads, BTF, run-time statistics);
//! collectors and the command-line tools read through them.
//!
//! Loading the eBPF object and attaching its programs.
//!
//! One object (`ebpf/probes`) holds every program and map. It is loaded once, with map sizes
//! and globals taken from the config; each collector then attaches the programs it needs and
//! takes the maps it reads, so one collector failing to attach leaves the others running.
//! Attached programs stay attached for as long as [`Probes`] lives and are detached when it is
//! dropped. Also owns the kernel's BPF run-time statistics (`BPF_ENABLE_STATS`, kept on as
//! `collection.probe_stats` says, see [`probe_stats`]) and reports the kernel memory of the maps
//! sysscope holds.

pub mod block_io;
pub mod bpf_batch;
pub mod btf;
pub(crate) mod counters;
pub(crate) mod cumulative;
pub mod fd_class;
pub mod features;
#[cfg(test)]
mod object_contract;
pub mod probe_stats;
mod ring;
pub(crate) mod sched;
pub mod slow_events;
pub mod syscalls;
pub(crate) mod trace;

use std::{cell::OnceCell, time::Duration};

use aya::{
    maps::Map,
    programs::{BtfTracePoint, Program, ProgramError, RawTracePoint},
    Ebpf, EbpfLoader,
};
use sysscope_abi::{
    globals, maps, BlockProbeConfig, FdProbeConfig, FileProbeConfig, SchedProbeConfig,
    MAX_STAT_STRIPES,
};

use self::{
    btf::Btf,
    probe_stats::{RunTimeStats, RunTotals},
};
use crate::{config::Config, util::error::Chain};

/// The compiled probes, embedded at build time.
pub(crate) static PROBES_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sysscope-probes"));

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "missing capability {capability}: {why} (run as root, or grant it, e.g. \
         `setcap cap_bpf,cap_perfmon+ep sysscope`)"
    )]
    MissingCapability {
        capability: &'static str,
        why: &'static str,
    },
    #[error(
        "the kernel's BTF is not visible (/sys/kernel/btf/vmlinux is missing): sysscope needs a \
         kernel built with CONFIG_DEBUG_INFO_BTF=y (every supported kernel, 5.15 or later, can \
         be); in a container, mount the host's /sys/kernel/btf, or give a copy of the file with \
         --btf.path"
    )]
    NoBtf,
    #[error("cannot read the possible CPUs from {path}")]
    CpuCount {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the kernel BTF file given with --btf.path cannot be used by the loader")]
    KernelBtf(#[source] aya::BtfError),
    #[error("cannot read the kernel's BTF from {path} for the BTF tracepoint programs")]
    ReadBtf {
        path: String,
        #[source]
        source: aya::BtfError,
    },
    #[error(
        "this kernel ({kernel}) lacks {} (Linux {}+), which `{needed_by}` needs",
        feature.name,
        feature.since
    )]
    MissingKernelFeature {
        kernel: String,
        feature: features::KernelFeature,
        needed_by: String,
        /// What the kernel said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the embedded eBPF object is empty: this binary was built with AYA_BUILD_SKIP")]
    NotBuilt,
    #[error("loading the eBPF object failed")]
    Load(#[source] aya::EbpfError),
    #[error("program `{program}` is not in the eBPF object")]
    NoSuchProgram { program: String },
    #[error("map `{map}` is not in the eBPF object (or was already taken)")]
    NoSuchMap { map: String },
    #[error("program `{program}`: {action} failed")]
    Program {
        program: String,
        action: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map `{map}`")]
    Map {
        map: String,
        #[source]
        source: aya::maps::MapError,
    },
    /// A map the command-line tools take or fill could not be opened as the type they use.
    #[error("reading map {map}")]
    Read {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    /// The syscall statistics table refused its maps (its own error, from the kernel layer's
    /// syscall family; boxed so the loader does not depend on that family).
    #[error("the syscall statistics table")]
    StatsTable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The error for a map that is in the object but cannot be opened or filled as the tools use
/// it (see [`ProbeError::Read`]).
pub(crate) fn read_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> ProbeError {
    move |source| ProbeError::Read { map, source }
}

/// Fault injection for tests and drills: programs named in this environment variable
/// (comma-separated) are attached to a tracepoint that does not exist, so the kernel's real
/// failure path runs (docs/operations.md, "A probe fails to attach").
pub const FAULT_ENV: &str = "SYSSCOPE_FAULT_ATTACH";

fn fault_injected(program: &str) -> bool {
    std::env::var(FAULT_ENV)
        .map(|v| v.split(',').any(|p| p.trim() == program))
        .unwrap_or(false)
}

/// The error for `program` when its verifier `log` shows a kernel feature it lacks.
fn missing_feature(program: &str, log: &str) -> Option<ProbeError> {
    let feature = features::of_verifier_log(log)?;
    Some(ProbeError::MissingKernelFeature {
        kernel: features::running_kernel(),
        feature,
        needed_by: program.to_string(),
        // The verifier's last words say what it refused.
        source: {
            let lines: Vec<&str> = log.lines().collect();
            lines[lines.len().saturating_sub(3)..].join(" | ").into()
        },
    })
}

/// Capabilities sysscope checks for, from `/proc/self/status` (CapEff).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn effective_capabilities() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Checks what loading tracing programs needs, naming what is missing.
pub(crate) fn preflight() -> Result<(), ProbeError> {
    let caps = effective_capabilities();
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        return Err(ProbeError::MissingCapability {
            capability: "CAP_BPF",
            why: "needed to create maps and load programs",
        });
    }
    if !has(CAP_PERFMON) && !has(CAP_SYS_ADMIN) {
        return Err(ProbeError::MissingCapability {
            capability: "CAP_PERFMON",
            why: "needed to attach tracing programs to tracepoints",
        });
    }
    if !btf::kernel_btf_file().exists() {
        return Err(ProbeError::NoBtf);
    }
    Ok(())
}

/// What the loader needs to know beyond the config.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// cgroup id the on-demand trace programs follow (0: none).
    pub trace_cgroup_id: u64,
    /// Whether the trace programs also follow the tgids user space puts in `TRACE_TARGETS`.
    pub trace_filter_tgids: bool,
    /// Size of the trace ring buffer in bytes (0: the object's one page; a power of two).
    pub trace_ring_buffer_bytes: u32,
    /// Traced calls in flight at once (0: the object's default).
    pub trace_max_threads: u32,
    /// The syscall programs count only the target of the trace filter (command-line tools).
    pub syscalls_target_only: bool,
    /// Kernel offsets for the block probes, resolved from BTF (`None`: block probes stay idle).
    pub block_io: Option<BlockProbeConfig>,
    /// The block probes record only the trace target's requests and stream them to
    /// `TRACE_BLOCK_EVENTS` (global `BLOCK_TRACE`).
    pub block_trace: bool,
    /// Size of `TRACE_BLOCK_EVENTS` in bytes (0: the object's one page; a power of two).
    pub block_trace_ring_buffer_bytes: u32,
    /// The scheduler programs stream every off-CPU stretch of a counted call to
    /// `OFFCPU_EVENTS` (global `SYSCALL_STATE_TRACE`), a ring buffer of this many bytes
    /// (a power of two); 0: no stream.
    pub state_trace_ring_buffer_bytes: u32,
}

/// One program as attached (or not) by a collector.
#[derive(Debug, Clone)]
pub struct ProgramStatus {
    pub program: String,
    pub collector: &'static str,
    pub attached: bool,
}

/// Run time and run count of one program since it was loaded (kernel BPF stats).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProgramStats {
    pub(crate) program: String,
    pub(crate) run_time: Duration,
    pub(crate) run_count: u64,
}

/// Copies of each `SYSCALL_STATS` slot on a node with `cpus` possible CPUs: one per CPU up to
/// [`MAX_STAT_STRIPES`] (a power of two), so small machines pay nothing for it and big ones
/// keep the map's size fixed while CPUs counting the same key at once mostly write different
/// copies.
pub(crate) fn stat_stripes(cpus: u32) -> u32 {
    cpus.max(1).next_power_of_two().min(MAX_STAT_STRIPES)
}

/// Hands every slot of `SYSCALL_STATS` to the free-slot stack, lowest on top, so the slots ever
/// used are the lowest ones (freed slots are handed out again first). (An object without the
/// stack, such as an older build compared by the benchmark, is left alone.)
fn fill_free_slots(ebpf: &mut Ebpf, capacity: u32) -> Result<(), ProbeError> {
    let Some(map) = ebpf.map_mut(maps::FREE_SLOTS) else {
        return Ok(());
    };
    let map_err = |source| ProbeError::Map {
        map: maps::FREE_SLOTS.to_string(),
        source,
    };
    let mut stack = aya::maps::Stack::<_, u32>::try_from(map).map_err(map_err)?;
    for slot in (0..capacity).rev() {
        stack.push(slot, 0).map_err(map_err)?;
    }
    Ok(())
}

/// The offsets `resolve` finds in the kernel's BTF, parsed at most once per load (`btf`), or
/// why there are none, as a log line.
fn btf_offsets<T>(
    btf: &OnceCell<Result<Btf, btf::BtfError>>,
    resolve: impl FnOnce(&Btf) -> Result<T, btf::BtfError>,
) -> Result<T, String> {
    match btf.get_or_init(Btf::from_kernel) {
        Ok(btf) => resolve(btf).map_err(|e| Chain(&e).to_string()),
        Err(e) => Err(Chain(e).to_string()),
    }
}

/// The offsets the probes read kernel structures at, from the kernel's BTF (parsed once, when
/// a family needs it): the descriptor classes of reads and writes, the file of a slow call, a
/// switched-out task's state and a 32-bit call's mark. A family whose offsets cannot be had
/// works without them, and says so.
fn btf_configs(config: &Config) -> (FdProbeConfig, FileProbeConfig, SchedProbeConfig) {
    let slow = &config.slow_calls;
    // The kernel's BTF is parsed once, when a family needs offsets from it.
    let kernel_btf = OnceCell::new();
    // Reads and writes are split by what their descriptor is, with offsets from the
    // kernel's BTF; without them every call is counted unsplit.
    let fd_config = if config.syscalls.descriptor_kinds {
        btf_offsets(&kernel_btf, fd_class::resolve_offsets).unwrap_or_else(|error| {
            tracing::warn!(%error, "reads and writes are not split by descriptor kind");
            FdProbeConfig::UNSET
        })
    } else {
        FdProbeConfig::UNSET
    };
    // Slow calls name their descriptor's file from the kernel, read at the call's exit;
    // without the offsets, spans fall back to /proc for the path.
    let file_config = if slow.enabled {
        btf_offsets(&kernel_btf, |btf| {
            fd_class::resolve_file_offsets(btf, slow.resolve_file_paths)
        })
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "slow-call spans name files from /proc only");
            FileProbeConfig::UNSET
        })
    } else {
        FileProbeConfig::UNSET
    };
    // Where the scheduler programs read a switched-out task's state (the split only), and
    // what this kernel's task storage allows them.
    let task_state = if config.syscalls.time_by_state {
        btf_offsets(&kernel_btf, sched::resolve_task_state)
            .map_err(|error| {
                tracing::warn!(%error, "time off CPU of calls that block is counted as unknown");
            })
            .ok()
    } else {
        None
    };
    let mut sched_config = sched::sched_config(task_state, &features::running_kernel());
    // Where a 32-bit call is told apart on x86_64 (arm64 reads the registers).
    if cfg!(target_arch = "x86_64") {
        match btf_offsets(&kernel_btf, sched::resolve_compat_status) {
            Ok(offset) => sched_config.compat_status = offset,
            Err(error) => {
                tracing::warn!(%error, "32-bit calls are counted as 64-bit ones")
            }
        }
    }
    (fd_config, file_config, sched_config)
}

/// A failed load, a map type this kernel lacks named with the kernel that brought it.
fn object_load_error(e: aya::EbpfError) -> ProbeError {
    if let aya::EbpfError::MapError(aya::maps::MapError::CreateError { name, .. }) = &e {
        if let Some(feature) = features::of_map(name) {
            return ProbeError::MissingKernelFeature {
                kernel: features::running_kernel(),
                feature,
                needed_by: name.clone(),
                source: Box::new(e),
            };
        }
    }
    ProbeError::Load(e)
}

/// The loaded object and what was attached from it.
pub struct Probes {
    ebpf: Ebpf,
    programs: Vec<ProgramStatus>,
    /// Whether the syscall programs split calls' time by state (`syscalls.time_by_state`).
    time_by_state: bool,
    /// Keeps the kernel's run-time accounting on (or samples it) for as long as sysscope runs.
    stats: RunTimeStats,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("programs", &self.programs)
            .finish_non_exhaustive()
    }
}

impl Probes {
    /// Loads the object (creates the maps), sized from `config`. Attaches nothing.
    pub fn load(config: &Config, options: &LoadOptions) -> Result<Self, ProbeError> {
        Self::load_object(PROBES_OBJECT, config, options)
    }

    /// Like [`Probes::load`], from another build of the probes object (the benchmark compares
    /// probe variants this way).
    pub fn load_object(
        object: &[u8],
        config: &Config,
        options: &LoadOptions,
    ) -> Result<Self, ProbeError> {
        if object.is_empty() {
            return Err(ProbeError::NotBuilt);
        }
        // The possible CPUs size the statistics' stripes and split the slow-call budget; a guess
        // would be wrong in either direction, so an unreadable count stops the load.
        let cpus = aya::util::nr_cpus()
            .map(|n| n.max(1) as u32)
            .map_err(|(path, source)| ProbeError::CpuCount {
                path: path.to_string(),
                source,
            })?;
        let slow = &config.slow_calls;
        let per_cpu_rate: u32 = if slow.enabled && slow.max_events_per_second > 0 {
            slow.max_events_per_second.div_ceil(cpus).max(1)
        } else {
            0
        };
        let limits = &config.limits;
        let stripes = stat_stripes(cpus);
        let cgroup_quota = limits.max_syscall_entries_per_cgroup;
        let own_slots = sysscope_abi::own_share(limits.max_syscall_entries);
        let error_quota = limits.max_error_entries_per_cgroup;
        let own_errors = sysscope_abi::own_share(limits.max_error_entries);
        let block_bounds = block_io::bounds(config);
        // A kernel BTF file given with --btf.path serves the loader's relocations too.
        let given_btf = btf::given_kernel_btf_file()
            .map(|path| aya::Btf::parse_file(path, aya::Endianness::default()))
            .transpose()
            .map_err(ProbeError::KernelBtf)?;
        let mut loader = EbpfLoader::new();
        if let Some(given) = &given_btf {
            loader.btf(Some(given));
        }
        loader
            // Task-local storage (per-thread syscall state) has no user-space wrapper in aya;
            // user space never reads it.
            .allow_unsupported_maps()
            .override_global(globals::SYSCALL_STAT_STRIPES, &stripes, false)
            .override_global(globals::SYSCALL_CGROUP_QUOTA, &cgroup_quota, false)
            .override_global(globals::SYSCALL_OWN_SLOTS, &own_slots, false)
            .override_global(globals::SYSCALL_ERROR_QUOTA, &error_quota, false)
            .override_global(globals::SYSCALL_OWN_ERRORS, &own_errors, false)
            .map_max_entries(maps::SLOW_EVENTS, slow.ring_buffer_bytes)
            .override_global(globals::SLOW_EVENTS_PER_CPU_PER_SEC, &per_cpu_rate, true);
        if options.trace_cgroup_id != 0 {
            loader.override_global(globals::TRACE_CGROUP_ID, &options.trace_cgroup_id, false);
        }
        if options.trace_filter_tgids {
            loader.override_global(globals::TRACE_FILTER_TGIDS, &1u32, false);
        }
        if options.syscalls_target_only {
            loader.override_global(globals::SYSCALL_TARGET_ONLY, &1u32, false);
        }
        if config.syscalls.time_by_state {
            loader.override_global(globals::SYSCALL_TIME_BY_STATE, &1u32, false);
            if options.state_trace_ring_buffer_bytes != 0 {
                loader.override_global(globals::SYSCALL_STATE_TRACE, &1u32, false);
                loader.map_max_entries(maps::OFFCPU_EVENTS, options.state_trace_ring_buffer_bytes);
            }
        }
        if options.trace_ring_buffer_bytes != 0 {
            loader.map_max_entries(maps::TRACE_EVENTS, options.trace_ring_buffer_bytes);
        }
        if options.trace_max_threads != 0 {
            loader.map_max_entries(maps::TRACE_THREADS, options.trace_max_threads);
        }
        // Each family sizes its own maps.
        for (map, entries) in syscalls::map_sizes(config, stripes)
            .into_iter()
            .chain(block_io::map_sizes(config))
        {
            loader.map_max_entries(map, entries);
        }
        for (global, bound) in &block_bounds {
            loader.override_global(global, bound, false);
        }
        if let Some(block_config) = &options.block_io {
            loader.override_global(globals::BLOCK_CONFIG, block_config, true);
        }
        if options.block_trace {
            loader.override_global(globals::BLOCK_TRACE, &1u32, false);
        }
        if options.block_trace_ring_buffer_bytes != 0 {
            loader.map_max_entries(
                maps::TRACE_BLOCK_EVENTS,
                options.block_trace_ring_buffer_bytes,
            );
        }
        let (fd_config, file_config, sched_config) = btf_configs(config);
        loader.override_global(globals::FD_CONFIG, &fd_config, false);
        loader.override_global(globals::SCHED_CONFIG, &sched_config, false);
        let slow_call_fds = fd_class::slow_call_fds();
        loader
            .override_global(globals::FILE_CONFIG, &file_config, false)
            .override_global(globals::SLOW_CALL_FDS, &slow_call_fds, false);
        let mut ebpf = loader.load(object).map_err(object_load_error)?;
        fill_free_slots(&mut ebpf, limits.max_syscall_entries)?;
        let stats = RunTimeStats::start(config.collection.probe_stats);
        Ok(Self {
            ebpf,
            programs: Vec::new(),
            time_by_state: config.syscalls.time_by_state,
            stats,
        })
    }

    /// Loads (verifies) `program` and attaches it to tracepoint `tracepoint`, as a raw
    /// tracepoint or, for a program built as one, a BTF tracepoint (the kernel's BTF is read
    /// for it, then dropped). The outcome is recorded for `sysscope_probe_attached` either way.
    pub fn attach_raw_tracepoint(
        &mut self,
        collector: &'static str,
        program: &str,
        tracepoint: &str,
    ) -> Result<(), ProbeError> {
        let result = self.try_attach_raw_tracepoint(program, tracepoint);
        self.programs.push(ProgramStatus {
            program: program.to_string(),
            collector,
            attached: result.is_ok(),
        });
        result
    }

    fn try_attach_raw_tracepoint(
        &mut self,
        program: &str,
        tracepoint: &str,
    ) -> Result<(), ProbeError> {
        let tracepoint = if fault_injected(program) {
            tracing::warn!(program, "{FAULT_ENV}: attaching to a missing tracepoint");
            "sysscope_fault_injected_missing_tracepoint"
        } else {
            tracepoint
        };
        let prog = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| ProbeError::NoSuchProgram {
                program: program.to_string(),
            })?;
        if let Program::BtfTracePoint(prog) = prog {
            return attach_btf_tracepoint(prog, program, tracepoint);
        }
        let prog: &mut RawTracePoint = prog.try_into().map_err(|source| ProbeError::Program {
            program: program.to_string(),
            action: "type check",
            source,
        })?;
        if let Some(e) = injected_load_failure(program) {
            return Err(e);
        }
        prog.load().map_err(|source| load_error(program, source))?;
        prog.attach(tracepoint)
            .map_err(|source| ProbeError::Program {
                program: program.to_string(),
                action: "attach",
                source,
            })?;
        tracing::debug!(program, tracepoint, "attached");
        Ok(())
    }

    /// Detaches and unloads every program `collector` attached: a collector that failed half
    /// way must not leave programs running (and filling maps) that nothing reads.
    pub(crate) fn detach_collector(&mut self, collector: &'static str) {
        for status in self
            .programs
            .iter_mut()
            .filter(|p| p.collector == collector)
        {
            if !status.attached {
                continue;
            }
            let unloaded = match self.ebpf.program_mut(&status.program) {
                Some(Program::RawTracePoint(p)) => Some(p.unload()),
                Some(Program::BtfTracePoint(p)) => Some(p.unload()),
                _ => None,
            };
            match unloaded {
                Some(Ok(())) => {
                    status.attached = false;
                    tracing::info!(program = %status.program, collector, "detached");
                }
                Some(Err(e)) => {
                    tracing::warn!(program = %status.program, error = %Chain(&e), "detaching failed")
                }
                None => {}
            }
        }
    }

    /// Takes ownership of a map for a collector to read.
    pub fn take_map(&mut self, name: &str) -> Result<Map, ProbeError> {
        self.ebpf
            .take_map(name)
            .ok_or_else(|| ProbeError::NoSuchMap {
                map: name.to_string(),
            })
    }

    /// Mutable access to a map that stays in the object (e.g. configuration arrays).
    pub(crate) fn map_mut(&mut self, name: &str) -> Result<&mut Map, ProbeError> {
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| ProbeError::NoSuchMap {
                map: name.to_string(),
            })
    }

    /// Whether the syscall programs were loaded to split calls' time by state.
    pub fn time_by_state(&self) -> bool {
        self.time_by_state
    }

    /// What was attached, and what failed to.
    pub fn programs(&self) -> &[ProgramStatus] {
        &self.programs
    }

    /// Kernel run-time statistics of every attached program (none when they are off).
    pub(crate) fn program_stats(&self) -> Vec<ProgramStats> {
        self.programs
            .iter()
            .filter(|p| p.attached)
            .filter_map(|p| {
                let info = self.ebpf.program(&p.program)?.info().ok()?;
                let kernel = RunTotals {
                    run_time: info.run_time(),
                    runs: info.run_count(),
                };
                let totals = self.stats.totals(info.id(), kernel)?;
                Some(ProgramStats {
                    program: p.program.clone(),
                    run_time: totals.run_time,
                    run_count: totals.runs,
                })
            })
            .collect()
    }

    /// Fraction of the time run-time statistics were on (1: exact, 0: off).
    pub(crate) fn stats_coverage(&self) -> f64 {
        self.stats.coverage()
    }
}

/// Loads `prog` (named `program`) for BTF tracepoint `tracepoint` and attaches it. The
/// kernel's BTF (or the file `--btf.path` names) is parsed for the load and dropped after:
/// it is tens of MiB once parsed, and only start-up needs it.
fn attach_btf_tracepoint(
    prog: &mut BtfTracePoint,
    program: &str,
    tracepoint: &str,
) -> Result<(), ProbeError> {
    let err = |action: &'static str| {
        move |source| ProbeError::Program {
            program: program.to_string(),
            action,
            source,
        }
    };
    let path = btf::kernel_btf_file();
    let btf = aya::Btf::parse_file(path, aya::Endianness::default()).map_err(|source| {
        ProbeError::ReadBtf {
            path: path.display().to_string(),
            source,
        }
    })?;
    if let Some(e) = injected_load_failure(program) {
        return Err(e);
    }
    prog.load(tracepoint, &btf)
        .map_err(|source| load_error(program, source))?;
    drop(btf);
    prog.attach().map_err(err("attach"))?;
    tracing::debug!(program, tracepoint, "attached (BTF tracepoint)");
    Ok(())
}

/// The failure the fault injection ([`features::FAULT_ENV`]) stands for when it has `program`
/// load as on an older kernel (with a warning, so that a test run shows it).
fn injected_load_failure(program: &str) -> Option<ProbeError> {
    let log = features::injected_verifier_log(program)?;
    tracing::warn!(
        program,
        "{}: loading as on an older kernel",
        features::FAULT_ENV
    );
    Some(missing_feature(program, &log).expect("the injected log names a feature"))
}

/// A failed load of `program`: a helper this kernel lacks is named with the kernel that
/// brought it; anything else is the verifier's refusal.
fn load_error(program: &str, source: ProgramError) -> ProbeError {
    if let ProgramError::LoadError { verifier_log, .. } = &source {
        if let Some(e) = missing_feature(program, &verifier_log.to_string()) {
            return e;
        }
    }
    ProbeError::Program {
        program: program.to_string(),
        action: "load (verifier)",
        source,
    }
}

/// Names of the maps this process holds, by map id (see [`map_memory`]).
static MAP_NAMES: std::sync::Mutex<std::collections::BTreeMap<u64, String>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Kernel memory of every eBPF map this process holds, by map name (the kernel's own account,
/// `memlock` in the map's fdinfo), summed over maps of the same name.
pub(crate) fn map_memory() -> Vec<(String, u64)> {
    let mut by_name: std::collections::BTreeMap<String, u64> = Default::default();
    let mut seen = std::collections::HashSet::new();
    for info in crate::util::fdinfo::own() {
        let field = |name: &str| info.field(name);
        let (Some(id), Some(bytes)) = (field("map_id:"), field("memlock:")) else {
            continue;
        };
        // A map may be open through several descriptors: count it once.
        if !seen.insert(id) {
            continue;
        }
        // Looking a map up by id needs CAP_SYS_ADMIN, which is dropped after start-up: names
        // are learnt on the first call (made while loading) and remembered.
        let name = {
            let mut names = MAP_NAMES.lock().expect("map names lock");
            names
                .entry(id)
                .or_insert_with(|| {
                    aya::maps::MapInfo::from_id(id as u32)
                        .ok()
                        .and_then(|i| i.name_as_str().map(str::to_owned))
                        .unwrap_or_else(|| format!("id_{id}"))
                })
                .clone()
        };
        *by_name.entry(name).or_default() += bytes;
    }
    by_name.into_iter().collect()
}
