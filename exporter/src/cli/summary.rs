//! `sysscope summary`: the `strace -c -f` table of a command, process or cgroup, counted in the
//! kernel by the syscall probes (no ptrace): % time, seconds, usecs/call, calls, errors per
//! syscall and a total line, sorted by time (or `-S calls|errors|name|avg`), or as JSON; with
//! `--by-state`, a second table splits each syscall's seconds into on CPU, waiting for a CPU
//! and blocked (from `SYSCALL_STATES`, see `ebpf/probes/src/sched.rs`).

use std::{io::Write, path::PathBuf};

use serde_json::json;

use super::{
    measure::{self, Measurement, Wants},
    open_output,
    profile::{Profile, SyscallRow},
    session::{Session, TargetArgs},
    sink::NoEvents,
    CliError,
};
use crate::config::Config;

const EXAMPLES: &str = "\
Examples:
  sysscope summary -- python3 train.py          # like `strace -c -f python3 train.py`
  sysscope summary -S calls -- make -j8         # sorted by number of calls
  sysscope summary --pid 1234 --duration 10s    # a running process, for 10 seconds
  sysscope summary --cgroup /system.slice/nginx.service -d 30s --json
  sysscope summary --by-fd -- python3 train.py  # reads by file system, pipe, socket
  sysscope summary --by-state -- python3 train.py  # on CPU, waiting for a CPU, blocked

The command runs in a fresh cgroup v2 of its own, so its children are counted too, and
`sysscope summary` ends with its exit code. Seconds are wall time spent inside each call
(entry to exit, like `strace -c -w`). With --by-state they are split by where the thread
was: on-cpu (running), wait-cpu (runnable, waiting for a CPU: preempted, or woken and not yet
running; a CPU quota's throttling where the kernel throttles inside calls), blocked (asleep:
I/O, locks, sleeps) and unknown (off CPU with no wakeup seen); the four add up to seconds.
The JSON always carries the split. Needs root, or CAP_BPF + CAP_PERFMON.";

/// Sort order of the table (strace's `-S`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SortKey {
    /// Total time in the call, most first.
    #[default]
    Time,
    /// Number of calls, most first.
    Calls,
    /// Number of failed calls, most first.
    Errors,
    /// Syscall name.
    Name,
    /// Mean time per call, slowest first.
    Avg,
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct SummaryArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Sort the table by this column.
    #[arg(short = 'S', long = "sort", value_enum, default_value_t = SortKey::Time)]
    pub sort: SortKey,

    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Also break the reads and writes (and socket calls) down by what their descriptor was:
    /// a file on which filesystem, a pipe, a socket, a character device.
    #[arg(long)]
    pub by_fd: bool,

    /// Also split each syscall's time into on CPU, waiting for a CPU, blocked and unknown.
    #[arg(long)]
    pub by_state: bool,

    /// Write the summary to this file instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Rows sorted by `key` (ties by name, so the order is stable).
pub fn sorted_rows(profile: &Profile, key: SortKey) -> Vec<&SyscallRow> {
    let mut rows: Vec<&SyscallRow> = profile.rows.values().filter(|r| r.calls > 0).collect();
    rows.sort_by(|a, b| {
        let primary = match key {
            SortKey::Time => b.total_ns.cmp(&a.total_ns),
            SortKey::Calls => b.calls.cmp(&a.calls),
            SortKey::Errors => b.errors.cmp(&a.errors),
            SortKey::Name => std::cmp::Ordering::Equal,
            SortKey::Avg => b.avg_ns().total_cmp(&a.avg_ns()),
        };
        primary.then_with(|| a.name.cmp(&b.name))
    });
    rows
}

fn line(pct: f64, total_ns: u64, calls: u64, errors: u64, name: &str) -> String {
    let usecs = total_ns.checked_div(calls).unwrap_or(0) / 1000;
    let errors = if errors == 0 {
        String::new()
    } else {
        errors.to_string()
    };
    format!(
        "{pct:>6.2} {:>11.6} {usecs:>11} {calls:>9} {errors:>9} {name}",
        total_ns as f64 / 1e9
    )
}

