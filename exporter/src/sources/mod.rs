//! Sources: what the node's own files say, read once for the collectors and the command-line
//! tools alike (the layer right above kernel access, which both may use). No probe and no
//! map: [`proc_stat`] reads the CPUs' time from `/proc/stat`.

pub(crate) mod proc_stat;
