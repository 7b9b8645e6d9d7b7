//! The `kubernetes` collector: reports the watch of this node's pods
//! ([`crate::metadata::kubernetes::watch`]), which names cgroups with their namespace, pod
//! and container. Touches no probe or map.
//! Metrics: `sysscope_collector_up{collector="kubernetes"}` (through the agent),
//! `sysscope_kubernetes_pods`, `sysscope_kubernetes_pods_not_cached_total`,
//! `sysscope_kubernetes_api_errors_total`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use super::{Collector, CollectorError};
pub(crate) use crate::metadata::kubernetes::watch::NAME;
use crate::{
    config::KubernetesConfig,
    metadata::kubernetes::{
        watch::{self, Watch, WatchError},
        PodStore,
    },
};

/// How long the first list may take before the collector reports itself down for lack of it.
const FIRST_LIST_GRACE: Duration = Duration::from_secs(10);

/// The `kubernetes` collector: owns the watch and reports its health and cache.
#[derive(Debug)]
pub(crate) struct PodWatchCollector(Watch);

impl PodWatchCollector {
    /// Starts the pod watch if the configuration enables it: `Ok(None)` when it is off (or
    /// "auto" outside a cluster).
    pub(crate) fn start(config: &KubernetesConfig) -> Result<Option<Self>, WatchError> {
        Ok(watch::start(config)?.map(Self::new))
    }

    pub(crate) fn new(watch: Watch) -> Self {
        Self(watch)
    }

    /// The cache the labeler reads names from.
    pub(crate) fn store(&self) -> Arc<PodStore> {
        self.0.store.clone()
    }
}

impl Collector for PodWatchCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Never waits for the API: reads what the watch last reported.
    fn refresh(&mut self) -> Result<(), CollectorError> {
        let Watch {
            store,
            health,
            started,
            ..
        } = &self.0;
        store.purge(Instant::now());
        if !health.synced() {
            // Starting: up until a request fails or the first list takes too long.
            let why = health.last_error();
            if why.is_empty() && started.elapsed() < FIRST_LIST_GRACE {
                return Ok(());
            }
            return Err(CollectorError::Other(if why.is_empty() {
                format!("this node's pods have not been listed within {FIRST_LIST_GRACE:?}")
            } else {
                format!("this node's pods have not been listed yet: {why}")
            }));
        }
        if health.failing() {
            return Err(CollectorError::Other(format!(
                "Kubernetes API: {} (serving the cached pods meanwhile)",
                health.last_error()
            )));
        }
        Ok(())
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        encoder
            .encode_descriptor(
                "sysscope_kubernetes_pods",
                "Pods of this node in the pod cache that names cgroups (deleted pods stay for a minute).",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&(self.0.store.len() as i64))?;
        encoder
            .encode_descriptor(
                "sysscope_kubernetes_pods_not_cached",
                "Pod updates not cached because kubernetes.max_pods pods were cached already (their cgroups lack namespace/pod/container).",
                None,
                MetricType::Counter,
            )?
            .encode_counter::<NoLabelSet, _, u64>(&self.0.store.rejected(), None)?;
        encoder
            .encode_descriptor(
                "sysscope_kubernetes_api_errors",
                "Kubernetes API requests and watch streams of the pod watch that failed (each is retried with backoff).",
                None,
                MetricType::Counter,
            )?
            .encode_counter::<NoLabelSet, _, u64>(&self.0.health.errors(), None)?;
        Ok(())
    }
}
