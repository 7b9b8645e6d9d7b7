//! Block I/O probes (not yet written).
