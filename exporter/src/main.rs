//! The `sysscope` binary: the exporter (default) and the command-line tools.

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::{atomic::Ordering, Arc},
};

use clap::{Parser, Subcommand};
use sysscope::{
    cli,
    config::{CollectorFlags, Config},
    exposition::web_config::WebConfigFile,
    privileges,
    serve::{self, ServeOptions},
    startup,
    util::{error::Chain, logfmt::Logfmt},
};
use tracing_subscriber::EnvFilter;

/// Always-on eBPF syscall, block-I/O, CPU and GPU metrics for every cgroup and process.
///
/// Run as root (or with CAP_BPF and CAP_PERFMON, which is all it needs) and scrape
/// http://127.0.0.1:9812/metrics. The subcommands answer what strace -c, strace -f -T and
/// bpftrace are used for, for one command, process or cgroup (see `sysscope help summary`).
#[derive(Debug, Parser)]
#[command(name = "sysscope", version, long_version = sysscope::build_info::LONG_VERSION, about, long_about = None)]
struct Cli {
    /// Address to serve metrics on: host:port, or :port for every IPv4 and IPv6 address.
    /// Loopback by default: expose it deliberately.
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

    #[command(flatten)]
    collectors: CollectorFlags,

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
    /// Wait until a file exists (an init container's wait, e.g. for the NVIDIA toolkit).
    WaitForFile(cli::wait_for_file::WaitForFileArgs),
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
    // Every TLS client and server of the process uses ring (the only provider built in):
    // reqwest's clients take the process's provider unless given a configuration.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    // Needs no configuration: an init container mounts none.
    if let Some(Command::WaitForFile(args)) = &cli.command {
        return ExitCode::from(cli::wait_for_file::run(args));
    }
    let config = match load_config(cli.config_file.as_ref()) {
        Ok(mut c) => {
            c.apply_collector_flags(&cli.collectors);
            c
        }
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
            let options = ServeOptions {
                listen_address: cli.listen_address.clone(),
                telemetry_path: cli.telemetry_path.clone(),
                config_file: cli.config_file.clone(),
                collector_flags: cli.collectors.clone(),
            };
            return exit(
                serve::run_exporter(&options, config, web, shutdown_signal)
                    .map(|()| ExitCode::SUCCESS)
                    .map_err(anyhow::Error::from),
            );
        }
        Some(Command::Summary(args)) => ("summary", cli::summary::run(args, &config)),
        Some(Command::Trace(args)) => ("trace", cli::trace::run(args, &config)),
        Some(Command::Diagnose(args)) => ("diagnose", cli::diagnose::run(args, &config)),
        Some(Command::Top(args)) => ("top", cli::top::run(args, &config)),
        Some(Command::Completions { .. } | Command::Man | Command::WaitForFile(_)) => {
            unreachable!("answered above")
        }
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
    // What this process holds now is what the exporter would hold when it drops.
    let held = privileges::held();
    let kept = privileges::kept_for(config, held);
    if kept.is_empty() {
        println!("capabilities kept after start-up: none");
    }
    for (cap, why) in kept {
        println!("capability kept after start-up: {cap:<20} for {why}");
    }
    println!(
        "slow-call file names: from the kernel; /proc fallback {}",
        privileges::proc_fallback(config, held).describe()
    );
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
#[path = "../tests/support/doc_commands.rs"]
mod doc_commands;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use clap::{error::ErrorKind, Parser};

    use super::{doc_commands, Cli};

    fn top() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
    }

    /// README.md and docs/*.md: each one's path, its name from the top of the repository, and
    /// its text.
    fn documents() -> Vec<(PathBuf, String, String)> {
        doc_commands::documents(top())
            .into_iter()
            .map(|doc| {
                let name = doc
                    .strip_prefix(top())
                    .unwrap_or(&doc)
                    .display()
                    .to_string();
                let text = std::fs::read_to_string(&doc).unwrap();
                (doc, name, text)
            })
            .collect()
    }

    /// Every `sysscope ...` command line of README.md and docs/*.md parses: each flag exists
    /// and takes what it is given.
    #[test]
    fn documented_command_lines_parse() {
        let mut checked = 0;
        let mut wrong = Vec::new();
        for (_, name, text) in documents() {
            for line in doc_commands::command_lines(&name, &text) {
                checked += 1;
                if let Err(e) = Cli::try_parse_from(&line.args) {
                    if !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                        let why = e.to_string();
                        let why = why.lines().next().unwrap_or_default();
                        wrong.push(format!("{}: `{}`: {why}", line.at, line.args.join(" ")));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert!(checked > 50, "only {checked} command lines found");
    }

    /// Every link of README.md and docs/*.md to a file of the repository names a file that
    /// exists, and every anchor a heading of that file.
    #[test]
    fn documented_links_resolve() {
        let mut wrong = Vec::new();
        for (doc, name, text) in documents() {
            for link in doc_commands::local_links(&name, &text) {
                let (file, anchor) = match link.target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (link.target.as_str(), None),
                };
                let path = if file.is_empty() {
                    doc.clone()
                } else {
                    doc.parent().unwrap().join(file)
                };
                if !path.exists() {
                    wrong.push(format!("{}: {} does not exist", link.at, link.target));
                    continue;
                }
                if let Some(anchor) = anchor {
                    let target = std::fs::read_to_string(&path).unwrap_or_default();
                    if !doc_commands::anchors(&target).iter().any(|a| a == anchor) {
                        wrong.push(format!("{}: {} has no such heading", link.at, link.target));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
