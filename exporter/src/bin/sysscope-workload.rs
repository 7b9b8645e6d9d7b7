//! Deterministic syscall workloads with known ground truth, for sysscope's tests and
//! benchmarks. Each step makes exactly the calls it names, through raw syscalls, so a test can
//! compare what sysscope reports with the truth.
//!
//! ```text
//! sysscope-workload STEP [STEP ...]
//!   getppid N                 N getppid calls
//!   openat-missing N          N openat calls that fail with ENOENT
//!   sleep N MS                N nanosleep calls of MS milliseconds
//!   slow-pipe-read N MS       N reads of a pipe that another thread fills MS ms later
//!   read-file PATH BYTES BS   read BYTES of PATH in BS-byte read calls (looping over the file)
//!   write-fsync PATH N BS     N writes of BS bytes to PATH, each followed by fsync
//!   loop-getppid SECS THREADS getppid in a loop on THREADS threads for SECS seconds (fractions
//!                             allowed, as for every SECS below);
//!                             prints "calls=<n> ns_per_call=<x>" (the benchmark's load)
//!   loop-dd SECS THREADS BS   like `dd if=/dev/zero of=/dev/null bs=BS` on THREADS threads for
//!                             SECS seconds (a read and a write per block); prints the same line,
//!                             counting both calls
//!   loop-read-file PATH SECS THREADS BS
//!                             read PATH (page cache) in BS-byte reads on THREADS threads for
//!                             SECS seconds, seeking back at end of file; prints the same line
//!   rate-getppid RATE SECS    about RATE getppid calls per second for SECS seconds (a steady
//!                             background load); prints the same line
//!   wait-stdin                block until stdin is closed or a line is read
//!   join-cgroup DIR           move this process into cgroup DIR (after the dynamic loader ran,
//!                             so only the steps that follow are counted there)
//! ```

use std::{
    ffi::CString,
    io::BufRead,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

fn usage() -> ! {
    eprintln!(
        "usage: sysscope-workload STEP [STEP ...]\n  steps: join-cgroup DIR | getppid N | openat-missing N | sleep N MS | slow-pipe-read N MS |\n         read-file PATH BYTES BS | write-fsync PATH N BS | loop-getppid SECS THREADS |\n         loop-dd SECS THREADS BS | loop-read-file PATH SECS THREADS BS | rate-getppid RATE SECS |\n         wait-stdin"
    );
    std::process::exit(2)
}

fn num(arg: Option<&String>) -> u64 {
    arg.and_then(|s| s.parse().ok()).unwrap_or_else(|| usage())
}

/// A duration in seconds, fractions allowed ("0.5").
fn secs(arg: Option<&String>) -> Duration {
    arg.and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or_else(|| usage())
}

fn getppid() {
    // SAFETY: getppid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_getppid) };
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        usage();
    }
    let mut i = 0;
    while i < args.len() {
        let step = args[i].as_str();
        match step {
            "getppid" => {
                let n = num(args.get(i + 1));
                for _ in 0..n {
                    getppid();
                }
                i += 2;
            }
            "openat-missing" => {
                let n = num(args.get(i + 1));
                let path =
                    CString::new(format!("/nonexistent-sysscope/{}", std::process::id())).unwrap();
                for _ in 0..n {
                    // SAFETY: a valid NUL-terminated path; the call fails with ENOENT.
                    let r = unsafe {
                        libc::syscall(
                            libc::SYS_openat,
                            libc::AT_FDCWD,
                            path.as_ptr(),
                            libc::O_RDONLY,
                        )
                    };
                    assert!(r < 0, "openat of a missing path succeeded");
                }
                i += 2;
            }
            "sleep" => {
                let n = num(args.get(i + 1));
                let ms = num(args.get(i + 2));
                let ts = libc::timespec {
                    tv_sec: (ms / 1000) as libc::time_t,
                    tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
                };
                for _ in 0..n {
                    // SAFETY: valid timespec; a signal interruption would only shorten the sleep.
                    unsafe {
                        libc::syscall(
                            libc::SYS_nanosleep,
                            &ts as *const _,
                            std::ptr::null_mut::<libc::timespec>(),
                        )
                    };
                }
                i += 3;
            }
            "slow-pipe-read" => {
                let n = num(args.get(i + 1));
                let ms = num(args.get(i + 2));
                slow_pipe_read(n, ms);
                i += 3;
            }
            "read-file" => {
                let path = args.get(i + 1).unwrap_or_else(|| usage()).clone();
                let bytes = num(args.get(i + 2));
                let bs = num(args.get(i + 3)).max(1);
                read_file(&path, bytes, bs as usize);
                i += 4;
            }
            "write-fsync" => {
                let path = args.get(i + 1).unwrap_or_else(|| usage()).clone();
                let n = num(args.get(i + 2));
                let bs = num(args.get(i + 3)).max(1);
                write_fsync(&path, n, bs as usize);
                i += 4;
            }
            "loop-getppid" => {
                let duration = secs(args.get(i + 1));
                let threads = num(args.get(i + 2)).max(1);
                loop_getppid(duration, threads as usize);
                i += 3;
            }
            "loop-dd" => {
                let duration = secs(args.get(i + 1));
                let threads = num(args.get(i + 2)).max(1);
                let bs = num(args.get(i + 3)).max(1);
                loop_dd(duration, threads as usize, bs as usize);
                i += 4;
            }
            "loop-read-file" => {
                let path = args.get(i + 1).unwrap_or_else(|| usage()).clone();
                let duration = secs(args.get(i + 2));
                let threads = num(args.get(i + 3)).max(1);
                let bs = num(args.get(i + 4)).max(1);
                loop_read_file(&path, duration, threads as usize, bs as usize);
                i += 5;
            }
            "rate-getppid" => {
                let rate = num(args.get(i + 1)).max(1);
                let duration = secs(args.get(i + 2));
                rate_getppid(rate, duration);
                i += 3;
            }
            "join-cgroup" => {
                let dir = args.get(i + 1).unwrap_or_else(|| usage());
                let procs = std::path::Path::new(dir).join("cgroup.procs");
                std::fs::write(&procs, b"0\n").unwrap_or_else(|e| {
                    eprintln!("join-cgroup {}: {e}", procs.display());
                    std::process::exit(1)
                });
                i += 2;
            }
            "wait-stdin" => {
                let mut line = String::new();
                let _ = std::io::stdin().lock().read_line(&mut line);
                i += 1;
            }
            _ => usage(),
        }
    }
}

