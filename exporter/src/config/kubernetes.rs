//! `[kubernetes]`: Kubernetes identity and the pod watch. Serde types and defaults
//! only; validation is in the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Pod names for the cgroups of this node's pods.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// Watch this node's pods for `namespace`/`pod`/`container` labels: "auto" (when running
    /// in a cluster), "on" or "off".
    #[schemars(extend("enum" = ["auto", "on", "off"]))]
    pub(crate) pod_watch: String,
    /// The node whose pods are watched; defaults to the NODE_NAME environment variable.
    #[schemars(example = "worker-1")]
    pub node_name: Option<String>,
    /// Pods kept in the cache at most.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub(crate) max_pods: usize,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            pod_watch: "auto".into(),
            node_name: None,
            max_pods: 2048,
        }
    }
}
