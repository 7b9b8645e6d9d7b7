//! What every collector is to the agent: the [`Collector`] trait, its error, and the health it
//! reports about itself beside its own metrics. Part of the collectors layer.

use prometheus_client::encoding::DescriptorEncoder;

use crate::kernel::ProbeError;

/// Occupancy of one kernel map, for `sysscope_map_*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MapUsage {
    pub(crate) map: &'static str,
    pub(crate) entries: u64,
    pub(crate) capacity: u64,
}

impl MapUsage {
    /// Map `map` of `capacity` entries, none seen yet.
    pub(crate) fn new(map: &'static str, capacity: u32) -> Self {
        Self {
            map,
            entries: 0,
            capacity: capacity as u64,
        }
    }

    /// Records the entries seen at a read.
    pub(crate) fn seen(&mut self, entries: u64) {
        self.entries = entries;
    }
}

/// What every collector reports about itself beside its own metrics.
#[derive(Debug, Clone, Default)]
pub struct Health {
    pub(crate) maps: Vec<MapUsage>,
    /// Metric family -> label sets folded into "other" by the cardinality budget.
    pub(crate) folded_series: Vec<(&'static str, u64)>,
    /// Reason -> events seen only half, found by user space (for `sysscope_probe_missed_events`).
    pub(crate) missed_events: Vec<(&'static str, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    /// A map could not be read or written (the kernel layer's error names it; boxed, as it is
    /// large and rare).
    #[error(transparent)]
    Map(Box<ProbeError>),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

impl From<ProbeError> for CollectorError {
    fn from(e: ProbeError) -> Self {
        Self::Map(Box::new(e))
    }
}

pub trait Collector: Send {
    /// The `collector` label value (`syscalls`, `block_io`, `cpu`, `gpu`, ...).
    fn name(&self) -> &'static str;

    /// Reads fresh values from the kernel or the filesystem.
    fn refresh(&mut self) -> Result<(), CollectorError>;

    /// Writes this collector's metric families.
    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result;

    /// Map occupancy, folded series and events seen only half, for the self-metrics.
    fn health(&self) -> Health {
        Health::default()
    }

    /// Takes the keys of a reloaded configuration that may change while running
    /// ([`crate::config::LIVE_KEYS`]); the others were refused before this is called.
    fn reconfigure(&mut self, _config: &crate::config::Config) -> Result<(), CollectorError> {
        Ok(())
    }
}