fn slow_pipe_read(n: u64, ms: u64) {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    let (rd, wr) = (fds[0], fds[1]);
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        for _ in 0..n {
            if go_rx.recv().is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(ms));
            // SAFETY: writes one byte from a valid buffer to our pipe.
            unsafe { libc::write(wr, b"x".as_ptr().cast(), 1) };
        }
    });
    let mut buf = [0u8; 1];
    for _ in 0..n {
        go_tx.send(()).unwrap();
        // SAFETY: reads one byte into a valid buffer; blocks until the writer's byte arrives.
        let r = unsafe { libc::syscall(libc::SYS_read, rd, buf.as_mut_ptr(), 1usize) };
        assert_eq!(r, 1, "pipe read");
    }
    writer.join().unwrap();
    // SAFETY: closing descriptors we own.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
}

fn read_file(path: &str, bytes: u64, bs: usize) {
    let cpath = CString::new(path).unwrap();
    // SAFETY: valid path; checked below.
    let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY) };
    assert!(fd >= 0, "open {path}");
    let mut buf = vec![0u8; bs];
    let mut left = bytes;
    while left > 0 {
        let want = (left as usize).min(bs);
        // SAFETY: buf holds at least `want` bytes.
        let r = unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), want) };
        if r == 0 {
            // End of file: start over.
            // SAFETY: seeking our own descriptor.
            unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
            continue;
        }
        assert!(r > 0, "read {path}");
        left -= r as u64;
    }
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
}

fn write_fsync(path: &str, n: u64, bs: usize) {
    let cpath = CString::new(path).unwrap();
    // SAFETY: valid path and flags.
    let fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o644,
        )
    };
    assert!(fd >= 0, "open {path}");
    let buf = vec![b'x'; bs];
    for _ in 0..n {
        // SAFETY: buf holds bs bytes.
        let r = unsafe { libc::syscall(libc::SYS_write, fd, buf.as_ptr(), bs) };
        assert_eq!(r as usize, bs, "write {path}");
        // SAFETY: fsync of our descriptor.
        unsafe { libc::syscall(libc::SYS_fsync, fd) };
    }
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
}

