//! The exporter's composition root: what `sysscope` runs when it is given no subcommand. It
//! binds the listen address, starts the agent ([`crate::startup`]), wires the slow-call source
//! to its sinks (exemplars, the OTLP span exporter, the recent-calls route), drops the
//! capabilities running does not need ([`crate::privileges`]), and serves until asked to stop:
//! scrapes and the OTLP metrics push share one [`Scraper`], a background tick refreshes the
//! collectors when nobody scrapes and gives the heap pages freed since the last tick back to
//! the kernel (process churn leaves a cycle's tables freed but resident otherwise), and SIGHUP
//! (like `POST /-/reload`) reloads the configuration. On the way out it sends what is queued
//! (bounded), has the agent detach every probe, and only then says so. [`run_exporter`] builds
//! the runtime; `serve` names the stages, each a function below it.
//! `main.rs` parses the flags, installs the stop signals and calls [`run_exporter`].

use std::{
    collections::BTreeMap,
    future::Future,
    path::PathBuf,
    sync::{atomic::Ordering, Arc, Mutex},
    time::Duration,
};

use opentelemetry_sdk::Resource;
use tokio::{net::TcpListener, task::JoinHandle};

use crate::{
    agent::Agent,
    config::{
        otlp::{Settings, SettingsError},
        CollectorFlags, Config,
    },
    exposition::{
        http::{self, AppState, HttpError},
        otlp::{self, traces::SpanExport, ExportError},
        scrape::Scraper,
        web_config::WebConfigFile,
    },
    kernel::slow_events::SlowEvents,
    metadata::SharedLabeler,
    privileges::{self, PrivilegeError},
    reload,
    spans::{self, exemplars::ExemplarStore, recent::RecentCalls, SlowCalls, SpanSink},
    startup::{self, StartError},
    util::{error::Chain, memory::HeapTrimmer},
};

/// How often at most the background refresh hands freed heap pages back to the kernel.
const HEAP_TRIM_GAP: Duration = Duration::from_secs(10);

