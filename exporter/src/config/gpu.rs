//! `[gpu]`: the GPU collector. Serde types and defaults
//! only; validation is in the parent module.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct GpuConfig {
    pub(crate) enabled: bool,
    /// Path or name of the NVML library, loaded at run time.
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