/// CPU time this thread has used, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs `batch` on `threads` threads until `duration` has passed and prints the benchmark's
/// line. `make` builds each thread's batch, which makes some calls and returns how many.
///
/// Two costs per call are printed: `ns_per_call` from wall time (wall time x threads / calls)
/// and `cpu_ns_per_call` from the threads' own CPU time, which time spent waiting for a CPU
/// taken by other processes does not inflate.
fn timed_loop<F, B>(duration: Duration, threads: usize, make: F)
where
    F: Fn() -> B,
    B: FnMut() -> u64 + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let cpu_ns = Arc::new(AtomicU64::new(0));
    // Set-up (opening files) happens before the clock starts.
    let batches: Vec<B> = (0..threads).map(|_| make()).collect();
    let start = Instant::now();
    let handles: Vec<_> = batches
        .into_iter()
        .map(|mut batch| {
            let stop = stop.clone();
            let calls = calls.clone();
            let cpu_ns = cpu_ns.clone();
            std::thread::spawn(move || {
                let cpu_start = thread_cpu_ns();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += batch();
                }
                cpu_ns.fetch_add(thread_cpu_ns() - cpu_start, Ordering::Relaxed);
                calls.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();
    let total = calls.load(Ordering::Relaxed).max(1) as f64;
    let ns = elapsed.as_nanos() as f64 * threads as f64 / total;
    let cpu = cpu_ns.load(Ordering::Relaxed) as f64 / total;
    println!(
        "calls={} ns_per_call={ns:.1} threads={threads} cpu_ns_per_call={cpu:.1}",
        total as u64
    );
}

fn loop_getppid(duration: Duration, threads: usize) {
    timed_loop(duration, threads, || {
        || {
            for _ in 0..1000 {
                getppid();
            }
            1000
        }
    });
}

fn open_or_exit(path: &str, flags: i32) -> i32 {
    let cpath = CString::new(path).unwrap();
    // SAFETY: valid NUL-terminated path.
    let fd = unsafe { libc::open(cpath.as_ptr(), flags) };
    if fd < 0 {
        eprintln!("open {path}: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    fd
}

fn loop_dd(duration: Duration, threads: usize, bs: usize) {
    timed_loop(duration, threads, || {
        let zero = open_or_exit("/dev/zero", libc::O_RDONLY);
        let null = open_or_exit("/dev/null", libc::O_WRONLY);
        let mut buf = vec![0u8; bs];
        move || {
            for _ in 0..500 {
                // SAFETY: buf holds bs bytes; both descriptors are ours.
                unsafe {
                    libc::syscall(libc::SYS_read, zero, buf.as_mut_ptr(), bs);
                    libc::syscall(libc::SYS_write, null, buf.as_ptr(), bs);
                }
            }
            1000
        }
    });
}

fn loop_read_file(path: &str, duration: Duration, threads: usize, bs: usize) {
    timed_loop(duration, threads, || {
        let fd = open_or_exit(path, libc::O_RDONLY);
        let mut buf = vec![0u8; bs];
        move || {
            let mut n = 0;
            for _ in 0..256 {
                // SAFETY: buf holds bs bytes; the descriptor is ours.
                let r = unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), bs) };
                n += 1;
                if r <= 0 {
                    // End of file (or an error, which the next read repeats): start over.
                    // SAFETY: seeking our own descriptor.
                    unsafe { libc::syscall(libc::SYS_lseek, fd, 0i64, libc::SEEK_SET) };
                    n += 1;
                }
            }
            n
        }
    });
}

fn rate_getppid(rate: u64, duration: Duration) {
    // Batches of 1/100 s worth of calls, each batch starting on schedule.
    let per_batch = (rate / 100).max(1);
    let tick = Duration::from_millis(10);
    let start = Instant::now();
    let mut next = start;
    let mut total = 0u64;
    while start.elapsed() < duration {
        for _ in 0..per_batch {
            getppid();
        }
        total += per_batch;
        next += tick;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let elapsed = start.elapsed();
    let ns = elapsed.as_nanos() as f64 / total.max(1) as f64;
    println!("calls={total} ns_per_call={ns:.1} threads=1");
}