/// The table exactly as `strace -c` lays it out.
pub fn render_table(profile: &Profile, key: SortKey) -> String {
    let total = profile.total_ns();
    let pct = |ns: u64| {
        if total == 0 {
            0.0
        } else {
            ns as f64 * 100.0 / total as f64
        }
    };
    let rule = "------ ----------- ----------- --------- --------- ------------------";
    let mut out = String::new();
    out.push_str("% time     seconds  usecs/call     calls    errors syscall\n");
    out.push_str(rule);
    out.push('\n');
    for r in sorted_rows(profile, key) {
        out.push_str(&line(
            pct(r.total_ns),
            r.total_ns,
            r.calls,
            r.errors,
            &r.name,
        ));
        out.push('\n');
    }
    out.push_str(rule);
    out.push('\n');
    out.push_str(&line(
        if total == 0 { 0.0 } else { 100.0 },
        total,
        profile.total_calls(),
        profile.total_errors(),
        "total",
    ));
    out.push('\n');
    out
}

/// What a breakdown row's descriptor was: `file (ext4)`, `pipe`, ...
fn fd_label(fd: &sysscope_abi::FdClass) -> String {
    let kind = sysscope_abi::fd_class::name(fd.kind).unwrap_or("other");
    if fd.kind == sysscope_abi::fd_class::FILE {
        format!("{kind} ({})", crate::kernel::fd_class::fs_name(fd.fs_magic))
    } else {
        kind.to_string()
    }
}

/// The breakdown rows by time (ties by syscall and descriptor).
fn fd_rows(profile: &Profile) -> Vec<(&sysscope_abi::FdClass, &SyscallRow)> {
    let mut rows: Vec<_> = profile
        .by_fd
        .iter()
        .filter(|(_, r)| r.calls > 0)
        .map(|((_, fd), r)| (fd, r))
        .collect();
    rows.sort_by(|a, b| {
        b.1.total_ns
            .cmp(&a.1.total_ns)
            .then_with(|| a.1.name.cmp(&b.1.name))
            .then_with(|| a.0.cmp(b.0))
    });
    rows
}

/// The reads and writes by descriptor, laid out like the main table; the % is of all syscall
/// time, as in the main table.
pub fn render_fd_table(profile: &Profile) -> String {
    let total = profile.total_ns();
    let rule = "------ ----------- ----------- --------- --------- ------------------";
    let mut out = String::new();
    out.push_str("% time     seconds  usecs/call     calls    errors syscall on\n");
    out.push_str(rule);
    out.push('\n');
    for (fd, r) in fd_rows(profile) {
        let pct = if total == 0 {
            0.0
        } else {
            r.total_ns as f64 * 100.0 / total as f64
        };
        let name = format!("{} on {}", r.name, fd_label(fd));
        out.push_str(&line(pct, r.total_ns, r.calls, r.errors, &name));
        out.push('\n');
    }
    out
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Each syscall's time split by state, in the main table's order: seconds on CPU, waiting for
/// a CPU, blocked and unknown (adding up to the main table's seconds), and the share of its
/// calls that left the CPU.
pub fn render_state_table(profile: &Profile, key: SortKey) -> String {
    let rule =
        "----------- ----------- ----------- ----------- ----------- --------- ------------------";
    let mut out = String::new();
    out.push_str("    seconds      on-cpu    wait-cpu     blocked     unknown %switched syscall\n");
    out.push_str(rule);
    out.push('\n');
    let row = |out: &mut String,
               total: u64,
               on: u64,
               wait: u64,
               blocked: u64,
               unknown: u64,
               switched: f64,
               name: &str| {
        out.push_str(&format!(
            "{:>11.6} {:>11.6} {:>11.6} {:>11.6} {:>11.6} {switched:>9.1} {name}\n",
            seconds(total),
            seconds(on),
            seconds(wait),
            seconds(blocked),
            seconds(unknown),
        ));
    };
    let share = |switched: u64, calls: u64| {
        if calls == 0 {
            0.0
        } else {
            switched as f64 * 100.0 / calls as f64
        }
    };
    let mut sum = SyscallRow::new(0);
    for r in sorted_rows(profile, key) {
        row(
            &mut out,
            r.total_ns,
            r.on_cpu_ns(),
            r.wait_ns,
            r.blocked_ns,
            r.unknown_ns,
            share(r.switched, r.calls),
            &r.name,
        );
        sum.total_ns += r.total_ns;
        sum.wait_ns += r.wait_ns;
        sum.blocked_ns += r.blocked_ns;
        sum.unknown_ns += r.unknown_ns;
        sum.switched += r.switched;
        sum.calls += r.calls;
    }
    out.push_str(rule);
    out.push('\n');
    row(
        &mut out,
        sum.total_ns,
        sum.on_cpu_ns(),
        sum.wait_ns,
        sum.blocked_ns,
        sum.unknown_ns,
        share(sum.switched, sum.calls),
        "total",
    );
    out
}

/// The time split of a row as JSON fields (none when the probes did not split it).
fn state_fields(profile: &Profile, r: &SyscallRow) -> serde_json::Value {
    if !profile.by_state {
        return json!({});
    }
    json!({
        "on_cpu_seconds": seconds(r.on_cpu_ns()),
        "wait_cpu_seconds": seconds(r.wait_ns),
        "blocked_seconds": seconds(r.blocked_ns),
        "unknown_seconds": seconds(r.unknown_ns),
        "switched_calls": r.switched,
    })
}

/// Merges the fields of object `extra` into object `v`.
fn merge(mut v: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
        v.extend(extra);
    }
    v
}

