//! Configuration reload without restart, on SIGHUP or `POST /-/reload`: the file is read and
//! validated as at start; if every changed key may change live ([`crate::config::LIVE_KEYS`]:
//! slow-call thresholds, the series budget, series retention) the running collectors take the
//! new values, otherwise nothing changes and the error names each key that needs a restart.
//! A reload is all or nothing: a bad file or a restart-only change keeps the running
//! configuration entirely.
//!
//! Metrics: `sysscope_config_last_reload_successful`,
//! `sysscope_config_last_reload_success_timestamp_seconds`, `sysscope_config_reloads_total`.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use crate::{
    agent::Agent,
    collectors::{self_metrics::SelfMetrics, CollectorError},
    config::{self, CollectorFlags, Config, ConfigError},
    util::error::Chain,
};

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("no configuration file to reload (sysscope runs with its defaults; start it with --config.file)")]
    NoFile,
    #[error("the new configuration is invalid; the running one is kept")]
    Invalid(#[source] ConfigError),
    #[error(
        "{} need{} a restart; the running configuration is kept: {}",
        if .0.len() == 1 { "this key" } else { "these keys" },
        if .0.len() == 1 { "s" } else { "" },
        .0.join(", ")
    )]
    NeedsRestart(Vec<String>),
    #[error("collector `{collector}` could not take the new configuration")]
    Apply {
        collector: &'static str,
        #[source]
        source: CollectorError,
    },
}

/// Reload outcomes: typed handles registered with the self-metrics ([`ReloadStats::register`]).
#[derive(Debug, Clone)]
pub struct ReloadStats {
    last_successful: Gauge,
    last_success_unix: Gauge,
    reloads: Family<[(&'static str, &'static str); 1], Counter>,
}

impl Default for ReloadStats {
    fn default() -> Self {
        Self::new()
    }
}

impl ReloadStats {
    /// Counts from zero; the configuration loaded at start counts as the last success.
    pub fn new() -> Self {
        let stats = Self {
            last_successful: Gauge::default(),
            last_success_unix: Gauge::default(),
            reloads: Family::default(),
        };
        stats.last_successful.set(1);
        stats.last_success_unix.set(unix_now() as i64);
        for result in ["success", "failure"] {
            let _ = stats.reloads.get_or_create(&[("result", result)]);
        }
        stats
    }

    /// Registers the reload families with the self-metrics.
    pub fn register(&self, self_metrics: &mut SelfMetrics) {
        self_metrics.register(
            "sysscope_config_last_reload_successful",
            "Whether the last configuration reload succeeded (1 before any reload).",
            self.last_successful.clone(),
        );
        self_metrics.register(
            "sysscope_config_last_reload_success_timestamp_seconds",
            "When the configuration was last loaded successfully (at start or by a reload).",
            self.last_success_unix.clone(),
        );
        self_metrics.register(
            "sysscope_config_reloads",
            "Configuration reloads (SIGHUP, POST /-/reload), by result.",
            self.reloads.clone(),
        );
    }

    fn succeeded(&self) {
        self.reloads.get_or_create(&[("result", "success")]).inc();
        self.last_successful.set(1);
        self.last_success_unix.set(unix_now() as i64);
    }

    fn failed(&self) {
        self.reloads.get_or_create(&[("result", "failure")]).inc();
        self.last_successful.set(0);
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Reloads the configuration file into the running agent.
pub struct Reloader {
    path: Option<PathBuf>,
    flags: CollectorFlags,
    current: Mutex<Config>,
    agent: Arc<Mutex<Agent>>,
    stats: Arc<ReloadStats>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// A reloader of `path` (the `--config.file`, if any) with the command line's collector
    /// `flags` applied over it, for an agent started with `config`, counting outcomes in
    /// `stats` (which the agent's self-metrics encode).
    pub fn new(
        path: Option<PathBuf>,
        flags: CollectorFlags,
        config: Config,
        agent: Arc<Mutex<Agent>>,
        stats: Arc<ReloadStats>,
    ) -> Self {
        Self {
            path,
            flags,
            current: Mutex::new(config),
            agent,
            stats,
        }
    }

    /// Reloads: returns the keys that changed (empty if none), or why nothing changed.
    /// Logged either way.
    pub fn reload(&self) -> Result<Vec<String>, ReloadError> {
        let result = self.try_reload();
        match &result {
            Ok(changed) => {
                self.stats.succeeded();
                tracing::info!(changed = ?changed, "configuration reloaded");
            }
            Err(e) => {
                self.stats.failed();
                tracing::error!(error = %Chain(e), "configuration reload failed");
            }
        }
        result
    }

    fn try_reload(&self) -> Result<Vec<String>, ReloadError> {
        let path = self.path.as_ref().ok_or(ReloadError::NoFile)?;
        let mut new = Config::load(path).map_err(ReloadError::Invalid)?;
        // The command line wins over the file on reload as it did at start.
        new.apply_collector_flags(&self.flags);
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let changed = config::changed_keys(&current, &new);
        let restart: Vec<String> = changed
            .iter()
            .filter(|k| !config::is_live(k))
            .cloned()
            .collect();
        if !restart.is_empty() {
            return Err(ReloadError::NeedsRestart(restart));
        }
        if !changed.is_empty() {
            self.agent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .reconfigure(&new)
                .map_err(|(collector, source)| ReloadError::Apply { collector, source })?;
            *current = new;
        }
        Ok(changed)
    }
}
