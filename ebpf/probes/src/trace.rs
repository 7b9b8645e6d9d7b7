//! On-demand trace probes (not yet written).
