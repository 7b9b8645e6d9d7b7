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
    cli,
    config::Config,
    exposition::{
        http::{self, AppState},
        otlp,
        scrape::Scraper,
        web_config::WebConfigFile,
    },
    privileges, reload, spans, startup,
    util::error::Chain,
};
use tracing_subscriber::EnvFilter;

/// Always-on eBPF syscall, block-I/O, CPU and GPU metrics for every cgroup and process.
///
/// Run as root (or with CAP_BPF, CAP_PERFMON and CAP_DAC_READ_SEARCH) and scrape
/// http://127.0.0.1:9812/metrics. The subcommands answer what strace -c, strace -f -T and
/// bpftrace are used for, for one command, process or cgroup (see `sysscope help summary`).
#[derive(Debug, Parser)]
#[command(name = "sysscope", version, long_version = sysscope::build_info::LONG_VERSION, about, long_about = None)]
struct Cli {
    /// Address to serve metrics on (host:port). Loopback by default: expose it deliberately.
    // The web flags only concern the exporter: not global, so the tools' help stays short.
    #[arg(long = "web.listen-address", default_value = "127.0.0.1:9812")]
    listen_address: String,

    /// Path under which metrics are served.
    #[arg(long = "web.telemetry-path", default_value = "/metrics")]
    telemetry_path: String,

    /// TLS and basic-auth configuration (Prometheus exporter-toolkit format).
    #[arg(long = "web.config.file")]
    web_config_file: Option<PathBuf>,

    /// Configuration file (TOML); see `--print-default-config`. OTEL_* environment variables,
    /// when set, win over its [otlp] section.
    #[arg(long = "config.file", global = true)]
    config_file: Option<PathBuf>,

    /// The kernel's BTF from this file instead of /sys/kernel/btf/vmlinux (a container that does
    /// not see /sys/kernel/btf, or BTF shipped as a file). The kernel itself must have BTF.
    #[arg(long = "btf.path", global = true, value_name = "FILE")]
    btf_path: Option<PathBuf>,

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
enum Command {
    /// Count syscalls of a command, process or cgroup: the `strace -c -f` table, from eBPF.
    Summary(cli::summary::SummaryArgs),
    /// Record every syscall of a target as a Perfetto / chrome://tracing timeline (or text).
    Trace(cli::trace::TraceArgs),
    /// Measure a target and name its syscall patterns (lock contention, stat storms, ...).
    Diagnose(cli::diagnose::DiagnoseArgs),
    /// Live view of the busiest cgroups or processes by syscall time.
    Top(cli::top::TopArgs),
    /// Print the shell completion script for SHELL (e.g. `source <(sysscope completions bash)`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), as packages install it: `sysscope man | man -l -`.
    #[command(hide = true)]
    Man,
}

/// Answers `completions` and `man`, which need neither logging nor a configuration.
fn print_generated(command: Option<&Command>) -> Option<std::io::Result<()>> {
    use clap::CommandFactory;
    let mut out = std::io::stdout().lock();
    match command? {
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "sysscope", &mut out);
            Some(Ok(()))
        }
        Command::Man => Some(clap_mangen::Man::new(Cli::command()).render(&mut out)),
        _ => None,
    }
}

fn init_logging(level: &str, format: &str) -> anyhow::Result<()> {
    let level = match level {
        "error" | "warn" | "info" | "debug" | "trace" => level,
        other => {
            anyhow::bail!("--log.level: `{other}` is not one of error, warn, info, debug, trace")
        }
    };
    // opentelemetry-otlp logs every failed export; sysscope logs outages once and counts them.
    let filter = EnvFilter::try_from_env("SYSSCOPE_LOG").unwrap_or_else(|_| {
        EnvFilter::new(format!("sysscope={level},opentelemetry-otlp=error,warn"))
    });
    // Neither format has colours: escape codes would garble files, journald and kubectl logs.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr);
    match format {
        "logfmt" => builder.event_format(Logfmt).init(),
        "json" => builder.json().init(),
        other => anyhow::bail!("--log.format: `{other}` is not one of logfmt, json"),
    }
    Ok(())
}

