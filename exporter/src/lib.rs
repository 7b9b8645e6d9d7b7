//! sysscope: always-on eBPF syscall, block-I/O, CPU and GPU metrics for every cgroup and
//! process, exported to Prometheus and OpenTelemetry.
//!
//! Data flows one way: probes (`ebpf/probes`) -> kernel maps -> [`collectors`] ->
//! [`agent`] -> [`exposition`]. [`probes`] loads and attaches the eBPF object, [`metadata`]
//! turns kernel ids into labels, [`series`] bounds cardinality, [`config`] is the TOML file,
//! [`spans`] turns sampled slow syscalls into spans.

pub mod agent;
pub mod bpf_batch;
pub mod btf;
pub mod build_info;
pub mod cli;
pub mod collectors;
pub mod config;
pub mod cumulative;
pub mod exposition;
pub mod fd_class;
pub mod hist;
pub mod metadata;
#[cfg(test)]
mod object_contract;
pub mod privileges;
pub mod probe_stats;
pub mod probes;
pub mod series;
pub mod spans;
pub mod startup;
pub mod syscall_stats;
pub mod syscall_table;
pub mod util;
