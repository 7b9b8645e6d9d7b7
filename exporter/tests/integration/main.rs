//! The integration tests, linked once: each module is the tests of one area, and `common` holds
//! what they share. Most load the real probes on the running kernel and need root: without it
//! they skip with a message, and under `CI=true` they fail. Run one area or one test by name:
//! `cargo test --test integration syscalls::` or `cargo test --test integration <name>`.

mod common;

mod block_io;
mod cli;
mod connections;
mod cpu;
mod fuzz;
mod gpu;
mod gpu_alert;
mod gpu_node_check;
mod hostile_names;
mod http_hardening;
mod kernel_truth;
mod kernels;
mod kubernetes;
mod label_control;
mod metric_catalogue;
mod nvml_standin;
mod paths;
mod performance;
mod pods;
mod prometheus_e2e;
mod reload;
mod robustness;
mod security;
mod soak;
mod spans;
mod switches;
mod syscall_time;
mod syscalls;
mod tenants;