/// logfmt lines: `ts=<RFC 3339> level=info target=<module> msg="..." key=value ...`, the
/// fields of the event's spans (outermost first) after its own.
struct Logfmt;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Logfmt
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::time::FormatTime;
        let meta = event.metadata();
        let mut ts = String::new();
        tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut ts))?;
        let mut fields = LogfmtFields::default();
        event.record(&mut fields);
        write!(
            writer,
            "ts={ts} level={} target={}",
            meta.level().as_str().to_ascii_lowercase(),
            logfmt_value(meta.target())
        )?;
        write!(writer, " msg={}", logfmt_value(&fields.message))?;
        for (key, value) in &fields.pairs {
            write!(writer, " {key}={}", logfmt_value(value))?;
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(formatted) = span
                    .extensions()
                    .get::<tracing_subscriber::fmt::FormattedFields<N>>()
                {
                    if !formatted.is_empty() {
                        write!(writer, " span={}", logfmt_value(span.name()))?;
                        write!(writer, " span_fields={}", logfmt_value(formatted))?;
                    }
                }
            }
        }
        writeln!(writer)
    }
}

/// An event's message and other fields, as text.
#[derive(Default)]
struct LogfmtFields {
    message: String,
    pairs: Vec<(&'static str, String)>,
}

impl tracing::field::Visit for LogfmtFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.pairs.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.pairs.push((field.name(), text));
        }
    }
}

/// A logfmt value: bare when it is a plain token, else quoted with `\`, `"` and control
/// characters escaped.
fn logfmt_value(value: &str) -> std::borrow::Cow<'_, str> {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c == ' ' || c == '=' || c == '"' || c == '\\' || c.is_control());
    if plain {
        return value.into();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out.into()
}

/// glibc gives each thread that allocates its own arena (up to 8 per core) and keeps freed
/// memory in each: maps are read on whichever blocking thread is free, so resident memory
/// would creep up arena by arena under churn. Two arenas keep it flat (docs/operations.md);
/// an explicit MALLOC_ARENA_MAX still wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: called first thing in main, before any other thread exists.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    }
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    Ok(match path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    })
}

/// Set when SIGTERM or SIGINT arrives before the runtime's handlers are installed.
static EARLY_SHUTDOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn note_early_shutdown(_signal: libc::c_int) {
    EARLY_SHUTDOWN.store(true, Ordering::SeqCst);
}

/// Catches SIGTERM and SIGINT from the first instant: start-up (loading and attaching the
/// probes) takes a while, and a pod deleted meanwhile must still stop cleanly, with status 0,
/// instead of dying by the default action. The runtime's handlers take over later
/// ([`shutdown_signal`]) and honour a signal noted here.
fn catch_early_shutdown(install: bool) {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe); the sigaction
        // struct is fully initialised.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = if install {
                note_early_shutdown as extern "C" fn(libc::c_int) as libc::sighandler_t
            } else {
                libc::SIG_DFL
            };
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
    // SIGHUP reloads the configuration once the exporter runs; one that arrives while it
    // starts must not kill it (the default action), and there is nothing to reload yet.
    // SAFETY: as above.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = if install {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGHUP, &action, std::ptr::null_mut());
    }
}

