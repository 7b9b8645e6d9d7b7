//! Helpers of the benchmarks in `bench/` (not installed with sysscope, not used by the exporter).
//!
//! ```text
//! sysscope-bench attach [--object PATH] [--stats off|sampled|always] [--slow SYSCALL]...
//!                       [--no-paths] [--time-by-state on|off] PROGRAM[=TRACEPOINT] ...
//!     Loads the probes object (the embedded one, or another build of it) and attaches just the
//!     named tracepoint programs (raw or BTF), e.g. `empty_sys_enter empty_sys_exit`, the
//!     calibration floor of the overhead benchmark; `--time-by-state off` loads the syscall
//!     programs with `syscalls.time_by_state = false` (default on, as sysscope's). Prints
//!     `attached` when done, then holds the programs
//!     until stdin is closed, SIGINT or SIGTERM. BPF run-time statistics are left off unless
//!     `--stats` asks for them (as `collection.probe_stats` does for sysscope). `--slow read`
//!     makes every `read` a slow call (threshold 1 ns, no rate limit), whose records (the event
//!     and its file's identity and path, read in the kernel) a thread drains from the ring
//!     buffer as the exporter's reader does, without enriching them: what a slow call costs the
//!     probes. `--no-paths` reads the file's identity but no path
//!     (`slow_calls.resolve_file_paths = false`).
//!
//! sysscope-bench fill --pid PID --entries N
//!     Fills the syscall statistics table of the running exporter PID with N synthetic entries
//!     (this process's tgid, in fresh cgroups it creates, over every named syscall number), so
//!     the scrape benchmark can measure a scrape of many live series. Prints
//!     `ready entries=<n> cgroups=<c>`, then serves commands read from stdin, one per line:
//!       bump      add one call to every entry (so the next read finds them all changed)
//!       time-read time a full read of the table as the collector reads it; prints JSON
//!     and on end of input removes its cgroups and exits (the exporter reclaims the entries).
//! ```

use std::{
    io::{BufRead, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{bail, Context};
use sysscope::{
    config::{Config, ProbeStatsMode},
    kernel::slow_events::SlowEvents,
    kernel::slow_events::SlowThresholds,
    kernel::syscalls::SyscallStatsTable,
    kernel::{LoadOptions, Probes},
    metadata::cgroups,
    syscall_table,
};
use sysscope_abi::{hist, SyscallKey, SyscallStats, MAX_SYSCALL_NR};

fn usage() -> ! {
    eprintln!(
        "usage: sysscope-bench attach [--object PATH] [--stats off|sampled|always] [--slow SYSCALL]... [--no-paths] [--time-by-state on|off] PROGRAM[=TRACEPOINT] ...\n       \
         sysscope-bench fill --pid PID --entries N"
    );
    std::process::exit(2)
}

fn main() -> anyhow::Result<()> {
    if let Some(status) = sysscope::kernel::probe_stats::run_helper_if_asked() {
        std::process::exit(status);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("attach") => attach(&args[1..]),
        Some("fill") => fill(&args[1..]),
        _ => usage(),
    }
}

/// The tracepoint a program attaches to when the command line does not say.
fn default_tracepoint(program: &str) -> Option<&'static str> {
    if program.ends_with("sys_enter") {
        Some("sys_enter")
    } else if program.ends_with("sys_exit") {
        Some("sys_exit")
    } else if program.ends_with("sched_process_exit") {
        Some("sched_process_exit")
    } else if program.ends_with("sched_process_exec") {
        Some("sched_process_exec")
    } else if program.ends_with("sched_switch") {
        Some("sched_switch")
    } else if program.ends_with("sched_wakeup") {
        Some("sched_wakeup")
    } else if program.ends_with("cgroup_attach_task") {
        Some("cgroup_attach_task")
    } else {
        None
    }
}

fn attach(args: &[String]) -> anyhow::Result<()> {
    let mut object: Option<PathBuf> = None;
    let options = LoadOptions::default();
    let mut stats = ProbeStatsMode::Off;
    let mut slow: Vec<String> = Vec::new();
    let mut paths = true;
    let mut time_by_state = true;
    let mut programs = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--slow" {
            slow.push(it.next().unwrap_or_else(|| usage()).clone());
        } else if arg == "--no-paths" {
            paths = false;
        } else if arg == "--time-by-state" {
            time_by_state = match it.next().map(String::as_str) {
                Some("on") => true,
                Some("off") => false,
                _ => usage(),
            };
        } else if arg == "--object" {
            object = Some(it.next().unwrap_or_else(|| usage()).into());
        } else if arg == "--stats" {
            stats = match it.next().map(String::as_str) {
                Some("off") => ProbeStatsMode::Off,
                Some("sampled") => ProbeStatsMode::Sampled,
                Some("always") => ProbeStatsMode::Always,
                _ => usage(),
            };
        } else {
            let (program, tracepoint) = match arg.split_once('=') {
                Some((p, t)) => (p.to_string(), t.to_string()),
                None => {
                    let t = default_tracepoint(arg)
                        .with_context(|| format!("{arg}: name its tracepoint as {arg}=TP"))?;
                    (arg.clone(), t.to_string())
                }
            };
            programs.push((program, tracepoint));
        }
    }
    if programs.is_empty() {
        usage();
    }
    // Parsed without the exporter's validation, which caps the rate at what a node should
    // see: here every call of the syscalls named is to be sampled.
    let mut config: Config = toml::from_str(&format!(
        "[slow_calls]\nmax_events_per_second = {}\nresolve_file_paths = {paths}\n\
         [syscalls]\ntime_by_state = {time_by_state}\n",
        u32::MAX
    ))?;
    config.collection.probe_stats = stats;
    let mut probes = match &object {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            // aya wants the object 8-byte aligned: copy it into u64 storage.
            let mut words = vec![0u64; bytes.len().div_ceil(8)];
            // SAFETY: `words` has at least bytes.len() bytes of storage.
            let aligned = unsafe {
                std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), bytes.len())
            };
            aligned.copy_from_slice(&bytes);
            Probes::load_object(aligned, &config, &options)?
        }
        None => Probes::load(&config, &options)?,
    };
    for (program, tracepoint) in &programs {
        probes.attach_raw_tracepoint("bench", program, tracepoint)?;
    }
    // After the programs are loaded (they hold the maps' descriptors from then on); the
    // thresholds are held until the end.
    let _thresholds = if slow.is_empty() {
        None
    } else {
        Some(sample_every_call(&mut probes, &slow)?)
    };
    println!("attached");
    std::io::stdout().flush()?;
    wait_for_end();
    drop(probes);
    Ok(())
}

