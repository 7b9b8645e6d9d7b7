//! `sysscope diagnose`: measures a target like `summary` (exact counts from the syscall maps)
//! and, unless `--no-trace`, streams its calls like `trace` to learn what counts cannot tell
//! (bytes per transfer, threads, lock addresses, repeated paths, fsync right after write);
//! then applies the quick pattern guide and the common causes of slow programs (futex
//! dominance and lock amplification, openat/stat storms, read-dominated time, mmap-heavy
//! start-up, epoll idle, sleep loops, open/close churn, fsync per write, tiny or huge
//! transfers, failing calls, CPU-bound work; calls waiting for a CPU, a throttled cgroup,
//! reads blocked on a filesystem, from the split of each call's time and the cgroup's
//! `cpu.stat`) and prints verdicts with their evidence and the suggested fix, most important
//! first.
//!
//! Every threshold is a named constant below, documented in docs/cli.md. A verdict's score is
//! the share of the target's syscall time its syscalls account for (times a weight for
//! patterns that are usually expected, or more specific than another), so the pattern that
//! explains most of the time comes first.

mod features;
mod render;
mod rules;
mod states;

use std::{io::Write, path::PathBuf};

use serde_json::json;

use self::{features::*, render::*, rules::diagnose_with};
use super::{
    measure::{self, Wants},
    open_output, parse_bytes,
    session::{Session, TargetArgs},
    trace::check_buffer_size,
    CliError,
};
use crate::config::Config;

const EXAMPLES: &str = "\
Examples:
  sysscope diagnose -- python3 -c 'import torch'
  sysscope diagnose --pid 1234 --duration 30s
  sysscope diagnose --cgroup /kubepods.slice/kubepods-pod1234.slice -d 1m --json

Verdicts come most important first, each with the numbers behind it and a suggested fix.
The rules and their thresholds are listed in docs/cli.md.";

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct DiagnoseArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,

    /// Write the diagnosis to this file instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Use the counters only: no per-call stream (cheaper, but no bytes per transfer, thread
    /// counts, lock addresses or paths in the evidence).
    #[arg(long)]
    pub(crate) no_trace: bool,

    /// Kernel ring buffer size for the per-call stream.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "16MiB")]
    pub(crate) buffer_size: u64,
}

pub fn run(args: &DiagnoseArgs, config: &Config) -> Result<u8, CliError> {
    measure::preflight()?;
    let ring_bytes = check_buffer_size(args.buffer_size)?;
    let mut out = open_output(args.output.as_ref())?;
    let mut session = Session::new(&args.target, "diagnose", &config.kubernetes)?;
    let mut features = Features::default();
    let wants = Wants {
        profile: true,
        events: !args.no_trace,
        ring_buffer_bytes: ring_bytes,
        block_ring_buffer_bytes: 0,
        quiet: args.target.quiet,
    };
    let m = measure::run(&mut session, config, "diagnose", wants, &mut features)?;
    let target = session.describe();
    let target_json = session.describe_json();
    let code = session.finish();
    let ctx = Context {
        profile: &m.profile,
        features: (!args.no_trace).then_some(&features),
        wall: m.wall,
        cpu: m.cpu,
        throttling: m.throttling,
    };
    let verdicts = diagnose_with(&ctx, states::verdicts(&ctx));
    let text = if args.json {
        let v = json!({
            "target": target_json,
            "wall_seconds": m.wall.as_secs_f64(),
            "stopped": m.stop.as_str(),
            "syscalls": ctx.profile.total_calls(),
            "errors": ctx.profile.total_errors(),
            "syscall_seconds": ctx.profile.total_ns() as f64 / 1e9,
            "threads": ctx.features.map(|f| f.threads.len()),
            "verdicts": verdicts,
            "top_syscalls": top_syscalls(&ctx, 10),
            "dropped": m.drops,
        });
        let mut s = serde_json::to_string_pretty(&v).expect("JSON of plain values");
        s.push('\n');
        s
    } else {
        render_text(&ctx, &verdicts, Some(&m), &target)
    };
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| CliError::io("writing the diagnosis", e))?;
    Ok(code)
}
