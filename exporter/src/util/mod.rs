//! Small utilities every layer may use: durations, the monotonic clock, giving freed heap
//! memory back, reading small pseudo-files. The bottom layer: nothing here imports from the rest of the crate.

pub(crate) mod clock;
pub mod duration;
pub mod error;
pub(crate) mod fdinfo;
pub mod logfmt;
pub(crate) mod memory;
pub(crate) mod pseudo_file;
#[cfg(test)]
pub(crate) mod test_support;
