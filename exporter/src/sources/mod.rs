//! Sources: readers of what the node exposes outside sysscope's own probes (libraries and
//! files), shared by the collectors and the command-line tools so both read them one way (the
//! layer right above kernel access, which both may use). No probe and no map: [`nvml`] is the
//! NVIDIA driver's library, [`proc_stat`] the CPUs' time from `/proc/stat`.

pub mod nvml;
pub(crate) mod proc_stat;
