//! Sources: readers of what the node exposes outside sysscope's own probes (libraries and
//! files), shared by the collectors and the command-line tools so both read them one way.

pub mod nvml;