/// Makes every call of the syscalls `names` a slow call (threshold 1 ns), and drains their
/// records on a thread of its own: woken by the ring buffer's descriptor, as the exporter's
/// reader is, each record copied out and dropped.
fn sample_every_call(probes: &mut Probes, names: &[String]) -> anyhow::Result<SlowThresholds> {
    let mut thresholds = SlowThresholds::take(probes)?;
    let mut every = vec![0u64; MAX_SYSCALL_NR as usize];
    for name in names {
        let slot = syscall_table::number(name).and_then(|nr| every.get_mut(nr as usize));
        *slot.with_context(|| format!("--slow {name}: no such syscall"))? = 1;
    }
    thresholds.write(&every)?;
    let mut ring = SlowEvents::take(probes)?;
    std::thread::spawn(move || loop {
        let mut poll = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, ours, for the call's duration.
        if unsafe { libc::poll(&mut poll, 1, -1) } < 0 {
            return;
        }
        // Each record copied out and dropped, as the exporter's reader first does.
        ring.by_ref().for_each(drop);
    });
    Ok(thresholds)
}

/// Blocks until stdin reaches its end or SIGINT/SIGTERM arrives.
fn wait_for_end() {
    // SAFETY: a plain sigset manipulated with the libc API; the signals are blocked so the
    // reader thread's end or sigwait decides when to return.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(|| {
            let mut sink = String::new();
            while std::io::stdin().lock().read_line(&mut sink).unwrap_or(0) > 0 {
                sink.clear();
            }
            libc::kill(libc::getpid(), libc::SIGTERM);
        });
        let mut sig = 0;
        libc::sigwait(&set, &mut sig);
    }
}

struct BenchCgroups {
    dir: PathBuf,
    ids: Vec<u64>,
}

impl BenchCgroups {
    fn create(count: usize) -> anyhow::Result<Self> {
        let root = cgroups::v2_mount()?;
        let dir = root.join(format!("sysscope-bench-{}", std::process::id()));
        let mut ids = Vec::with_capacity(count);
        for i in 0..count {
            let d = dir.join(format!("cg{i:04}"));
            std::fs::create_dir_all(&d).with_context(|| format!("mkdir {}", d.display()))?;
            ids.push(cgroups::id_of(&d)?);
        }
        Ok(Self { dir, ids })
    }
}

impl Drop for BenchCgroups {
    fn drop(&mut self) {
        remove_tree(&self.dir);
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn fill(args: &[String]) -> anyhow::Result<()> {
    let mut pid: Option<u32> = None;
    let mut entries: Option<usize> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--pid" => pid = value.parse().ok(),
            "--entries" => entries = value.parse().ok(),
            _ => usage(),
        }
    }
    let (Some(pid), Some(entries)) = (pid, entries) else {
        usage()
    };
    let mut table = SyscallStatsTable::of_process(pid)?;

    let nrs: Vec<u32> = (0..MAX_SYSCALL_NR)
        .filter(|nr| syscall_table::name(*nr).is_some())
        .collect();
    let cgroup_count = entries.div_ceil(nrs.len()).max(1);
    let cgroups = BenchCgroups::create(cgroup_count)?;
    let tgid = std::process::id();
    let keys: Vec<SyscallKey> = (0..entries)
        .map(|i| SyscallKey {
            cgroup_id: cgroups.ids[i / nrs.len()],
            tgid,
            nr: nrs[i % nrs.len()],
            fd: sysscope_abi::FdClass::NONE,
        })
        .collect();
    let mut calls = 1u64;
    let write_all = |table: &mut SyscallStatsTable, calls: u64| -> anyhow::Result<()> {
        let mut on_cpu0 = SyscallStats::ZERO;
        on_cpu0.sum_ns = 700 * calls;
        on_cpu0.buckets[hist::bucket_index(700)] = calls;
        for key in &keys {
            table
                .write(key, &[on_cpu0])
                .with_context(|| format!("writing {key:?}"))?;
        }
        Ok(())
    };
    write_all(&mut table, calls)?;
    println!("ready entries={} cgroups={}", keys.len(), cgroup_count);
    std::io::stdout().flush()?;

    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line?;
        match line.trim() {
            "bump" => {
                calls += 1;
                write_all(&mut table, calls)?;
                println!("bumped calls={calls}");
            }
            "time-read" => {
                let t = Instant::now();
                let n = table.snapshot().entries.len();
                let read = t.elapsed();
                println!(
                    "{{\"entries\":{n},\"read_ms\":{:.3}}}",
                    read.as_secs_f64() * 1e3
                );
            }
            "" => {}
            other => bail!("unknown command `{other}` (expected bump or time-read)"),
        }
        std::io::stdout().flush()?;
    }
    Ok(())
}
