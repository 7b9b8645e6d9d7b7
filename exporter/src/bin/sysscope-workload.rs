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
//!   slow-pipe-read-timed N MS the same, then prints "read_ns=<n>" per read (its duration as
//!                             measured here) and leaves the pipe open until the process exits
//!   slow-pipe-burst N MS      N threads each block in a read of its own pipe; at least MS ms
//!                             later, early in a second of CLOCK_MONOTONIC (100-400 ms past
//!                             it), all pipes are filled at once: N slow reads ending together
//!                             (the pipes stay open until the process exits)
//!   read-file PATH BYTES BS   read BYTES of PATH in BS-byte read calls (looping over the file)
//!   write-fsync PATH N BS     N writes of BS bytes to PATH, each followed by fsync
//!   loop-getppid SECS THREADS getppid in a loop on THREADS threads for SECS seconds;
//!                             prints "calls=<n> ns_per_call=<x>" (the benchmark's load)
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
        "usage: sysscope-workload STEP [STEP ...]\n  steps: join-cgroup DIR | getppid N | openat-missing N | sleep N MS | slow-pipe-read N MS |\n         slow-pipe-read-timed N MS | slow-pipe-burst N MS |\n         read-file PATH BYTES BS | write-fsync PATH N BS | loop-getppid SECS THREADS | wait-stdin"
    );
    std::process::exit(2)
}

fn num(arg: Option<&String>) -> u64 {
    arg.and_then(|s| s.parse().ok()).unwrap_or_else(|| usage())
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
                slow_pipe_read(n, ms, false);
                i += 3;
            }
            "slow-pipe-read-timed" => {
                let n = num(args.get(i + 1));
                let ms = num(args.get(i + 2));
                slow_pipe_read(n, ms, true);
                i += 3;
            }
            "slow-pipe-burst" => {
                let n = num(args.get(i + 1));
                let ms = num(args.get(i + 2));
                slow_pipe_burst(n, ms);
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
                let secs = num(args.get(i + 1));
                let threads = num(args.get(i + 2)).max(1);
                loop_getppid(Duration::from_secs(secs), threads as usize);
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

/// `timed`: measure each read, print the durations afterwards, and keep the descriptors open
/// (so whoever looks them up in /proc while the process lives still finds them).
fn slow_pipe_read(n: u64, ms: u64, timed: bool) {
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
    // Timing reads the vDSO clock (no syscall); the durations are printed afterwards.
    let mut took = Vec::new();
    for _ in 0..n {
        go_tx.send(()).unwrap();
        let started = Instant::now();
        // SAFETY: reads one byte into a valid buffer; blocks until the writer's byte arrives.
        let r = unsafe { libc::syscall(libc::SYS_read, rd, buf.as_mut_ptr(), 1usize) };
        if timed {
            took.push(started.elapsed());
        }
        assert_eq!(r, 1, "pipe read");
    }
    writer.join().unwrap();
    if timed {
        for t in took {
            println!("read_ns={}", t.as_nanos());
        }
        return;
    }
    // SAFETY: closing descriptors we own.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn slow_pipe_burst(n: u64, ms: u64) {
    let ready = Arc::new(std::sync::Barrier::new(n as usize + 1));
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..n {
        let mut fds = [0i32; 2];
        // SAFETY: fds has room for two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        let (rd, wr) = (fds[0], fds[1]);
        writers.push(wr);
        let ready = ready.clone();
        readers.push(std::thread::spawn(move || {
            let mut buf = [0u8; 1];
            ready.wait();
            // SAFETY: reads one byte into a valid buffer; blocks until the byte arrives.
            let r = unsafe { libc::syscall(libc::SYS_read, rd, buf.as_mut_ptr(), 1usize) };
            assert_eq!(r, 1, "pipe read");
            // The read end stays open until the process exits (for /proc lookups).
        }));
    }
    ready.wait();
    std::thread::sleep(Duration::from_millis(ms));
    // Start the burst 100-400 ms into a second of CLOCK_MONOTONIC, so that all the reads end
    // within one second as the kernel's rate limiter counts them (whole seconds).
    loop {
        let frac = monotonic_ns() % 1_000_000_000;
        if (100_000_000..400_000_000).contains(&frac) {
            break;
        }
        let wait = if frac < 100_000_000 {
            100_000_000 - frac
        } else {
            1_100_000_000 - frac
        };
        std::thread::sleep(Duration::from_nanos(wait));
    }
    for wr in &writers {
        // SAFETY: writes one byte from a valid buffer to our pipe.
        unsafe { libc::write(*wr, b"x".as_ptr().cast(), 1) };
    }
    for r in readers {
        r.join().unwrap();
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

fn loop_getppid(duration: Duration, threads: usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let stop = stop.clone();
            let calls = calls.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        getppid();
                    }
                    n += 1000;
                }
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
    let total = calls.load(Ordering::Relaxed);
    // Per-thread cost: wall time x threads / calls.
    let ns = elapsed.as_nanos() as f64 * threads as f64 / total.max(1) as f64;
    println!("calls={total} ns_per_call={ns:.1} threads={threads}");
}