/// What the exporter is told on its command line.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `--web.listen-address`.
    pub listen_address: String,
    /// `--web.telemetry-path`.
    pub telemetry_path: String,
    /// `--config.file`, read again on reload.
    pub config_file: Option<PathBuf>,
    /// `--collector.<name>` / `--no-collector.<name>`, applied over the file at each reload as
    /// they were at start.
    pub collector_flags: CollectorFlags,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--web.telemetry-path `{0}` must start with /")]
    TelemetryPath(String),
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Otlp(#[from] SettingsError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    OtlpExport(#[from] ExportError),
    // Running on with capabilities it promised to give up would be worse than not running:
    // the operator learns why and the supervisor restarts it.
    #[error("could not drop the capabilities sysscope does not need after start-up")]
    Privileges(#[source] PrivilegeError),
    #[error("installing the SIGHUP handler")]
    Hangup(#[source] std::io::Error),
}

/// Runs the exporter until `shutdown` (called once everything runs, so its signal handlers are
/// installed before the exporter reports ready) resolves. Fails before loading anything on a
/// bad telemetry path or a busy port.
pub fn run_exporter<F, S>(
    options: &ServeOptions,
    config: Config,
    web: Option<Arc<WebConfigFile>>,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: FnOnce() -> S,
    S: Future<Output = ()>,
{
    if !options.telemetry_path.starts_with('/') {
        return Err(ServeError::TelemetryPath(options.telemetry_path.clone()));
    }
    // The OTLP clients (reqwest) take the process's TLS provider; the binary installs ring
    // first thing, and so does this for callers of the library that did not (a no-op if set).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .thread_name("sysscope")
        .build()
        .map_err(ServeError::Runtime)?;
    let outcome = runtime.block_on(serve(options, config, web, shutdown));
    // Scrapes still queued for the agent when the server stopped are not waited for: their
    // clients are gone, and a stop must not take as long as the queue.
    runtime.shutdown_timeout(Duration::from_secs(1));
    outcome
}

/// The exporter's stages, in order, inside its runtime.
async fn serve<F, S>(
    options: &ServeOptions,
    config: Config,
    web: Option<Arc<WebConfigFile>>,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: FnOnce() -> S,
    S: Future<Output = ()>,
{
    // Bind first: a busy port is the cheapest failure to report.
    let listener = http::bind(&options.listen_address).await?;
    let otlp_settings = Settings::from_env(&config.otlp, config.kubernetes.node_name.as_deref())?;
    let (mut agent, labeler, mut report) = startup::start(&config)?;
    let ring = report.slow_events.take();
    let slow = wire_slow_calls(&config, &otlp_settings, &mut agent, labeler, ring)?;
    // Everything is attached and the span reader runs: give up what running does not need
    // (see privileges.rs); threads started later inherit the reduced set.
    drop_privileges(&config)?;
    let reload_stats = Arc::new(reload::ReloadStats::new());
    reload_stats.register(agent.self_metrics());
    let agent = Arc::new(Mutex::new(agent));
    let reloader = Arc::new(reload::Reloader::new(
        options.config_file.clone(),
        options.collector_flags.clone(),
        config.clone(),
        agent.clone(),
        reload_stats,
    ));
    let scraper = Arc::new(
        Scraper::new(agent.clone(), config.collection.min_interval)
            .with(config.exposition.clone(), slow.exemplars.clone()),
    );
    let state = app_state(options, scraper.clone(), &slow, reloader.clone());
    let push =
        otlp::metrics::MetricPush::start(&otlp_settings, scraper.clone(), slow.stats.clone())?;
    let tasks = vec![
        spawn_background(scraper, config.collection.background_interval),
        spawn_hangups(reloader)?,
    ];
    // Handlers first: a SIGTERM right after the first ready answer must not kill the process
    // with the default action before the server loop polls its shutdown future.
    let shutdown = shutdown();
    state.ready.store(true, Ordering::Relaxed);
    log_serving(&listener, options, web.as_deref());
    http::serve_with(listener, state, web, shutdown, Duration::from_secs(3)).await;
    stop(tasks, push, slow.calls, &agent).await;
    Ok(())
}

/// The slow-call pipeline: the reader of the probes' ring buffer and the sinks it feeds.
struct SlowCallWiring {
    calls: SlowCalls,
    exemplars: Arc<ExemplarStore>,
    recent: Arc<RecentCalls>,
    /// The OTLP self-metrics (spans and the metrics push share them).
    stats: Arc<otlp::Stats>,
}

/// Wires the slow-call source to its sinks: exemplars, the OTLP span exporter (with an
/// endpoint) and the recent calls; registers their self-metrics while the agent is not shared.
fn wire_slow_calls(
    config: &Config,
    otlp_settings: &Settings,
    agent: &mut Agent,
    labeler: SharedLabeler,
    ring: Option<SlowEvents>,
) -> Result<SlowCallWiring, ServeError> {
    let sampled = config.slow_calls.enabled && ring.is_some();
    let stats = Arc::new(otlp::Stats::new(
        agent.self_metrics(),
        otlp_settings.traces.is_some() && sampled,
        otlp_settings.metrics.is_some(),
    ));
    let otlp_spans = match (&otlp_settings.traces, sampled) {
        (Some(traces), true) => Some(Arc::new(SpanExport::start(
            traces.clone(),
            resource(otlp_settings),
            config.slow_calls.export_queue,
            otlp_settings.max_batch,
            otlp_settings.schedule_delay,
            stats.clone(),
        )?)),
        _ => None,
    };
    // The recent calls are always kept, but they are the destination (and counted) only
    // without an OTLP endpoint, so `exported` never counts one span twice.
    let mut recent = RecentCalls::new(config.slow_calls.recent_capacity);
    if otlp_spans.is_none() && config.slow_calls.recent_capacity > 0 {
        stats.spans.exported("local");
        recent = recent.counted_as_local(stats.spans.clone());
    }
    let recent = Arc::new(recent);
    let exemplars = Arc::new(ExemplarStore::new(spans::EXEMPLAR_SERIES));
    let mut sinks: Vec<Arc<dyn SpanSink>> = vec![exemplars.clone()];
    if let Some(otlp) = &otlp_spans {
        sinks.push(otlp.clone());
    }
    sinks.push(recent.clone());
    let calls = SlowCalls::start(config, labeler, ring, sinks, stats.spans.clone());
    Ok(SlowCallWiring {
        calls,
        exemplars,
        recent,
        stats,
    })
}

/// Drops the capabilities running does not need, and says what it kept.
fn drop_privileges(config: &Config) -> Result<(), ServeError> {
    let dropped = privileges::drop_after_start(config).map_err(ServeError::Privileges)?;
    tracing::info!(
        kept = ?privileges::cap_names(dropped.kept),
        bounding_set_reduced = dropped.bounding_set_reduced,
        threads = dropped.threads,
        "dropped capabilities"
    );
    if let Some(fallback) = dropped.proc_fallback {
        tracing::info!(
            proc_fallback = %fallback.describe(),
            "slow-call file names come from the kernel"
        );
    }
    Ok(())
}

/// What the HTTP server serves: the metrics, the recent slow calls and `POST /-/reload`.
fn app_state(
    options: &ServeOptions,
    scraper: Arc<Scraper>,
    slow: &SlowCallWiring,
    reloader: Arc<reload::Reloader>,
) -> Arc<AppState> {
    let mut routes = BTreeMap::new();
    routes.insert(
        spans::recent::ROUTE.to_string(),
        http::cached(
            slow.recent.route(slow.calls.running()),
            Duration::from_secs(1),
        ),
    );
    let reload: http::ReloadHandler = Arc::new(move || {
        reloader
            .reload()
            .map(|changed| {
                if changed.is_empty() {
                    "reloaded; nothing changed".to_string()
                } else {
                    format!("reloaded; changed: {}", changed.join(", "))
                }
            })
            .map_err(|e| Chain(&e).to_string())
    });
    Arc::new(AppState {
        scraper,
        telemetry_path: options.telemetry_path.clone(),
        ready: false.into(),
        routes,
        reload: Some(reload),
    })
}

/// Refreshes the collectors every `every` when nobody scrapes, and gives the heap pages freed
/// since the last tick back to the kernel.
fn spawn_background(scraper: Arc<Scraper>, every: Duration) -> JoinHandle<()> {
    // Half a tick of slack: ticks that vary in length still trim on every tick once the gap
    // has passed, not on every other one.
    let gap = HEAP_TRIM_GAP.saturating_sub(every / 2);
    let mut trimmer = HeapTrimmer::new(gap);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let s = scraper.clone();
            let refreshed = tokio::task::spawn_blocking(move || {
                s.refresh();
                if let Some(took) = trimmer.maybe_trim() {
                    tracing::debug!(?took, "freed heap pages given back to the kernel");
                }
                trimmer
            });
            // A refresh that panicked took the trimmer with it.
            trimmer = refreshed.await.unwrap_or_else(|_| HeapTrimmer::new(gap));
        }
    })
}

/// SIGHUP reloads the configuration, as it does for Prometheus.
fn spawn_hangups(reloader: Arc<reload::Reloader>) -> Result<JoinHandle<()>, ServeError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).map_err(ServeError::Hangup)?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP received, reloading the configuration");
            let r = reloader.clone();
            let _ = tokio::task::spawn_blocking(move || r.reload()).await;
        }
    }))
}