/// The summary as JSON (rows in table order).
pub fn render_json(
    profile: &Profile,
    key: SortKey,
    m: &Measurement,
    target: serde_json::Value,
    exit_code: Option<u8>,
    by_fd: bool,
) -> serde_json::Value {
    let total = profile.total_ns();
    let rows: Vec<_> = sorted_rows(profile, key)
        .into_iter()
        .map(|r| {
            merge(json!({
                "syscall": r.name,
                "nr": r.nr,
                "calls": r.calls,
                "errors": r.errors,
                "errnos": r.errnos,
                "seconds": r.total_ns as f64 / 1e9,
                "usecs_per_call": r.avg_ns() / 1e3,
                "percent_time": if total == 0 { 0.0 } else { r.total_ns as f64 * 100.0 / total as f64 },
                "p50_seconds_at_most": r.quantile_upper_ns(0.5).map(|ns| ns as f64 / 1e9),
                "p99_seconds_at_most": r.quantile_upper_ns(0.99).map(|ns| ns as f64 / 1e9),
            }), state_fields(profile, r))
        })
        .collect();
    let mut v = json!({
        "target": target,
        "wall_seconds": m.wall.as_secs_f64(),
        "stopped": m.stop.as_str(),
        "exit_code": exit_code,
        "processes": profile.processes.len(),
        "syscalls": rows,
        "total": {
            "calls": profile.total_calls(),
            "errors": profile.total_errors(),
            "seconds": total as f64 / 1e9,
        },
        "dropped": m.drops,
    });
    if by_fd {
        v["by_fd"] = fd_rows(profile)
            .into_iter()
            .map(|(fd, r)| {
                merge(
                    json!({
                        "syscall": r.name,
                        "fd_kind": sysscope_abi::fd_class::name(fd.kind),
                        "fs": (fd.kind == sysscope_abi::fd_class::FILE)
                            .then(|| crate::kernel::fd_class::fs_name(fd.fs_magic)),
                        "calls": r.calls,
                        "errors": r.errors,
                        "seconds": r.total_ns as f64 / 1e9,
                    }),
                    state_fields(profile, r),
                )
            })
            .collect::<Vec<_>>()
            .into();
    }
    v
}