fn main() -> ExitCode {
    catch_early_shutdown(true);
    limit_malloc_arenas();
    if let Some(status) = sysscope::kernel::probe_stats::run_helper_if_asked() {
        return ExitCode::from(status as u8);
    }
    let cli = Cli::parse();
    if let Some(printed) = print_generated(cli.command.as_ref()) {
        return match printed {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sysscope: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cli.command.is_some() || cli.config_check || cli.print_default_config {
        // The tools keep the default actions (Ctrl-C stops them), as a signal noted meanwhile.
        catch_early_shutdown(false);
        if EARLY_SHUTDOWN.load(Ordering::SeqCst) {
            return ExitCode::from(130);
        }
    }
    if let Err(e) = init_logging(&cli.log_level, &cli.log_format) {
        eprintln!("sysscope: {e:#}");
        return ExitCode::from(2);
    }
    if cli.print_default_config {
        print!("{}", sysscope::config::default_config_toml());
        return ExitCode::SUCCESS;
    }
    let config = match load_config(cli.config_file.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sysscope: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &cli.btf_path {
        if let Err(e) = sysscope::kernel::btf::use_kernel_btf_file(path) {
            eprintln!("sysscope: --btf.path: {}", Chain(&e));
            return ExitCode::from(2);
        }
    }
    let tool = match &cli.command {
        None if cli.config_check => return exit(config_check(&config)),
        None => {
            // Validated before anything is loaded, so a bad file costs nothing.
            let web = match cli.web_config_file.as_ref().map(|p| WebConfigFile::load(p)) {
                None => None,
                Some(Ok(w)) => Some(Arc::new(w)),
                Some(Err(e)) => {
                    eprintln!("sysscope: --web.config.file: {e}");
                    return ExitCode::from(2);
                }
            };
            return exit(run_exporter(&cli, config, web));
        }
        Some(Command::Summary(args)) => ("summary", cli::summary::run(args, &config)),
        Some(Command::Trace(args)) => ("trace", cli::trace::run(args, &config)),
        Some(Command::Diagnose(args)) => ("diagnose", cli::diagnose::run(args, &config)),
        Some(Command::Top(args)) => ("top", cli::top::run(args, &config)),
        Some(Command::Completions { .. } | Command::Man) => unreachable!("answered above"),
    };
    match tool {
        (_, Ok(code)) => ExitCode::from(code),
        (name, Err(e)) => {
            eprintln!("sysscope {name}: {}", Chain(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

fn exit(result: anyhow::Result<ExitCode>) -> ExitCode {
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
    let kept = privileges::kept_for(config);
    if kept.is_empty() {
        println!("capabilities kept after start-up: none");
    }
    for (cap, why) in kept {
        println!("capability kept after start-up: {cap:<20} for {why}");
    }
    if config.collection.probe_stats == sysscope::config::ProbeStatsMode::Sampled {
        println!(
            "capability kept by the statistics helper process: CAP_SYS_ADMIN for BPF_ENABLE_STATS (collection.probe_stats = \"sampled\")"
        );
    }
    println!("configuration OK: {}", if ok { "yes" } else { "no" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_exporter(
    cli: &Cli,
    config: Config,
    web: Option<Arc<WebConfigFile>>,
) -> anyhow::Result<ExitCode> {
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
    let outcome = runtime.block_on(async move {
        // Bind first: a busy port is the cheapest failure to report.
        let listener = http::bind(&cli.listen_address).await?;
        let otlp_settings =
            otlp::config::Settings::from_env(&config.otlp, config.kubernetes.node_name.as_deref())?;
        let (mut agent, labeler, mut report) = startup::start(&config)?;
        // Slow-call spans (and their self-metrics), before the agent is shared.
        let otlp_stats = Arc::new(otlp::Stats::new(agent.self_metrics()));
        let slow_calls = spans::SlowCalls::start(
            &config,
            &otlp_settings,
            labeler,
            report.slow_events.take(),
            otlp_stats.clone(),
        )?;
        otlp_stats.register(
            agent.self_metrics(),
            slow_calls.sinks().otlp.is_some(),
            otlp_settings.metrics.is_some(),
        );
        // Everything is attached and the span reader runs: give up what running does not
        // need (see privileges.rs); threads started later inherit the reduced set.
        match privileges::drop_after_start(&config) {
            Ok(r) => tracing::info!(
                kept = ?privileges::cap_names(r.kept),
                bounding_set_reduced = r.bounding_set_reduced,
                threads = r.threads,
                "dropped capabilities"
            ),
            // Running on with capabilities it promised to give up would be worse than not
            // running: the operator learns why and the supervisor restarts it.
            Err(e) => {
                return Err(anyhow::Error::new(e).context(
                    "could not drop the capabilities sysscope does not need after start-up",
                ))
            }
        }
        let reload_stats = Arc::new(reload::ReloadStats::new());
        reload_stats.register(agent.self_metrics());
        let agent = Arc::new(std::sync::Mutex::new(agent));
        let reloader = Arc::new(reload::Reloader::new(
            cli.config_file.clone(),
            config.clone(),
            agent.clone(),
            reload_stats,
        ));
        let scraper = Arc::new(Scraper::new(agent.clone(), config.collection.min_interval));
        scraper.set_openmetrics_annotator(slow_calls.annotator());
        let mut routes = BTreeMap::new();
        let (slow_calls_path, slow_calls_route) = slow_calls.route();
        routes.insert(
            slow_calls_path,
            http::cached(slow_calls_route, Duration::from_secs(1)),
        );
        let state = Arc::new(AppState {
            scraper: scraper.clone(),
            telemetry_path: cli.telemetry_path.clone(),
            ready: false.into(),
            routes,
            reload: Some({
                let reloader = reloader.clone();
                Arc::new(move || {
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
                })
            }),
        });
        let metric_push = match &otlp_settings.metrics {
            Some(settings) => Some(otlp::metrics::MetricPush::start(
                otlp::metrics::PushOptions {
                    settings: settings.clone(),
                    resource: otlp_settings.resource.clone(),
                    interval: otlp_settings.metric_interval,
                    export_timeout: otlp_settings.metric_export_timeout,
                    started: std::time::SystemTime::now(),
                },
                scraper.clone(),
                otlp_stats.clone(),
                Some(tokio::runtime::Handle::current()),
            )?),
            None => None,
        };

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

        // SIGHUP reloads the configuration, as it does for Prometheus.
        let hangups = {
            use tokio::signal::unix::{signal, SignalKind};
            let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
            let reloader = reloader.clone();
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP received, reloading the configuration");
                    let r = reloader.clone();
                    let _ = tokio::task::spawn_blocking(move || r.reload()).await;
                }
            })
        };
        // Handlers first: a SIGTERM right after the first ready answer must not kill the
        // process with the default action before the server loop polls its shutdown future.
        let shutdown = shutdown_signal();
        state.ready.store(true, Ordering::Relaxed);
        tracing::info!(
            address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            path = %cli.telemetry_path,
            tls = web.as_ref().is_some_and(|w| w.tls().is_some()),
            basic_auth = web
                .as_ref()
                .is_some_and(|w| w.current().is_ok_and(|c| c.basic_auth.is_some())),
            "serving metrics"
        );
        http::serve_with(listener, state, web, shutdown, Duration::from_secs(3)).await;
        background.abort();
        hangups.abort();
        // Send what is queued (bounded). The exporters block: on this worker, made a blocking
        // thread for the time, not in the blocking pool, where it would queue behind scrapes
        // still waiting for the agent.
        tokio::task::block_in_place(move || {
            if let Some(push) = metric_push {
                push.shutdown(Duration::from_secs(1));
            }
            slow_calls.shutdown(Duration::from_secs(2));
        });
        // Dropping the agent detaches every program and closes every map.
        drop(scraper);
        if let Ok(agent) = Arc::try_unwrap(agent) {
            drop(agent);
        }
        tracing::info!("stopped; all probes detached");
        Ok::<_, anyhow::Error>(ExitCode::SUCCESS)
    });
    // Scrapes still queued for the agent when the server stopped are not waited for: their
    // clients are gone, and a stop must not take as long as the queue.
    runtime.shutdown_timeout(Duration::from_secs(1));
    outcome
}

/// Installs the SIGTERM and SIGINT handlers now; the future resolves on either signal.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        // Read after the handlers above replaced the early one: no signal falls in between.
        if EARLY_SHUTDOWN.load(Ordering::SeqCst) {
            tracing::info!("stop signal received during start-up, shutting down");
            return;
        }
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::logfmt_value;

    #[test]
    fn logfmt_values_are_bare_or_quoted_and_escaped() {
        assert_eq!(logfmt_value("info"), "info");
        assert_eq!(logfmt_value("127.0.0.1:9812"), "127.0.0.1:9812");
        assert_eq!(logfmt_value(""), "\"\"");
        assert_eq!(logfmt_value("serving metrics"), "\"serving metrics\"");
        assert_eq!(logfmt_value("a=b"), "\"a=b\"");
        assert_eq!(
            logfmt_value("say \"hi\"\\\n\u{1b}"),
            "\"say \\\"hi\\\"\\\\\\n\\u{1b}\""
        );
    }
}
