//! `[collection]`: how often the kernel maps are read, series retention, run-time statistics.
//! Serde types and defaults only; validation is in the parent module.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::util::duration as humantime_serde_compat;

/// How often the kernel maps are read, how long idle series stay, and the kernel's run-time
/// statistics of the probes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CollectionConfig {
    /// Scrapes closer together than this share one read of the maps (e.g. "1s").
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "String", extend("x-type" = "duration", "x-max" = "60s"))]
    pub min_interval: Duration,
    /// Maps are also read (and exited processes reclaimed) this often without scrapes.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "String", extend("x-type" = "duration", "x-min" = "100ms", "x-max" = "1h"))]
    pub background_interval: Duration,
    /// A series with no activity and no live process behind it is dropped after this long.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(
        with = "String",
        extend("x-type" = "duration", "x-constraint" = "at least collection.background_interval")
    )]
    pub(crate) series_retention: Duration,
    /// Kernel BPF run-time statistics behind `sysscope_probe_run_seconds_total` and
    /// `sysscope_probe_runs_total`: "sampled" (1 s in every 30 s, extrapolated), "always"
    /// (exact, but the kernel then reads its clock twice around every program run) or "off".
    /// See docs/performance.md.
    pub probe_stats: ProbeStatsMode,
}

/// How the kernel's BPF run-time statistics are kept on (`collection.probe_stats`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProbeStatsMode {
    /// On for a short window at a fixed period; the counters are extrapolated.
    #[default]
    Sampled,
    /// On for as long as sysscope runs; the counters are exact.
    Always,
    /// Never turned on by sysscope (the probe cost metrics are not exported).
    Off,
}

impl Default for CollectionConfig {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(1),
            background_interval: Duration::from_secs(10),
            series_retention: Duration::from_secs(600),
            probe_stats: ProbeStatsMode::default(),
        }
    }
}