pub fn run(args: &SummaryArgs, config: &Config) -> Result<u8, CliError> {
    measure::preflight()?;
    if args.by_state && !config.syscalls.time_by_state {
        return Err(CliError::Usage(
            "--by-state needs syscalls.time_by_state, which the config file turns off".into(),
        ));
    }
    // Fail on an unwritable output before running anything.
    let mut out = open_output(args.output.as_ref())?;
    let mut session = Session::new(&args.target, "summary", &config.kubernetes)?;
    let wants = Wants {
        profile: true,
        events: false,
        ring_buffer_bytes: 0,
        block_ring_buffer_bytes: 0,
        quiet: args.target.quiet,
    };
    let m = measure::run(&mut session, config, "summary", wants, &mut NoEvents)?;
    let target = session.describe_json();
    let is_command = session.child_pid().is_some();
    let code = session.finish();
    let exit_code = is_command.then_some(code);
    let text = if args.json {
        let mut s = serde_json::to_string_pretty(&render_json(
            &m.profile, args.sort, &m, target, exit_code, args.by_fd,
        ))
        .expect("JSON of plain values");
        s.push('\n');
        s
    } else {
        let mut text = render_table(&m.profile, args.sort);
        if args.by_fd {
            text = format!("{text}\n{}", render_fd_table(&m.profile));
        }
        if args.by_state {
            text = format!("{text}\n{}", render_state_table(&m.profile, args.sort));
        }
        text
    };
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| CliError::io("writing the summary", e))?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syscall_table;

    #[test]
    fn table_matches_strace_layout() {
        let p = Profile::from_rows(&[
            ("getppid", 2000, 0, 6_325_000),
            ("openat", 55, 50, 314_000),
            ("fsync", 20, 0, 1_968_000),
        ]);
        let t = render_table(&p, SortKey::Time);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "% time     seconds  usecs/call     calls    errors syscall"
        );
        assert_eq!(
            lines[2],
            " 73.49    0.006325           3      2000           getppid"
        );
        assert_eq!(
            lines[4],
            "  3.65    0.000314           5        55        50 openat"
        );
        assert_eq!(
            lines[6],
            "100.00    0.008607           4      2075        50 total"
        );
        assert_eq!(lines.len(), 7);
    }

    #[test]
    fn sort_keys() {
        let p = Profile::from_rows(&[
            ("read", 10, 0, 1000),
            ("write", 5, 3, 5000),
            ("close", 20, 1, 100),
        ]);
        let names = |k| {
            sorted_rows(&p, k)
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(SortKey::Time), ["write", "read", "close"]);
        assert_eq!(names(SortKey::Calls), ["close", "read", "write"]);
        assert_eq!(names(SortKey::Errors), ["write", "close", "read"]);
        assert_eq!(names(SortKey::Name), ["close", "read", "write"]);
        assert_eq!(names(SortKey::Avg), ["write", "read", "close"]);
    }

    #[test]
    fn state_table_splits_each_row_and_the_total() {
        let mut p =
            Profile::from_rows(&[("read", 10, 0, 3_000_000), ("nanosleep", 2, 0, 10_000_000)]);
        p.by_state = true;
        let read = syscall_table::number("read").unwrap();
        let sleep = syscall_table::number("nanosleep").unwrap();
        let parts = |wait_ns, blocked_ns, switched| sysscope_abi::StateStats {
            wait_ns,
            blocked_ns,
            unknown_ns: 0,
            switched,
        };
        p.add_states(read, sysscope_abi::FdClass::NONE, &parts(2_000_000, 0, 5));
        p.add_states(
            sleep,
            sysscope_abi::FdClass::NONE,
            &parts(1000, 9_990_000, 2),
        );
        let t = render_state_table(&p, SortKey::Time);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "    seconds      on-cpu    wait-cpu     blocked     unknown %switched syscall"
        );
        assert_eq!(
            lines[2],
            "   0.010000    0.000009    0.000001    0.009990    0.000000     100.0 nanosleep"
        );
        assert_eq!(
            lines[3],
            "   0.003000    0.001000    0.002000    0.000000    0.000000      50.0 read"
        );
        assert_eq!(
            lines[5],
            "   0.013000    0.001009    0.002001    0.009990    0.000000      58.3 total"
        );
        let row = &p.rows[&read];
        let v = state_fields(&p, row);
        assert_eq!(v["on_cpu_seconds"], 0.001);
        assert_eq!(v["switched_calls"], 5);
        p.by_state = false;
        assert_eq!(state_fields(&p, row), json!({}));
    }
}
