//! Assembling the agent from the config: load the probes, start each collector, and record
//! the ones that could not start. Shared by the exporter and the `--config.check` mode.

use std::sync::{Arc, Mutex};

use crate::{
    agent::Agent,
    collectors::{
        block_io::{self, BlockIoCollector},
        cpu::{self, CpuCollector},
        gpu::{self, GpuCollector, GpuError},
        kubernetes::{self as pod_watch, PodWatchCollector},
        syscalls::{self, SyscallCollector},
        Collector,
    },
    config::Config,
    kernel::{self, slow_events::SlowEvents, LoadOptions, ProbeError, Probes},
    metadata::{
        cgroups,
        kubernetes::{self, PodStore},
        Labeler, SharedLabeler,
    },
    util::error::Chain,
};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Probes(#[from] ProbeError),
    #[error(transparent)]
    Cgroup(#[from] cgroups::CgroupError),
}

/// What started and what did not.
#[derive(Debug, Default)]
pub struct StartReport {
    pub failed: Vec<(&'static str, String)>,
    /// The slow-call ring buffer (`SLOW_EVENTS`) for the span pipeline, taken here because the
    /// agent owns the probes afterwards; `None` when slow calls are off or not sampled.
    pub(crate) slow_events: Option<SlowEvents>,
}

/// Builds the labeler every collector shares.
pub fn labeler(config: &Config) -> Result<SharedLabeler, StartError> {
    labeler_with_pods(config, None)
}

/// Builds the labeler, naming Kubernetes cgroups from `pods` when the pod watch runs.
pub(crate) fn labeler_with_pods(
    config: &Config,
    pods: Option<Arc<PodStore>>,
) -> Result<SharedLabeler, StartError> {
    let root = cgroups::v2_mount()?;
    let mut labeler = Labeler::new(root, config.labels.pid);
    if config.labels.kubernetes_ids || pods.is_some() {
        labeler = labeler.with_metadata(Box::new(kubernetes::KubernetesLabels::new(
            config.labels.kubernetes_ids,
            pods,
        )));
    }
    Ok(Arc::new(Mutex::new(labeler)))
}

/// The collectors as they start, each started or down in the same way.
#[derive(Default)]
struct Lineup {
    started: Vec<Box<dyn Collector>>,
    /// Down from the start; some still export what they know about why.
    down: Vec<(&'static str, Option<Box<dyn Collector>>)>,
    report: StartReport,
}

impl Lineup {
    /// Records one collector's start: running, or down with its reason logged once and
    /// reported, and its programs detached, so a half-attached collector leaves nothing
    /// running. Returns whether it runs.
    fn admit<C: Collector + 'static, E: std::error::Error + 'static>(
        &mut self,
        name: &'static str,
        probes: Option<&mut Probes>,
        result: Result<C, E>,
    ) -> bool {
        match result {
            Ok(c) => {
                self.started.push(Box::new(c));
                true
            }
            Err(e) => {
                tracing::error!(collector = name, error = %Chain(&e), "collector failed to start");
                if let Some(probes) = probes {
                    probes.detach_collector(name);
                }
                self.report.failed.push((name, Chain(&e).to_string()));
                self.down.push((name, None));
                false
            }
        }
    }

    fn running(&self, name: &str) -> bool {
        self.started.iter().any(|c| c.name() == name)
    }
}

/// Loads the probes and starts every enabled collector. Fails only when nothing can run
/// (no privileges, no BTF, no cgroup v2); a collector that cannot start is reported down.
pub fn start(config: &Config) -> Result<(Agent, SharedLabeler, StartReport), StartError> {
    kernel::preflight()?;
    let mut lineup = Lineup::default();

    // The pod watch feeds the labeler, so it starts first; it never waits for the API.
    let mut pods = None;
    if let Some(watch) = PodWatchCollector::start(&config.kubernetes).transpose() {
        if let Ok(c) = &watch {
            pods = Some(c.store());
        }
        lineup.admit(pod_watch::NAME, None, watch);
    }
    let labeler = labeler_with_pods(config, pods)?;
    // The block probes read kernel structs at offsets found in BTF, set before the load.
    let block_plan = config.block_io.enabled.then(|| {
        let root = crate::metadata::cgroup_root(&labeler);
        crate::kernel::block_io::plan(config, &root)
    });
    let options = LoadOptions {
        block_io: block_plan
            .as_ref()
            .and_then(|r| r.as_ref().ok().map(|plan| plan.probe)),
        ..LoadOptions::default()
    };
    let mut probes = Probes::load(config, &options)?;

    if config.syscalls.enabled {
        let started = SyscallCollector::start(&mut probes, config, labeler.clone());
        lineup.admit(syscalls::NAME, Some(&mut probes), started);
    }
    if let Some(plan) = block_plan {
        let started = plan
            .and_then(|plan| BlockIoCollector::start(&mut probes, config, labeler.clone(), &plan));
        lineup.admit(block_io::NAME, Some(&mut probes), started);
    }
    if config.cpu.enabled {
        lineup.admit(
            cpu::NAME,
            None,
            CpuCollector::start(config, labeler.clone()),
        );
    }
    if config.gpu.enabled {
        let c = GpuCollector::start(config, labeler.clone());
        match c.connect_error() {
            // No NVML: down for good (restart once the driver is installed). It still exports
            // how many NVIDIA GPUs the PCI bus has, so a node without any is not alerted on.
            Some(e @ GpuError::LibraryMissing { .. }) => {
                let why = Chain(e).to_string();
                if c.pci_devices() == 0 {
                    tracing::info!(collector = gpu::NAME, reason = %why, "GPU collector off: no NVIDIA GPU on the PCI bus and no NVML library");
                } else {
                    tracing::error!(collector = gpu::NAME, gpus = c.pci_devices(), reason = %why, "GPU collector off: NVIDIA GPUs on the PCI bus but no NVML library");
                    lineup.report.failed.push((gpu::NAME, why));
                }
                lineup.down.push((gpu::NAME, Some(Box::new(c))));
            }
            // NVML loads but does not answer yet (e.g. the driver is still loading): it retries.
            _ => lineup.started.push(Box::new(c)),
        }
    }

    // Slow calls are only sampled when the syscall probes run (they set the thresholds).
    if config.slow_calls.enabled && lineup.running(syscalls::NAME) {
        match SlowEvents::take(&mut probes) {
            Ok(ring) => lineup.report.slow_events = Some(ring),
            Err(e) => tracing::error!(error = %Chain(&e), "slow-call spans unavailable"),
        }
    }

    // Learn the maps' names while map ids can still be looked up (see probes::map_memory).
    let _ = crate::kernel::map_memory();
    let mut agent = Agent::new(Some(probes));
    for c in lineup.started {
        agent.add(c);
    }
    for (name, collector) in lineup.down {
        match collector {
            Some(c) => agent.add_failed_with(c),
            None => agent.add_failed(name),
        }
    }
    Ok((agent, labeler, lineup.report))
}
