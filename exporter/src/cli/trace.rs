//! `sysscope trace`: every syscall of a command, process or cgroup, filtered in the kernel and
//! streamed through the `TRACE_EVENTS` ring buffer, written as Trace Event Format JSON for
//! Perfetto UI / `chrome://tracing` (with the node's CPU utilisation and the target's block
//! I/O as counter tracks, and its block requests as slices, see `cli::block`), or as a
//! `strace -f -T`-like text log with `--text`. Bounded by `--max-events` and `--duration`;
//! what was dropped is counted in the output and on stderr.

use std::{path::PathBuf, time::Duration};

use serde_json::json;

use super::{
    measure::{self, Wants},
    open_output, parse_bytes, parse_duration,
    progress::thousands,
    render::perfetto::{Format, TraceWriter},
    session::{Session, TargetArgs},
    CliError,
};
use crate::config::Config;

const EXAMPLES: &str = "\
Examples:
  sysscope trace -o import.json -- python3 -c 'import numpy'
      then open import.json in https://ui.perfetto.dev (Open trace file) or chrome://tracing
  sysscope trace --text -o - -- ls /tmp           # like `strace -f -T ls /tmp`
  sysscope trace --pid 1234 -d 5s -o app.json     # a running process for 5 seconds
  sysscope trace --cgroup /kubepods.slice/... -d 10s --max-events 200000

Only the target's calls are recorded (the filter runs in the kernel); the rest of the node
pays a cgroup check per syscall while the trace runs, nothing afterwards. Each slice is named
after its syscall and carries its arguments, return value, errno and path argument.

Block I/O of the target (JSON): under the process \"block I/O of the target\", counter
tracks `<device> bytes` and `<device> requests` (cumulative since the start, one series per
op: read, write, flush, discard; sampled every --counter-interval) and one slice per request,
issue to completion, on tracks named after the device (args: bytes, sector, op, latency).
A request is the target's when a task of the target submitted it (direct I/O, reads, fsync
data) or when the kernel charges it to the target cgroup itself (writeback on its behalf,
only where the io controller is on cgroup v2); buffered writes written back by kernel
threads are otherwise not the target's. --text ends with the block totals. Without block
tracepoints the trace runs without these tracks and says why on stderr.";

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct TraceArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Output file; `-` for standard output. Default: sysscope-trace.json (or .txt with --text).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Keep at most this many syscalls, and at most this many block request slices; later
    /// ones are counted as dropped (about 200 bytes of JSON each).
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub(crate) max_events: u64,

    /// Write a `strace -f -T`-like text log instead of JSON.
    #[arg(long)]
    pub text: bool,

    /// Kernel ring buffer size (a power of two, at least one page); records that do not fit
    /// while this tool catches up are counted as dropped.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "16MiB")]
    pub(crate) buffer_size: u64,

    /// Sampling period of the CPU (and GPU) and block I/O counter tracks; 0 for none.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "100ms")]
    pub(crate) counter_interval: Duration,
}

/// Size of the ring buffer of block requests: an eighth of the syscall buffer (one record
/// is 80 bytes and block requests are far rarer than syscalls), at least one page.
pub(crate) fn block_ring_bytes(ring_bytes: u32) -> u32 {
    (ring_bytes / 8).max(measure::page_size())
}

/// Checks `--buffer-size`: the kernel wants a power-of-two multiple of the page size.
pub(crate) fn check_buffer_size(bytes: u64) -> Result<u32, CliError> {
    let page = u64::from(measure::page_size());
    if bytes < page || !bytes.is_power_of_two() || bytes > (1 << 30) {
        return Err(CliError::Usage(format!(
            "--buffer-size {bytes}: must be a power of two between {page} and 1GiB (e.g. 16MiB)"
        )));
    }
    Ok(bytes as u32)
}

