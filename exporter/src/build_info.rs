//! Build information: the version and revision baked in at build time. A leaf: it imports
//! nothing from the crate, so every layer may name the version without depending on the agent.

/// The crate version (`Cargo.toml`).
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The source revision, from `SYSSCOPE_REVISION` at build time.
pub(crate) const REVISION: &str = match option_env!("SYSSCOPE_REVISION") {
    Some(r) => r,
    None => "unknown",
};
