//! sysscope: always-on eBPF syscall, block-I/O, CPU and GPU metrics for every cgroup and
//! process, exported to Prometheus and OpenTelemetry.
//!
//! Data flows one way: probes (`ebpf/probes`) -> kernel maps -> [`collectors`] ->
//! [`agent`] -> [`exposition`]. [`kernel`] loads and attaches the eBPF object and reads its
//! maps, [`sources`] reads what the node exposes besides the probes (NVML, `/proc/stat`),
//! [`metadata`] turns kernel ids into labels, [`series`] bounds cardinality, [`config`] is the
//! TOML file, [`spans`] turns sampled slow syscalls into spans, and [`serve`] wires them
//! together and runs the exporter.

// Items are `pub(crate)` unless the binaries or the integration tests use them; this keeps
// `pub` out of modules that are private anyway.
#![warn(unreachable_pub)]

pub mod agent;
pub mod build_info;
pub mod cli;
pub(crate) mod collector;
pub mod collectors;
pub mod config;
pub mod exposition;
pub mod hist;
pub mod kernel;
pub mod metadata;
pub mod openmetrics;
pub mod privileges;
pub mod reload;
pub mod series;
pub mod serve;
pub mod sources;
pub mod spans;
pub mod startup;
pub mod syscall_table;
pub mod util;
