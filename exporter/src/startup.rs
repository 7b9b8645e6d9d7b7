//! Assembling the agent from the config: load the probes, start each collector, and record
//! the ones that could not start. Shared by the exporter and the `--config.check` mode.

use std::sync::{Arc, Mutex};

use crate::{
    agent::Agent,
    collectors::{
        block_io::{self, BlockIoCollector},
        syscalls::{self, SyscallCollector},
    },
    config::Config,
    metadata::{cgroups, Labeler, SharedLabeler},
    probes::{self, LoadOptions, ProbeError, Probes},
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
}

/// Builds the labeler every collector shares.
pub fn labeler(config: &Config) -> Result<SharedLabeler, StartError> {
    let root = cgroups::v2_mount()?;
    let labeler = Labeler::new(root, config.labels.pid);
    Ok(Arc::new(Mutex::new(labeler)))
}

/// Loads the probes and starts every enabled collector. Fails only when nothing can run
/// (no privileges, no BTF, no cgroup v2); a collector that cannot start is reported down.
pub fn start(config: &Config) -> Result<(Agent, SharedLabeler, StartReport), StartError> {
    probes::preflight()?;
    let labeler = labeler(config)?;
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
    let mut report = StartReport::default();
    let mut started: Vec<Box<dyn crate::collectors::Collector>> = Vec::new();
    let mut failed: Vec<&'static str> = Vec::new();

    if config.syscalls.enabled {
        match SyscallCollector::start(&mut probes, config, labeler.clone()) {
            Ok(c) => started.push(Box::new(c)),
            Err(e) => {
                tracing::error!(collector = syscalls::NAME, error = %e, "collector failed to start");
                report.failed.push((syscalls::NAME, e.to_string()));
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
                tracing::error!(collector = block_io::NAME, error = %e, "collector failed to start");
                report.failed.push((block_io::NAME, e.to_string()));
                failed.push(block_io::NAME);
            }
        }
    }

    let mut agent = Agent::new(Some(probes));
    for c in started {
        agent.add(c);
    }
    for name in failed {
        agent.add_failed(name);
    }
    Ok((agent, labeler, report))
}