fn log_serving(listener: &TcpListener, options: &ServeOptions, web: Option<&WebConfigFile>) {
    tracing::info!(
        address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        path = %options.telemetry_path,
        tls = web.is_some_and(|w| w.tls().is_some()),
        basic_auth = web.is_some_and(|w| w.current().is_ok_and(|c| c.basic_auth.is_some())),
        "serving metrics"
    );
}

/// Stops the background tasks, sends what is queued (bounded), and detaches every probe; says
/// so only once it has.
async fn stop(
    tasks: Vec<JoinHandle<()>>,
    push: Option<otlp::metrics::MetricPush>,
    slow_calls: SlowCalls,
    agent: &Mutex<Agent>,
) {
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    // The span exporter's shutdown blocks while its last exports run on the runtime's
    // workers: it waits here, on the thread that drives the exporter, not in the blocking pool,
    // where it would queue behind scrapes still waiting for the agent.
    if let Some(push) = push {
        push.shutdown(Duration::from_secs(1)).await;
    }
    tokio::task::block_in_place(move || slow_calls.shutdown(Duration::from_secs(2)));
    // Detached here, not when the last holder of the agent lets go: a scrape still queued
    // when the server stopped may hold it until the runtime goes.
    let programs =
        tokio::task::block_in_place(|| agent.lock().unwrap_or_else(|e| e.into_inner()).detach());
    tracing::info!(programs, "stopped; all probes detached");
}

/// The OTLP resource of spans: the same attributes as the metrics push.
fn resource(settings: &Settings) -> Resource {
    Resource::builder_empty()
        .with_attributes(
            settings
                .resource
                .iter()
                .map(|(k, v)| opentelemetry::KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(listen_address: &str, telemetry_path: &str) -> ServeOptions {
        ServeOptions {
            listen_address: listen_address.into(),
            telemetry_path: telemetry_path.into(),
            config_file: None,
            collector_flags: CollectorFlags::default(),
        }
    }

    fn never() -> impl Future<Output = ()> {
        std::future::pending()
    }

    #[test]
    fn a_telemetry_path_without_a_slash_is_refused_before_anything_runs() {
        let err = run_exporter(
            &options("127.0.0.1:0", "metrics"),
            Config::default(),
            None,
            never,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--web.telemetry-path `metrics` must start with /"
        );
    }

    #[test]
    fn a_busy_port_is_refused_before_the_probes_load() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap().to_string();
        // Without the check running first, this would load the probes (and fail without
        // root, or take the node's tracepoints with it).
        let err = run_exporter(
            &options(&address, "/metrics"),
            Config::default(),
            None,
            never,
        )
        .unwrap_err();
        assert!(
            matches!(err, ServeError::Http(HttpError::Bind { .. })),
            "{}",
            Chain(&err)
        );
        assert!(err.to_string().contains(&address), "{err}");
    }
}
