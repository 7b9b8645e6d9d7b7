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
//!   loop-getppid SECS THREADS getppid in a loop on THREADS threads for SECS seconds;
//!                             prints "calls=<n> ns_per_call=<x>" (the benchmark's load)
//!   wait-stdin                block until stdin is closed or a line is read
//!   fork-children N K PREFIX  fork N children (64 at a time); child i names itself
//!                             PREFIX<i> (prctl PR_SET_NAME), makes K getppid calls and exits
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
        "usage: sysscope-workload STEP [STEP ...]\n  steps: join-cgroup DIR | getppid N | openat-missing N | sleep N MS | slow-pipe-read N MS |\n         read-file PATH BYTES BS | write-fsync PATH N BS | loop-getppid SECS THREADS | wait-stdin |\n         fork-children N K PREFIX"
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
            "fork-children" => {
                let n = num(args.get(i + 1));
                let k = num(args.get(i + 2));
                let prefix = args.get(i + 3).unwrap_or_else(|| usage()).clone();
                fork_children(n, k, &prefix);
                i += 4;
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

/// Process churn: many short-lived, distinctly named processes with a known number of calls.
fn fork_children(n: u64, k: u64, prefix: &str) {
    const BATCH: u64 = 64;
    let mut started = 0u64;
    while started < n {
        let batch = BATCH.min(n - started);
        for j in 0..batch {
            // The name is prepared before fork: the child makes raw syscalls only.
            let mut name = [0u8; 16];
            let text = format!("{prefix}{}", started + j);
            let len = text.len().min(15);
            name[..len].copy_from_slice(&text.as_bytes()[..len]);
            // SAFETY: the child only makes async-signal-safe raw syscalls and _exits.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                // SAFETY: name is NUL-terminated; getppid and _exit cannot fail.
                unsafe {
                    libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
                    for _ in 0..k {
                        libc::syscall(libc::SYS_getppid);
                    }
                    libc::_exit(0);
                }
            }
        }
        for _ in 0..batch {
            let mut status = 0;
            // SAFETY: waiting for our own children.
            let r = unsafe { libc::wait(&mut status) };
            assert!(r > 0, "wait failed");
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child failed: {status}"
            );
        }
        started += batch;
    }
}
