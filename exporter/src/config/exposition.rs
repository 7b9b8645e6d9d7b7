//! `[exposition]`: what the Prometheus protobuf exposition carries of the duration histograms
//! (`sysscope_syscall_duration_seconds`, `sysscope_block_io_duration_seconds`). The text
//! formats always carry the classic buckets. Serde types and defaults only; validation is in
//! the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a scrape that asks for the Prometheus protobuf format gets of the duration histograms;
/// at least one of the two forms.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ExpositionConfig {
    /// Native histograms (the kernel's buckets, one series per label set).
    pub(crate) native_histograms: bool,
    /// The classic buckets too (for Prometheus' `always_scrape_classic_histograms`, or
    /// dashboards that read `_bucket` series while native histograms are rolled out).
    pub(crate) classic_histograms: bool,
}

impl Default for ExpositionConfig {
    fn default() -> Self {
        Self {
            native_histograms: true,
            classic_histograms: false,
        }
    }
}
