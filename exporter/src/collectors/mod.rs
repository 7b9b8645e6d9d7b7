//! Collectors: one module per source of metrics. Each reads its own kernel maps or files,
//! keeps its own series, and encodes its own metric families.
//!
//! A collector that fails to start is reported down (`sysscope_collector_up 0`) with its
//! reason in the log, and every other collector keeps running; one whose refresh fails is
//! down for that scrape and retried on the next. [`self_metrics`] is sysscope's own
//! collector: refreshed after the others with what they report ([`Health`]), never down.

pub(crate) mod block_io;
pub(crate) mod cgroup_cpu;
pub mod cpu;
pub mod gpu;
pub(crate) mod kubernetes;
pub(crate) mod self_metrics;
pub(crate) mod syscall_time;
pub(crate) mod syscalls;

pub(crate) use crate::collector::MapUsage;
pub use crate::collector::{Collector, CollectorError, Health};
