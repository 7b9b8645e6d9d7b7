//! `[gpu]`: the GPU collector. Serde types and defaults
//! only; validation is in the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// NVIDIA GPUs through NVML, per device and per process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct GpuConfig {
    /// Loads NVML and exports `sysscope_gpu_*`; without the library (a node with no NVIDIA
    /// driver) the collector reports itself down and nothing else changes.
    pub(crate) enabled: bool,
    /// Path or name of the NVML library, loaded at run time.
    #[schemars(length(min = 1))]
    pub(crate) nvml_library: String,
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            nvml_library: "libnvidia-ml.so.1".into(),
        }
    }
}
