//! How the command-line tools write what they measured: strace-style call lines, the Perfetto
//! (Trace Event Format) timeline, and the units both use.

pub(crate) mod perfetto;
pub(crate) mod strace;
pub(crate) mod units;
