//! The `sysscope` binary: the exporter (default) and the command-line tools.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::ExitCode,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use anyhow::Context;
use clap::{Parser, Subcommand};
use sysscope::{
    config::Config,
    exposition::{
        http::{self, AppState},
        scrape::Scraper,
    },
    startup,
};
use tracing_subscriber::EnvFilter;

/// Always-on eBPF syscall, block-I/O, CPU and GPU metrics for every cgroup and process.
///
/// Run as root (or with CAP_BPF, CAP_PERFMON and CAP_DAC_READ_SEARCH) and scrape
/// http://127.0.0.1:9812/metrics.
#[derive(Debug, Parser)]
#[command(name = "sysscope", version, about, long_about = None)]
struct Cli {
    /// Address to serve metrics on (host:port). Loopback by default: expose it deliberately.
    #[arg(
        long = "web.listen-address",
        default_value = "127.0.0.1:9812",
        global = true
    )]
    listen_address: String,

    /// Path under which metrics are served.
    #[arg(long = "web.telemetry-path", default_value = "/metrics", global = true)]
    telemetry_path: String,

    /// TLS and basic-auth configuration (Prometheus exporter-toolkit format).
    #[arg(long = "web.config.file", global = true)]
    web_config_file: Option<PathBuf>,

    /// Configuration file (TOML); see `--print-default-config`.
    #[arg(long = "config.file", global = true)]
    config_file: Option<PathBuf>,

    /// Load and attach every probe, print what attached, and exit (non-zero if anything failed).
    #[arg(long = "config.check")]
    config_check: bool,

    /// Print the default configuration file and exit.
    #[arg(long = "print-default-config")]
    print_default_config: bool,

    /// Log level: error, warn, info, debug or trace.
    #[arg(long = "log.level", default_value = "info", global = true)]
    log_level: String,

    /// Log format: logfmt or json.
    #[arg(long = "log.format", default_value = "logfmt", global = true)]
    log_format: String,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {}

fn init_logging(level: &str, format: &str) -> anyhow::Result<()> {
    let level = match level {
        "error" | "warn" | "info" | "debug" | "trace" => level,
        other => {
            anyhow::bail!("--log.level: `{other}` is not one of error, warn, info, debug, trace")
        }
    };
    let filter = EnvFilter::try_from_env("SYSSCOPE_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("sysscope={level},warn")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        "logfmt" => builder.init(),
        "json" => builder.json().init(),
        other => anyhow::bail!("--log.format: `{other}` is not one of logfmt, json"),
    }
    Ok(())
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    Ok(match path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(&cli.log_level, &cli.log_format) {
        eprintln!("sysscope: {e:#}");
        return ExitCode::from(2);
    }
    if cli.print_default_config {
        print!(
            "{}",
            toml::to_string_pretty(&Config::default()).expect("default config serializes")
        );
        return ExitCode::SUCCESS;
    }
    let config = match load_config(cli.config_file.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sysscope: {e:#}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        None if cli.config_check => config_check(&config),
        None => run_exporter(&cli, config),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sysscope: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn config_check(config: &Config) -> anyhow::Result<ExitCode> {
    let (agent, _labeler, report) = startup::start(config)?;
    let mut ok = report.failed.is_empty();
    if let Some(probes) = agent.probes() {
        for p in probes.programs() {
            println!(
                "{:<9} {:<24} collector={}",
                if p.attached { "attached" } else { "FAILED" },
                p.program,
                p.collector
            );
            ok &= p.attached;
        }
    }
    for (name, up) in agent.collectors_up() {
        println!("collector {name}: {}", if up { "up" } else { "DOWN" });
    }
    for (name, why) in &report.failed {
        println!("collector {name} failed: {why}");
    }
    println!("configuration OK: {}", if ok { "yes" } else { "no" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_exporter(cli: &Cli, config: Config) -> anyhow::Result<ExitCode> {
    if let Some(path) = &cli.web_config_file {
        anyhow::bail!(
            "--web.config.file {}: TLS and basic auth are not supported by this build yet",
            path.display()
        );
    }
    if !cli.telemetry_path.starts_with('/') {
        anyhow::bail!(
            "--web.telemetry-path `{}` must start with /",
            cli.telemetry_path
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .thread_name("sysscope")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        // Bind first: a busy port is the cheapest failure to report.
        let listener = http::bind(&cli.listen_address).await?;
        let (agent, _labeler, _report) = startup::start(&config)?;
        let agent = Arc::new(std::sync::Mutex::new(agent));
        let scraper = Arc::new(Scraper::new(agent.clone(), config.collection.min_interval));
        let state = Arc::new(AppState {
            scraper: scraper.clone(),
            telemetry_path: cli.telemetry_path.clone(),
            ready: false.into(),
            routes: BTreeMap::new(),
        });

        let background = {
            let scraper = scraper.clone();
            let every = config.collection.background_interval;
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let s = scraper.clone();
                    let _ = tokio::task::spawn_blocking(move || s.refresh()).await;
                }
            })
        };

        // Signal handlers before readiness: a SIGTERM sent as soon as /-/ready answers must
        // shut down gracefully, not kill the process with the default action.
        let shutdown = shutdown_signal();
        state.ready.store(true, Ordering::Relaxed);
        tracing::info!(
            address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            path = %cli.telemetry_path,
            "serving metrics"
        );
        http::serve(listener, state, shutdown, Duration::from_secs(3)).await;
        background.abort();
        // Dropping the agent detaches every program and closes every map.
        drop(scraper);
        if let Ok(agent) = Arc::try_unwrap(agent) {
            drop(agent);
        }
        tracing::info!("stopped; all probes detached");
        Ok::<_, anyhow::Error>(ExitCode::SUCCESS)
    })
}

/// Installs the SIGTERM and SIGINT handlers now; the future resolves on the first signal.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
        }
    }
}