pub fn run(args: &TraceArgs, config: &Config) -> Result<u8, CliError> {
    measure::preflight()?;
    let ring_bytes = check_buffer_size(args.buffer_size)?;
    if args.max_events == 0 {
        return Err(CliError::Usage("--max-events must be at least 1".into()));
    }
    let format = if args.text {
        Format::Text
    } else {
        Format::TraceEventJson
    };
    let path = args.output.clone().unwrap_or_else(|| {
        PathBuf::from(if args.text {
            "sysscope-trace.txt"
        } else {
            "sysscope-trace.json"
        })
    });
    let out = open_output(Some(&path))?;
    let mut session = Session::new(&args.target, "trace", &config.kubernetes)?;
    let mut writer = TraceWriter::new(
        out,
        format,
        args.max_events,
        args.counter_interval.as_nanos() as u64,
    )
    .with_gpu(
        config
            .gpu
            .enabled
            .then_some(config.gpu.nvml_library.as_str()),
    );
    let wants = Wants {
        profile: false,
        events: true,
        ring_buffer_bytes: ring_bytes,
        block_ring_buffer_bytes: block_ring_bytes(ring_bytes),
        quiet: args.target.quiet,
    };
    let m = measure::run(&mut session, config, "trace", wants, &mut writer)?;
    let mut other = json!({
        "target": session.describe_json(),
        "wall_seconds": m.wall.as_secs_f64(),
        "stopped": m.stop.as_str(),
        "dropped_ring_buffer_full": m.drops.trace_ring_buffer_full,
    });
    if config.syscalls.time_by_state {
        other["off_cpu_stretches_dropped_ring_buffer_full"] =
            json!(m.drops.off_cpu_ring_buffer_full);
    }
    match &m.block_off {
        Some(why) => other["block_io_off"] = json!(why),
        None => {
            other["block_io_requests_dropped_ring_buffer_full"] =
                json!(m.drops.block_ring_buffer_full)
        }
    }
    let block_summary = writer.block_summary();
    let stats = writer
        .finish(other)
        .map_err(|e| CliError::io(format!("writing {}", path.display()), e))?;
    let code = session.finish();
    let dropped = m.drops.trace_ring_buffer_full + stats.over_limit;
    let to_stdout = path.as_os_str() == "-";
    eprintln!(
        "sysscope trace: {} syscalls written{}{}",
        thousands(stats.written),
        if to_stdout {
            String::new()
        } else {
            format!(" to {}", path.display())
        },
        if dropped > 0 {
            format!(
                "; dropped {} ({} ring buffer full: try a larger --buffer-size; {} over --max-events)",
                thousands(dropped),
                thousands(m.drops.trace_ring_buffer_full),
                thousands(stats.over_limit)
            )
        } else {
            "; nothing dropped".to_string()
        }
    );
    if m.block_off.is_none() {
        let totals = block_summary
            .iter()
            .map(|(dev, op, bytes, requests)| {
                format!(
                    "{dev} {op} {} bytes in {} requests",
                    thousands(*bytes),
                    thousands(*requests)
                )
            })
            .collect::<Vec<_>>();
        let dropped = m.drops.block_ring_buffer_full + stats.block_over_limit;
        eprintln!(
            "sysscope trace: block I/O of the target: {}{}",
            if totals.is_empty() {
                "none".to_string()
            } else {
                totals.join(", ")
            },
            if dropped > 0 {
                format!(
                    "; {} requests not written as slices ({} ring buffer full, {} over --max-events)",
                    thousands(dropped),
                    thousands(m.drops.block_ring_buffer_full),
                    thousands(stats.block_over_limit)
                )
            } else {
                String::new()
            }
        );
    }
    if format == Format::TraceEventJson && config.syscalls.time_by_state {
        let dropped = m.drops.off_cpu_ring_buffer_full + stats.off_cpu_over_limit;
        eprintln!(
            "sysscope trace: {} stretches off CPU inside calls written as slices (blocked, waiting for a CPU){}",
            thousands(stats.off_cpu_written),
            if dropped > 0 {
                format!(
                    "; {} not written ({} ring buffer full: try a larger --buffer-size; {} over --max-events)",
                    thousands(dropped),
                    thousands(m.drops.off_cpu_ring_buffer_full),
                    thousands(stats.off_cpu_over_limit)
                )
            } else {
                String::new()
            }
        );
    }
    if format == Format::TraceEventJson && !to_stdout {
        eprintln!("sysscope trace: open it in https://ui.perfetto.dev (\"Open trace file\") or chrome://tracing");
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_sizes_must_be_powers_of_two() {
        assert_eq!(check_buffer_size(16 << 20).unwrap(), 16 << 20);
        assert!(check_buffer_size(3 << 20).is_err());
        assert!(check_buffer_size(1024).is_err());
        assert!(check_buffer_size(4 << 30).is_err());
    }
}
