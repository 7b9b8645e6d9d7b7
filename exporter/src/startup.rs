//! Assembling the agent from the config: load the probes, start each collector, and record
//! the ones that could not start. Shared by the exporter and the `--config.check` mode.

use std::sync::{Arc, Mutex};

use crate::{
    agent::Agent,
    collectors::{
        block_io::{self, BlockIoCollector},
        cpu::{self, CpuCollector},
        gpu::{self, GpuCollector, GpuError},
        syscalls::{self, SyscallCollector},
    },
    config::Config,
    metadata::{
        cgroups,
        kubernetes::{self, watch as pod_watch, PodStore},
        Labeler, SharedLabeler,
    },
    probes::{self, LoadOptions, ProbeError, Probes},
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
    pub slow_events: Option<aya::maps::Map>,
}

/// Builds the labeler every collector shares.
pub fn labeler(config: &Config) -> Result<SharedLabeler, StartError> {
    labeler_with_pods(config, None)
}

/// Builds the labeler, naming Kubernetes cgroups from `pods` when the pod watch runs.
pub fn labeler_with_pods(
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

/// Loads the probes and starts every enabled collector. Fails only when nothing can run
/// (no privileges, no BTF, no cgroup v2); a collector that cannot start is reported down.
pub fn start(config: &Config) -> Result<(Agent, SharedLabeler, StartReport), StartError> {
    probes::preflight()?;
    let mut report = StartReport::default();
    let mut started: Vec<Box<dyn crate::collectors::Collector>> = Vec::new();
    let mut failed: Vec<&'static str> = Vec::new();
    let mut failed_with: Vec<Box<dyn crate::collectors::Collector>> = Vec::new();

    // The pod watch feeds the labeler, so it starts first; it never waits for the API.
    let mut pods = None;
    match pod_watch::start(&config.kubernetes) {
        Ok(Some(c)) => {
            pods = Some(c.store());
            started.push(Box::new(c));
        }
        Ok(None) => {}
        Err(e) => {
            tracing::error!(collector = pod_watch::NAME, error = %Chain(&e), "collector failed to start");
            report.failed.push((pod_watch::NAME, Chain(&e).to_string()));
            failed.push(pod_watch::NAME);
        }
    }
    let labeler = labeler_with_pods(config, pods)?;
    // The block probes read kernel structs at offsets found in BTF, set before the load.
    let block_plan = config.block_io.enabled.then(|| {
        let root = labeler
            .lock()
            .expect("labeler lock")
            .cgroups
            .root()
            .to_path_buf();
        block_io::plan(config, &root)
    });
    let options = LoadOptions {
        block_io: block_plan
            .as_ref()
            .and_then(|r| r.as_ref().ok().map(|plan| plan.probe)),
        ..LoadOptions::default()
    };
    let mut probes = Probes::load(config, &options)?;

    if config.syscalls.enabled {
        match SyscallCollector::start(&mut probes, config, labeler.clone()) {
            Ok(c) => started.push(Box::new(c)),
            Err(e) => {
                tracing::error!(collector = syscalls::NAME, error = %Chain(&e), "collector failed to start");
                probes.detach_collector(syscalls::NAME);
                report.failed.push((syscalls::NAME, Chain(&e).to_string()));
                failed.push(syscalls::NAME);
            }
        }
    }

    if let Some(resolved) = block_plan {
        match resolved
            .and_then(|plan| BlockIoCollector::start(&mut probes, config, labeler.clone(), &plan))
        {
            Ok(c) => started.push(Box::new(c)),
            Err(e) => {
                tracing::error!(collector = block_io::NAME, error = %Chain(&e), "collector failed to start");
                report.failed.push((block_io::NAME, Chain(&e).to_string()));
                probes.detach_collector(block_io::NAME);
                failed.push(block_io::NAME);
            }
        }
    }

    if config.cpu.enabled {
        match CpuCollector::start(config, labeler.clone()) {
            Ok(c) => started.push(Box::new(c)),
            Err(e) => {
                tracing::error!(collector = cpu::NAME, error = %Chain(&e), "collector failed to start");
                report.failed.push((cpu::NAME, Chain(&e).to_string()));
                failed.push(cpu::NAME);
            }
        }
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
                    report.failed.push((gpu::NAME, why));
                }
                failed_with.push(Box::new(c));
            }
            // NVML loads but does not answer yet (e.g. the driver is still loading): it retries.
            _ => started.push(Box::new(c)),
        }
    }

    // Slow calls are only sampled when the syscall probes run (they set the thresholds).
    if config.slow_calls.enabled && started.iter().any(|c| c.name() == syscalls::NAME) {
        match probes.take_map(sysscope_abi::maps::SLOW_EVENTS) {
            Ok(map) => report.slow_events = Some(map),
            Err(e) => tracing::error!(error = %Chain(&e), "slow-call spans unavailable"),
        }
    }

    // Learn the maps' names while map ids can still be looked up (see probes::map_memory).
    let _ = crate::probes::map_memory();
    let mut agent = Agent::new(Some(probes));
    for c in started {
        agent.add(c);
    }
    for name in failed {
        agent.add_failed(name);
    }
    for c in failed_with {
        agent.add_failed_with(c);
    }
    Ok((agent, labeler, report))
}
