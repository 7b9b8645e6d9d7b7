//! Deterministic syscall workloads with known ground truth, for sysscope's tests and
//! benchmarks. Each step makes exactly the calls it names, through raw syscalls, so a test can
//! compare what sysscope reports with the truth.
//!
//! `sysscope-workload STEP [STEP ...]` runs the steps in order; `STEPS` lists them with their
//! arguments and what each does (`sysscope-workload` without arguments prints that list).

use std::{
    ffi::CString,
    io::{BufRead, Write},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

fn getppid() {
    // SAFETY: getppid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_getppid) };
}

/// One-byte reads of a regular file (`nfile`, the file must hold that many bytes), and
/// one-byte writes then reads of a pipe (`npipe`) and of a UNIX socket pair (`nsocket`): each
/// a `read` or `write` on a descriptor of a known kind.
fn fd_kinds(path: &str, [nfile, npipe, nsocket]: [u64; 3]) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    let mut byte = [0u8; 1];
    let read_one = |fd: i32, byte: &mut [u8; 1]| {
        // SAFETY: a one-byte buffer we own, and a descriptor this function holds open.
        let r = unsafe { libc::read(fd, byte.as_mut_ptr().cast(), 1) };
        assert_eq!(r, 1, "read: {}", std::io::Error::last_os_error());
    };
    let write_one = |fd: i32, byte: &[u8; 1]| {
        // SAFETY: as for the read.
        let r = unsafe { libc::write(fd, byte.as_ptr().cast(), 1) };
        assert_eq!(r, 1, "write: {}", std::io::Error::last_os_error());
    };
    for _ in 0..nfile {
        read_one(file.as_raw_fd(), &mut byte);
    }
    let mut pipe = [0i32; 2];
    // SAFETY: a two-descriptor array, as pipe(2) wants.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let mut socket = [0i32; 2];
    // SAFETY: as for the pipe.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, socket.as_mut_ptr()) };
    assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
    for ([reader, writer], n) in [(pipe, npipe), ([socket[0], socket[1]], nsocket)] {
        for _ in 0..n {
            write_one(writer, &byte);
            read_one(reader, &mut byte);
        }
        // SAFETY: descriptors this function opened and no longer uses.
        unsafe {
            libc::close(reader);
            libc::close(writer);
        }
    }
}

/// One step: its name, its arguments, what it does, and how it runs.
struct Step {
    name: &'static str,
    args: &'static str,
    help: &'static str,
    run: fn(&StepArgs),
}

/// Every step. The usage text and the dispatch are made from this table alone.
const STEPS: &[Step] = &[
    Step {
        name: "getppid",
        args: "N",
        help: "N getppid calls",
        run: |a| {
            for _ in 0..a.num(0) {
                getppid();
            }
        },
    },
    Step {
        name: "openat-missing",
        args: "N",
        help: "N openat calls that fail with ENOENT",
        run: |a| openat_missing(a.num(0)),
    },
    Step {
        name: "sleep",
        args: "N MS",
        help: "N nanosleep calls of MS milliseconds; prints slept_ns=<time slept> on stderr \
               (a loaded machine oversleeps)",
        run: |a| {
            let ms = a.num(1);
            let slept: Duration = (0..a.num(0)).map(|_| nanosleep_ms(ms)).sum();
            eprintln!("slept_ns={}", slept.as_nanos());
        },
    },
    Step {
        name: "sleep-migrating",
        args: "N MS",
        help: "N nanosleep calls of MS ms on a thread pinned to CPU 0, which another thread \
               moves to CPU 1 once it sleeps: every call is switched out on one CPU and returns \
               on the other; prints slept_ns=<time slept> and migrated=<calls that returned on \
               CPU 1> on stderr",
        run: |a| sleep_migrating(a.num(0), a.num(1)),
    },
    Step {
        name: "slow-pipe-read",
        args: "N MS",
        help: "N reads of a pipe that another thread fills MS ms after the read has blocked (so \
               each read lasts at least MS ms)",
        run: |a| slow_pipe_read(a.num(0), a.num(1), false),
    },
    Step {
        name: "slow-pipe-read-timed",
        args: "N MS",
        help: "the same, then prints \"read_ns=<n>\" per read (its duration as measured here) \
               and leaves the pipe open until the process exits",
        run: |a| slow_pipe_read(a.num(0), a.num(1), true),
    },
    Step {
        name: "contended-pipe-read",
        args: "N MS",
        help: "N one-byte reads of a pipe that another process (forked, on another CPU, \
               watching without sleeping) fills MS ms (0: at once) after each read has blocked; \
               around each read the thread's run delay (/proc/thread-self/schedstat, field 2) is \
               read with pread, and their sum over the reads is printed as \"run_delay_ns=<n>\" \
               with \"reads=<n>\" (pin the reader beside busy loops first to make it wait for \
               its CPU)",
        run: |a| contended_pipe_read(a.num(0), a.num(1)),
    },
    Step {
        name: "pipe-reads-then-exit",
        args: "N MS",
        help: "N reads of a pipe, each filled by a forked child MS ms after the read has blocked; \
               prints \"pipe_ino=<inode> pipe_dev=<maj>:<min>\" (fstat) before the reads and \
               exits right after the last one",
        run: |a| pipe_reads_then_exit(a.num(0), a.num(1)),
    },
    Step {
        name: "fifo-read",
        args: "PATH",
        help: "opens the FIFO PATH (read-write, so no writer is waited for), prints \
               \"fifo_fd=<fd>\", makes one one-byte read (whoever writes the FIFO ends it) and \
               exits at once",
        run: |a| fifo_read(a.str(0)),
    },
    Step {
        name: "fifo-slow-read",
        args: "PATH MS HOLD_MS",
        help: "opens the FIFO PATH (read-write), prints \"fifo_fd=<fd>\", makes one one-byte read \
               filled by a thread MS ms after it has blocked, then keeps the descriptor open \
               HOLD_MS ms before closing it",
        run: |a| fifo_slow_read(a.str(0), a.num(1), a.num(2)),
    },
    Step {
        name: "reused-fd-reads",
        args: "FIFO MS",
        help: "a slow read of a pipe, then the same descriptor number reopened on the FIFO and a \
               slow read of it, each filled by a thread MS ms after the read has blocked; prints \
               \"fd=<n>\", \"first_ino=<inode>\" and \"second_ino=<inode>\" before the reads they \
               describe, and exits right after the second",
        run: |a| reused_fd_reads(a.str(0), a.num(1)),
    },
    Step {
        name: "slow-pipe-burst",
        args: "N MS",
        help: "N threads each block in a read of its own pipe; at least MS ms after all have \
               blocked, early in a second of CLOCK_MONOTONIC (100-400 ms past it), all pipes are \
               filled at once: N slow reads ending together (the pipes stay open until the \
               process exits)",
        run: |a| slow_pipe_burst(a.num(0), a.num(1)),
    },
    Step {
        name: "fd-kinds",
        args: "PATH NFILE NPIPE NSOCKET",
        help: "NFILE one-byte reads of PATH (which must hold that many bytes), then NPIPE and \
               NSOCKET one-byte writes and reads of a pipe and of a UNIX socket pair",
        run: |a| fd_kinds(a.str(0), [a.num(1), a.num(2), a.num(3)]),
    },
    Step {
        name: "read-file",
        args: "PATH BYTES BS",
        help: "read BYTES of PATH in BS-byte read calls (looping over the file)",
        run: |a| read_file(a.str(0), a.num(1), a.num(2).max(1) as usize),
    },
    Step {
        name: "read-loop",
        args: "PATH SECS BS",
        help: "read PATH in BS-byte calls, over and over, for SECS (whole) seconds",
        run: |a| {
            let duration = Duration::from_secs(a.num(1));
            read_loop(a.str(0), duration, a.num(2).max(1) as usize);
        },
    },
    Step {
        name: "write-fsync",
        args: "PATH N BS",
        help: "N writes of BS bytes to PATH, each followed by fsync",
        run: |a| write_fsync(a.str(0), a.num(1), a.num(2).max(1) as usize),
    },
    Step {
        name: "loop-getppid",
        args: "SECS THREADS",
        help: "getppid in a loop on THREADS threads for SECS seconds (fractions allowed, as for \
               every SECS below); prints \"calls=<n> ns_per_call=<x>\" (the benchmark's load)",
        run: |a| loop_getppid(a.secs(0), a.num(1).max(1) as usize),
    },
    Step {
        name: "loop-pingpong",
        args: "SECS PAIRS",
        help: "PAIRS pairs of threads pass one byte back and forth over two pipes for SECS \
               seconds, both threads of pair i on CPU i: every read blocks and switches to the \
               other thread (the context-switch path of the probes); prints the same line, \
               counting reads and writes, with the process's CPU time",
        run: |a| loop_pingpong(a.secs(0), a.num(1).max(1) as usize),
    },
    Step {
        name: "loop-pingpong-procs",
        args: "SECS PAIRS",
        help: "the same between two processes (the echo is a forked child, so every switch also \
               changes the address space): what a context switch between two programs costs; \
               the CPU time printed is both processes'",
        run: |a| loop_pingpong_procs(a.secs(0), a.num(1).max(1) as usize),
    },
    Step {
        name: "loop-dd",
        args: "SECS THREADS BS",
        help: "like `dd if=/dev/zero of=/dev/null bs=BS` on THREADS threads for SECS seconds (a \
               read and a write per block); prints the same line, counting both calls",
        run: |a| {
            loop_dd(
                a.secs(0),
                a.num(1).max(1) as usize,
                a.num(2).max(1) as usize,
            )
        },
    },
    Step {
        name: "loop-read-file",
        args: "PATH SECS THREADS BS",
        help: "read PATH (page cache) in BS-byte reads on THREADS threads for SECS seconds, \
               seeking back at end of file; prints the same line",
        run: |a| {
            let (threads, bs) = (a.num(2).max(1) as usize, a.num(3).max(1) as usize);
            loop_read_file(a.str(0), a.secs(1), threads, bs);
        },
    },
    Step {
        name: "rate-getppid",
        args: "RATE SECS",
        help: "about RATE getppid calls per second for SECS seconds (a steady background load); \
               prints the same line",
        run: |a| rate_getppid(a.num(0).max(1), a.secs(1)),
    },
    Step {
        name: "join-cgroup",
        args: "DIR",
        help: "move this process into cgroup DIR (after the dynamic loader ran, so only the \
               steps that follow are counted there)",
        run: |a| join_cgroup(a.str(0)),
    },
    Step {
        name: "stat",
        args: "PATH N",
        help: "N newfstatat calls on PATH (a metadata storm)",
        run: |a| stat_storm(a.str(0), a.num(1)),
    },
    Step {
        name: "open-close",
        args: "PATH N",
        help: "N openat + close pairs on PATH (open/close churn)",
        run: |a| open_close(a.str(0), a.num(1)),
    },
    Step {
        name: "mmap",
        args: "N KB",
        help: "N anonymous mmap + mprotect + munmap of KB KiB (at least 4)",
        run: |a| mmap_churn(a.num(0), a.num(1).max(4) as usize * 1024),
    },
    Step {
        name: "epoll-wait",
        args: "N MS",
        help: "N epoll_wait calls (epoll_pwait on arm64, which lacks epoll_wait) with an MS ms \
               timeout on an empty epoll set",
        run: |a| epoll_idle(a.num(0), a.num(1) as i32),
    },
    Step {
        name: "futex-contention",
        args: "THREADS N",
        help: "THREADS threads (at least 2) each take a shared mutex N times, holding it \
               briefly while the others wait in futex",
        run: |a| futex_contention(a.num(0).max(2) as usize, a.num(1)),
    },
    Step {
        name: "small-writes",
        args: "PATH N BS",
        help: "N writes of BS bytes to PATH (one open, one close)",
        run: |a| small_writes(a.str(0), a.num(1), a.num(2).max(1) as usize),
    },
    Step {
        name: "getppid-threads",
        args: "T N",
        help: "T threads each make N getppid calls (T x N in all)",
        run: |a| getppid_threads(a.num(0).max(1), a.num(1)),
    },
    Step {
        name: "pin-cpu",
        args: "N",
        help: "run the following steps on CPU N only (sched_setaffinity)",
        run: |a| pin_cpu(a.num(0) as usize),
    },
    Step {
        name: "sched-batch",
        args: "",
        help: "run the following steps as SCHED_BATCH: woken, the thread does not preempt the \
               one running, so it waits for its CPU",
        run: |_| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: a valid sched_param for this process.
            let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
            assert_eq!(r, 0, "sched_setscheduler(SCHED_BATCH)");
        },
    },
    Step {
        name: "spin",
        args: "MS",
        help: "compute in user space, without syscalls, for MS ms of wall time",
        run: |a| spin(Duration::from_millis(a.num(0))),
    },
    Step {
        name: "fork-children",
        args: "N K PREFIX",
        help: "fork N children (64 at a time); child i names itself PREFIX<i> (prctl \
               PR_SET_NAME), makes K getppid calls and exits",
        run: |a| fork_children(a.num(0), a.num(1), a.str(2)),
    },
    Step {
        name: "hold-children",
        args: "N K",
        help: "fork N children that each make K calls of a few distinct syscalls and stay alive \
               until a line arrives on stdin; prints ready once they all made their calls",
        run: |a| hold_children(a.num(0), a.num(1)),
    },
    Step {
        name: "set-name",
        args: "NAME",
        help: "set this process's name (comm, the first 15 bytes) to NAME, whatever it holds",
        run: |a| set_name(a.str(0)),
    },
    Step {
        name: "invalid-syscalls",
        args: "FIRST COUNT",
        help: "call the COUNT syscall numbers from FIRST, which the kernel does not implement \
               (each returns ENOSYS)",
        run: |a| invalid_syscalls(a.num(0), a.num(1)),
    },
    Step {
        name: "seccomp-getppid",
        args: "N",
        help: "install a seccomp filter (this process and its children, from then on) that fails \
               getppid with EPERM, then N getppid calls, each failing so",
        run: |a| seccomp_getppid(a.num(0)),
    },
    Step {
        name: "pause-interrupted",
        args: "N",
        help: "N pause calls, each ended by a SIGALRM (ualarm, 10 ms) whose handler was installed \
               without SA_RESTART: each pause fails with EINTR",
        run: |a| pause_interrupted(a.num(0)),
    },
    Step {
        name: "spin-errno-register",
        args: "MS",
        help: "spin MS ms in user space with -22 (-EINVAL) held in the syscall return register \
               while a 1 ms interval timer signals the process (empty handler): every \
               rt_sigreturn restores that value; prints signals=<handled> on stderr",
        run: |a| spin_errno_register(a.num(0)),
    },
    Step {
        name: "wait-stdin",
        args: "",
        help: "block until stdin is closed or a line is read",
        run: |_| {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        },
    },
];

fn usage() -> ! {
    let mut text = String::from("usage: sysscope-workload STEP [STEP ...]\nsteps:\n");
    for step in STEPS {
        let call = format!("{} {}", step.name, step.args);
        text.push_str(&format!("  {:<36} {}\n", call.trim_end(), step.help));
    }
    eprint!("{text}");
    std::process::exit(2)
}

/// The arguments of one step.
struct StepArgs<'a>(&'a [String]);

impl StepArgs<'_> {
    fn str(&self, i: usize) -> &str {
        &self.0[i]
    }

    fn num(&self, i: usize) -> u64 {
        self.0[i].parse().unwrap_or_else(|_| usage())
    }

    /// A duration in seconds, fractions allowed ("0.5").
    fn secs(&self, i: usize) -> Duration {
        self.0[i]
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or_else(|| usage())
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        usage();
    }
    let mut i = 0;
    while i < args.len() {
        let step = STEPS
            .iter()
            .find(|s| s.name == args[i])
            .unwrap_or_else(|| usage());
        let n = step.args.split_whitespace().count();
        let Some(step_args) = args.get(i + 1..i + 1 + n) else {
            usage()
        };
        (step.run)(&StepArgs(step_args));
        i += 1 + n;
    }
}

fn openat_missing(n: u64) {
    let path = CString::new(format!("/nonexistent-sysscope/{}", std::process::id())).unwrap();
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
}

fn join_cgroup(dir: &str) {
    let procs = std::path::Path::new(dir).join("cgroup.procs");
    std::fs::write(&procs, b"0\n").unwrap_or_else(|e| {
        eprintln!("join-cgroup {}: {e}", procs.display());
        std::process::exit(1)
    });
}

fn getppid_threads(threads: u64, n: u64) {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                for _ in 0..n {
                    getppid();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// The process name the kernel reports (comm), whatever it holds: tests give it hostile
/// values. The kernel keeps the first 15 bytes.
fn set_name(name: &str) {
    let mut bytes = [0u8; 16];
    let len = name.len().min(15);
    bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
    // SAFETY: a NUL-terminated 16-byte buffer, as PR_SET_NAME reads.
    unsafe { libc::prctl(libc::PR_SET_NAME, bytes.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

fn invalid_syscalls(first: u64, count: u64) {
    for nr in first..first + count {
        // SAFETY: a number the kernel does not implement: it returns ENOSYS and touches
        // nothing.
        let r = unsafe { libc::syscall(nr as libc::c_long) };
        assert!(r < 0, "syscall({nr}) exists");
    }
}

/// One `nanosleep` syscall of `ms` ms; returns the time it took as the caller saw it.
fn nanosleep_ms(ms: u64) -> Duration {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    let t = Instant::now();
    // SAFETY: valid timespec; a signal interruption would only shorten the sleep.
    unsafe {
        libc::syscall(
            libc::SYS_nanosleep,
            &ts as *const _,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
    t.elapsed()
}

/// Sets the CPUs thread `tid` (0: the caller) may run on to `cpu` alone.
fn set_affinity(tid: libc::pid_t, cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays within it (checked above).
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn sleep_migrating(n: u64, ms: u64) {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel::<libc::pid_t>();
    let (asleep_tx, asleep_rx) = std::sync::mpsc::channel::<()>();
    let sleeper = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        let (mut slept, mut migrated) = (Duration::ZERO, 0u64);
        for _ in 0..n {
            set_affinity(0, 0).expect("pin the sleeper to CPU 0");
            asleep_tx.send(()).unwrap();
            slept += nanosleep_ms(ms);
            // SAFETY: sched_getcpu has no preconditions.
            if unsafe { libc::sched_getcpu() } == 1 {
                migrated += 1;
            }
        }
        eprintln!("slept_ns={}", slept.as_nanos());
        eprintln!("migrated={migrated}");
    });
    let tid = tid_rx.recv().unwrap();
    for _ in 0..n {
        asleep_rx.recv().unwrap();
        // Moved as soon as it sleeps (on CPU 0), not a fixed time after it was told to: a
        // mover scheduled late must not miss the sleep.
        wait_until_blocked_in(tid, &format!("{} ", libc::SYS_nanosleep));
        set_affinity(tid, 1).expect("move the sleeper to CPU 1");
    }
    sleeper.join().unwrap();
}

fn pin_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays within it for
    // cpu < CPU_SETSIZE, checked first.
    let r = unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            usage();
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        eprintln!("pin-cpu {cpu}: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
}

/// Busy user-space work: the clock is read through the vDSO, so no syscall is made.
fn spin(d: Duration) {
    let start = Instant::now();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while start.elapsed() < d {
        for _ in 0..10_000 {
            x = x.rotate_left(7) ^ x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        }
        std::hint::black_box(x);
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
    let reader = gettid();
    let writer = std::thread::spawn(move || {
        for _ in 0..n {
            if go_rx.recv().is_err() {
                return;
            }
            wait_until_blocked_in_read(reader, rd);
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

/// This thread's id (the main thread's is the process id).
fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Waits until thread `tid` of this process is blocked in `read(fd, ...)`. A delay started
/// only then makes the read last at least the delay, however late a loaded machine schedules
/// the reader into its call.
fn wait_until_blocked_in_read(tid: libc::pid_t, fd: i32) {
    wait_until_blocked_in(tid, &format!("{} {:#x} ", libc::SYS_read, fd));
}

/// Waits until /proc/self/task/TID/syscall starts with `prefix` ("<nr> <arg0 in hex> ...",
/// what it shows while the thread is blocked in a syscall), for at most 10 s. The file is read
/// with pread, so the waiting adds no `read` calls (the calls the tests sample). Without the
/// file (a kernel built without it), returns at once.
fn wait_until_blocked_in(tid: libc::pid_t, prefix: &str) {
    wait_until_blocked_in_path(&format!("/proc/self/task/{tid}/syscall"), prefix, false);
}

/// [`wait_until_blocked_in`] for the thread whose syscall file is `path`; `busy`: poll
/// without sleeping in between (a feeder with a CPU of its own, answering within µs).
fn wait_until_blocked_in_path(path: &str, prefix: &str, busy: bool) {
    use std::os::unix::fs::FileExt;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 128];
    // Opened once and read again from its start: each read at offset 0 shows the thread's
    // syscall then, without an open and close per look counted in the watcher's cgroup.
    let Ok(file) = std::fs::File::open(path) else {
        return;
    };
    while Instant::now() < deadline {
        let Ok(len) = file.read_at(&mut buf, 0) else {
            return;
        };
        if buf[..len].starts_with(prefix.as_bytes()) {
            return;
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The run delay of the calling thread so far (field 2 of its schedstat, in ns), read with
/// pread from `file` (/proc/thread-self/schedstat, opened once).
fn run_delay_ns(file: &std::fs::File) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 96];
    let len = file.read_at(&mut buf, 0).expect("read schedstat");
    std::str::from_utf8(&buf[..len])
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .expect("schedstat has a run delay")
}

/// The reader of `contended-pipe-read`: this thread reads, a forked process on another CPU
/// writes each byte `ms` ms after the read blocked (it watches /proc/<pid>/task/<tid>/syscall).
fn contended_pipe_read(n: u64, ms: u64) {
    let (rd, wr) = pipe_pair();
    // SAFETY: getpid has no preconditions.
    let (pid, tid) = (unsafe { libc::getpid() }, gettid());
    // SAFETY: sched_getcpu has no preconditions.
    let here = unsafe { libc::sched_getcpu() }.max(0) as usize;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: this process has one thread here; the child only runs the feeder loop, which
    // makes raw syscalls and exits with _exit.
    let feeder = unsafe { libc::fork() };
    assert!(feeder >= 0, "fork");
    if feeder == 0 {
        if cpus > 1 {
            let _ = set_affinity(0, if here == cpus - 1 { 0 } else { cpus - 1 });
        }
        // The feeder keeps pace whatever the reader was made (SCHED_BATCH, niced) and whatever
        // else runs on its CPU: only the reader is to wait for its CPU. So it takes the
        // highest nice it may (-20 as root: other processes on its CPU, such as a loaded test
        // machine's, would otherwise hold it off for milliseconds while the reader sits
        // blocked), else the default.
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a valid sched_param for this process; setpriority takes plain integers.
        unsafe {
            libc::sched_setscheduler(0, libc::SCHED_OTHER, &param);
            if libc::setpriority(libc::PRIO_PROCESS, 0, -20) != 0 {
                libc::setpriority(libc::PRIO_PROCESS, 0, 0);
            }
        }
        let prefix = format!("{} {:#x} ", libc::SYS_read, rd);
        for _ in 0..n {
            wait_until_blocked_in_path(&format!("/proc/{pid}/task/{tid}/syscall"), &prefix, true);
            if ms > 0 {
                nanosleep_ms(ms);
            }
            // SAFETY: writes one byte from a valid buffer to the pipe.
            unsafe { libc::write(wr, b"x".as_ptr().cast(), 1) };
        }
        // SAFETY: ends the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    let stat = std::fs::File::open("/proc/thread-self/schedstat").expect("open schedstat");
    let mut buf = [0u8; 1];
    let mut delay = 0u64;
    for _ in 0..n {
        let before = run_delay_ns(&stat);
        // SAFETY: reads one byte into a valid buffer; blocks until the feeder's byte arrives.
        let r = unsafe { libc::syscall(libc::SYS_read, rd, buf.as_mut_ptr(), 1usize) };
        let after = run_delay_ns(&stat);
        assert_eq!(r, 1, "pipe read");
        delay += after - before;
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(feeder, &mut status, 0) };
    println!("run_delay_ns={delay}");
    println!("reads={n}");
}

/// Clock `clock` now, in ns.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn slow_pipe_burst(n: u64, ms: u64) {
    let ready = Arc::new(std::sync::Barrier::new(n as usize + 1));
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..n {
        let mut fds = [0i32; 2];
        // SAFETY: fds has room for two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        let (rd, wr) = (fds[0], fds[1]);
        writers.push(wr);
        let ready = ready.clone();
        let tid = tid_tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut buf = [0u8; 1];
            tid.send((gettid(), rd)).unwrap();
            ready.wait();
            // SAFETY: reads one byte into a valid buffer; blocks until the byte arrives.
            let r = unsafe { libc::syscall(libc::SYS_read, rd, buf.as_mut_ptr(), 1usize) };
            assert_eq!(r, 1, "pipe read");
            // The read end stays open until the process exits (for /proc lookups).
        }));
    }
    ready.wait();
    for (tid, rd) in tid_rx.iter().take(n as usize) {
        wait_until_blocked_in_read(tid, rd);
    }
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

fn read_loop(path: &str, duration: Duration, bs: usize) {
    let cpath = CString::new(path).unwrap();
    // SAFETY: valid path; checked below.
    let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY) };
    assert!(fd >= 0, "open {path}");
    let mut buf = vec![0u8; bs];
    let start = Instant::now();
    while start.elapsed() < duration {
        // SAFETY: buf holds bs bytes.
        let r = unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), bs) };
        if r == 0 {
            // SAFETY: seeking our own descriptor.
            unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
        }
        assert!(r >= 0, "read {path}");
    }
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
}

fn write_fsync(path: &str, n: u64, bs: usize) {
    write_loop(path, n, bs, true);
}

/// `n` writes of `bs` bytes to a fresh `path`, each followed by an fsync if `fsync`.
fn write_loop(path: &str, n: u64, bs: usize, fsync: bool) {
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
        if fsync {
            // SAFETY: fsync of our descriptor.
            unsafe { libc::syscall(libc::SYS_fsync, fd) };
        }
    }
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
}

/// CPU time this thread has used, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
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

/// CPU time of the whole process (every thread) in ns.
fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn pipe_pair() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    (fds[0], fds[1])
}

/// Pairs of threads bouncing a byte over two pipes until `duration` has passed; prints the
/// benchmark's line. The CPU time is the process's: the echoing thread's share is part of the
/// cost of each exchange.
fn loop_pingpong(duration: Duration, pairs: usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    let cpu_start = process_cpu_ns();
    let start = Instant::now();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for pair in 0..pairs {
        let cpu = pair % cpus;
        let (ping_rd, ping_wr) = pipe_pair();
        let (pong_rd, pong_wr) = pipe_pair();
        // The echo: reads a byte and sends it back, until the pinger closes its end.
        threads.push(std::thread::spawn(move || {
            pin_cpu(cpu);
            let mut buf = [0u8; 1];
            // SAFETY: one-byte reads and writes of valid buffers on our pipes.
            while unsafe { libc::read(ping_rd, buf.as_mut_ptr().cast(), 1) } == 1 {
                // SAFETY: as above.
                unsafe { libc::write(pong_wr, buf.as_ptr().cast(), 1) };
            }
            // SAFETY: closing descriptors this thread owns.
            unsafe {
                libc::close(ping_rd);
                libc::close(pong_wr);
            }
        }));
        let stop = stop.clone();
        let calls = calls.clone();
        threads.push(std::thread::spawn(move || {
            ping(cpu, ping_wr, pong_rd, &stop, &calls)
        }));
    }
    let elapsed = run_pingers(duration, &stop, threads, start);
    let cpu = process_cpu_ns() - cpu_start;
    print_pingpong(&calls, elapsed, pairs, cpu);
}

/// The pinger of a pair, on `cpu`: sends a byte on `ping_wr` and waits for it on `pong_rd`
/// until `stop`, then adds its calls to `calls` (four a round: its write and read, the echo's
/// read and write) and closes its ends, which ends the echo.
fn ping(cpu: usize, ping_wr: i32, pong_rd: i32, stop: &AtomicBool, calls: &AtomicU64) {
    pin_cpu(cpu);
    let mut buf = [0u8; 1];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: one-byte writes and reads of valid buffers on our pipes.
        unsafe {
            libc::write(ping_wr, b"x".as_ptr().cast(), 1);
            libc::read(pong_rd, buf.as_mut_ptr().cast(), 1);
        }
        n += 4;
    }
    calls.fetch_add(n, Ordering::Relaxed);
    // SAFETY: closing descriptors this thread owns; the echo then reads end of file.
    unsafe {
        libc::close(ping_wr);
        libc::close(pong_rd);
    }
}

/// Lets the pingers run for `duration`, stops and joins them; the time since `start`.
fn run_pingers(
    duration: Duration,
    stop: &AtomicBool,
    threads: Vec<std::thread::JoinHandle<()>>,
    start: Instant,
) -> Duration {
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    start.elapsed()
}

/// The ping-pong benchmark's line: calls, wall time and CPU time per call.
fn print_pingpong(calls: &AtomicU64, elapsed: Duration, pairs: usize, cpu_ns: u64) {
    let total = calls.load(Ordering::Relaxed).max(1) as f64;
    println!(
        "calls={} ns_per_call={:.1} threads={pairs} cpu_ns_per_call={:.1}",
        total as u64,
        elapsed.as_nanos() as f64 * (2 * pairs) as f64 / total,
        cpu_ns as f64 / total
    );
}

/// `loop-pingpong-procs`: as [`loop_pingpong`], each pair's echo a forked process.
fn loop_pingpong_procs(duration: Duration, pairs: usize) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut echoes = Vec::new();
    let mut pingers = Vec::new();
    for pair in 0..pairs {
        let cpu = pair % cpus;
        let (ping_rd, ping_wr) = pipe_pair();
        let (pong_rd, pong_wr) = pipe_pair();
        // SAFETY: forked before any thread of this step starts; the child makes raw syscalls
        // on its pipes and leaves with _exit.
        let echo = unsafe { libc::fork() };
        assert!(echo >= 0, "fork");
        if echo == 0 {
            pin_cpu(cpu);
            let mut buf = [0u8; 1];
            // SAFETY: one-byte reads and writes of valid buffers on our pipes; the pinger
            // closing its end ends the loop.
            unsafe {
                libc::close(ping_wr);
                libc::close(pong_rd);
                while libc::read(ping_rd, buf.as_mut_ptr().cast(), 1) == 1 {
                    libc::write(pong_wr, buf.as_ptr().cast(), 1);
                }
                libc::_exit(0);
            }
        }
        // SAFETY: the echo's ends, which this process does not use.
        unsafe {
            libc::close(ping_rd);
            libc::close(pong_wr);
        }
        echoes.push(echo);
        pingers.push((cpu, ping_wr, pong_rd));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let cpu_start = process_cpu_ns();
    let start = Instant::now();
    let threads: Vec<_> = pingers
        .into_iter()
        .map(|(cpu, ping_wr, pong_rd)| {
            let stop = stop.clone();
            let calls = calls.clone();
            std::thread::spawn(move || ping(cpu, ping_wr, pong_rd, &stop, &calls))
        })
        .collect();
    let elapsed = run_pingers(duration, &stop, threads, start);
    let mut children_ns = 0u64;
    for echo in echoes {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our own child.
        unsafe { libc::wait4(echo, &mut status, 0, &mut usage) };
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        children_ns += tv(usage.ru_utime) + tv(usage.ru_stime);
    }
    let cpu = process_cpu_ns() - cpu_start + children_ns;
    print_pingpong(&calls, elapsed, pairs, cpu);
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

fn stat_storm(path: &str, n: u64) {
    let cpath = CString::new(path).unwrap();
    // SAFETY: an all-zero stat buffer is valid to pass for the kernel to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    for _ in 0..n {
        // SAFETY: valid path and buffer.
        let r = unsafe {
            libc::syscall(
                libc::SYS_newfstatat,
                libc::AT_FDCWD,
                cpath.as_ptr(),
                &mut st as *mut libc::stat,
                0,
            )
        };
        assert_eq!(r, 0, "stat {path}");
    }
}

fn open_close(path: &str, n: u64) {
    let cpath = CString::new(path).unwrap();
    for _ in 0..n {
        // SAFETY: valid path; the descriptor is closed right after.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat,
                libc::AT_FDCWD,
                cpath.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0, "open {path}");
        // SAFETY: closing the descriptor just opened.
        unsafe { libc::syscall(libc::SYS_close, fd) };
    }
}

fn mmap_churn(n: u64, len: usize) {
    for _ in 0..n {
        // SAFETY: an anonymous private mapping, made read-only, then unmapped; never touched.
        unsafe {
            let p = libc::syscall(
                libc::SYS_mmap,
                std::ptr::null_mut::<libc::c_void>(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert!(p != -1, "mmap");
            libc::syscall(libc::SYS_mprotect, p, len, libc::PROT_READ);
            libc::syscall(libc::SYS_munmap, p, len);
        }
    }
}

fn epoll_idle(n: u64, ms: i32) {
    // SAFETY: epoll_create1 has no pointer arguments.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0, "epoll_create1");
    // SAFETY: an all-zero epoll_event is valid.
    let mut events: [libc::epoll_event; 4] = unsafe { std::mem::zeroed() };
    for _ in 0..n {
        // arm64 has no epoll_wait, only epoll_pwait (a null signal mask makes it the same call).
        #[cfg(not(target_arch = "aarch64"))]
        // SAFETY: valid epoll fd and buffer; nothing is registered, so it times out.
        unsafe {
            libc::syscall(libc::SYS_epoll_wait, ep, events.as_mut_ptr(), 4, ms);
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above; a null signal mask (its size is still checked) is allowed.
        unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait,
                ep,
                events.as_mut_ptr(),
                4,
                ms,
                std::ptr::null::<libc::sigset_t>(),
                8,
            );
        }
    }
    // SAFETY: closing our descriptor.
    unsafe { libc::close(ep) };
}

fn futex_contention(threads: usize, n: u64) {
    let lock = Arc::new(std::sync::Mutex::new(0u64));
    let start = Arc::new(std::sync::Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let lock = lock.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..n {
                    let mut guard = lock.lock().unwrap();
                    // Hold the lock for a few microseconds of work so the others must wait.
                    let mut x = *guard;
                    for k in 0..2000u64 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(k),
                        );
                    }
                    *guard = x;
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

fn small_writes(path: &str, n: u64, bs: usize) {
    write_loop(path, n, bs, false);
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

/// Syscalls with no arguments that matter and no effect, distinct on every architecture:
/// what `hold-children` makes each child call.
const DISTINCT_CALLS: [libc::c_long; 10] = [
    libc::SYS_getpid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_gettid,
    libc::SYS_getpgid,
    libc::SYS_getsid,
    libc::SYS_sched_yield,
    libc::SYS_getppid,
];

/// Forks `n` children that each make `k` calls of every one of [`DISTINCT_CALLS`] and then stay
/// alive, holding their (process, syscall) keys, until a line arrives on standard input. Prints
/// `ready` once every child has made its calls.
fn hold_children(n: u64, k: u64) {
    let mut done = [0i32; 2];
    let mut release = [0i32; 2];
    // SAFETY: arrays of two descriptors, as pipe(2) wants.
    let done_ok = unsafe { libc::pipe(done.as_mut_ptr()) } == 0;
    // SAFETY: as above.
    let release_ok = unsafe { libc::pipe(release.as_mut_ptr()) } == 0;
    assert!(done_ok && release_ok);
    let mut pids = Vec::with_capacity(n as usize);
    for _ in 0..n {
        // SAFETY: the child makes raw syscalls only and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: argument-less calls (getpgid/getsid take 0: this process), a one-byte
            // write to our pipe, a blocking read of the other until the parent closes it.
            unsafe {
                for _ in 0..k {
                    for nr in DISTINCT_CALLS {
                        libc::syscall(nr, 0);
                    }
                }
                libc::write(done[1], b"x".as_ptr().cast(), 1);
                libc::close(release[1]);
                let mut b = 0u8;
                libc::read(release[0], (&mut b as *mut u8).cast(), 1);
                libc::_exit(0);
            }
        }
        pids.push(pid);
    }
    // SAFETY: our own descriptors.
    unsafe { libc::close(release[0]) };
    for _ in 0..n {
        let mut b = 0u8;
        // SAFETY: a one-byte read into a local.
        let r = unsafe { libc::read(done[0], (&mut b as *mut u8).cast(), 1) };
        assert!(r == 1, "a child died before its calls");
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    // SAFETY: our own descriptor; closing it ends every child's read.
    unsafe { libc::close(release[1]) };
    for pid in pids {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
}

/// The slow call of a short-lived process: `n` reads of a pipe, each filled by a child `ms` ms
/// after the read has blocked, and the exit right after the last read, before anyone could
/// look the descriptor up in `/proc`.
fn pipe_reads_then_exit(n: u64, ms: u64) -> ! {
    let (rd, wr) = pipe_pair();
    let (dev, ino) = fd_identity(rd);
    println!("pipe_ino={ino} pipe_dev={dev}");
    let _ = std::io::stdout().flush();
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: this process has one thread here, so the child may use the allocator; it makes
    // no read calls of its own (it polls /proc with pread) and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: the child's copy of the read end, not used by it.
        unsafe { libc::close(rd) };
        let blocked = format!("/proc/{parent}/task/{parent}/syscall");
        for _ in 0..n {
            wait_until_blocked_in_path(&blocked, &format!("{} {:#x} ", libc::SYS_read, rd), false);
            std::thread::sleep(Duration::from_millis(ms));
            // SAFETY: one byte from a valid buffer to our pipe; _exit cannot fail.
            unsafe { libc::write(wr, b"x".as_ptr().cast(), 1) };
        }
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    for _ in 0..n {
        read_byte(rd);
    }
    // At once: no descriptor is closed, no child waited for.
    std::process::exit(0);
}

/// One slow read of a FIFO another process fills, then the exit at once.
fn fifo_read(path: &str) -> ! {
    let fd = open_or_exit(path, libc::O_RDWR);
    println!("fifo_fd={fd}");
    let _ = std::io::stdout().flush();
    read_byte(fd);
    std::process::exit(0);
}

/// One slow read of the FIFO at `path`, filled by a thread of ours `ms` ms after it blocked;
/// the descriptor stays open `hold_ms` ms more (its `/proc` link readable meanwhile).
fn fifo_slow_read(path: &str, ms: u64, hold_ms: u64) {
    let fd = open_or_exit(path, libc::O_RDWR);
    println!("fifo_fd={fd}");
    let _ = std::io::stdout().flush();
    slow_read_filled_by(fd, fd, ms);
    std::thread::sleep(Duration::from_millis(hold_ms));
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
}

/// A descriptor number that names two files in turn, each read slowly: a pipe, then the FIFO
/// at `path` opened on the same number.
fn reused_fd_reads(path: &str, ms: u64) -> ! {
    let (rd, wr) = pipe_pair();
    println!("fd={rd}");
    println!("first_ino={}", fd_identity(rd).1);
    let _ = std::io::stdout().flush();
    slow_read_filled_by(rd, wr, ms);
    // SAFETY: our own descriptors; dup2 makes `rd` name the FIFO.
    unsafe {
        libc::close(wr);
        libc::close(rd);
    }
    // The lowest free number is `rd` again, unless another thread took it meanwhile.
    let fifo = open_or_exit(path, libc::O_RDWR);
    if fifo != rd {
        // SAFETY: as above.
        let r = unsafe { libc::dup2(fifo, rd) };
        assert_eq!(r, rd, "dup2: {}", std::io::Error::last_os_error());
        // SAFETY: as above.
        unsafe { libc::close(fifo) };
    }
    println!("second_ino={}", fd_identity(rd).1);
    let _ = std::io::stdout().flush();
    // The FIFO is open read-write: a write to the same descriptor fills it.
    slow_read_filled_by(rd, rd, ms);
    std::process::exit(0);
}

/// One read of `rd` that a thread fills through `wr`, `ms` ms after the read has blocked.
fn slow_read_filled_by(rd: i32, wr: i32, ms: u64) {
    let reader = gettid();
    let writer = std::thread::spawn(move || {
        wait_until_blocked_in_read(reader, rd);
        std::thread::sleep(Duration::from_millis(ms));
        // SAFETY: one byte from a valid buffer to a descriptor the reader holds open.
        unsafe { libc::write(wr, b"x".as_ptr().cast(), 1) };
    });
    read_byte(rd);
    writer.join().unwrap();
}

/// Device and inode of descriptor `fd`'s file (fstat), the device as `MAJ:MIN`.
fn fd_identity(fd: i32) -> (String, u64) {
    // SAFETY: a zeroed stat buffer for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid buffer and a descriptor the caller holds.
    let r = unsafe { libc::fstat(fd, &mut st) };
    assert_eq!(r, 0, "fstat: {}", std::io::Error::last_os_error());
    let dev = format!("{}:{}", libc::major(st.st_dev), libc::minor(st.st_dev));
    (dev, st.st_ino)
}

/// One one-byte `read` of `fd` (a raw syscall: the call the tests sample).
fn read_byte(fd: i32) {
    let mut byte = 0u8;
    // SAFETY: a one-byte read into a local.
    let r = unsafe {
        libc::syscall(
            libc::SYS_read,
            fd,
            (&mut byte as *mut u8).cast::<u8>(),
            1usize,
        )
    };
    assert_eq!(r, 1, "read: {}", std::io::Error::last_os_error());
}

/// Makes getppid fail with EPERM from now on, through a seccomp filter: the kernel answers the
/// call before its `sys_enter` tracepoint, as a container runtime's profile does.
fn seccomp_filter_getppid() {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let mut filter = [
        // A = seccomp_data.nr (offset 0)
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_getppid as u32,
        },
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: prctl with its documented arguments; the program outlives the call (the kernel
    // copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        let r = libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &program as *const libc::sock_fprog,
        );
        assert_eq!(r, 0, "seccomp: {}", std::io::Error::last_os_error());
    }
}

fn seccomp_getppid(n: u64) {
    seccomp_filter_getppid();
    for _ in 0..n {
        // SAFETY: getppid takes no arguments.
        let r = unsafe { libc::syscall(libc::SYS_getppid) };
        let err = std::io::Error::last_os_error().raw_os_error();
        assert!(r == -1 && err == Some(libc::EPERM), "getppid: {r} {err:?}");
    }
}

static SIGNALS: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_signal(_: libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::Relaxed);
}

/// Installs `count_signal` for `signal` without SA_RESTART: an interrupted call fails with EINTR.
fn handle_without_restart(signal: libc::c_int) {
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe (one atomic add).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = count_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        action.sa_flags = 0;
        assert_eq!(libc::sigaction(signal, &action, std::ptr::null_mut()), 0);
    }
}

/// Arms ITIMER_REAL: SIGALRM in `first_us` (below a second), then every `every_us` (0: once);
/// `first_us` 0 disarms it.
fn real_timer(first_us: i64, every_us: i64) {
    let timer = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: every_us as libc::suseconds_t,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: first_us as libc::suseconds_t,
        },
    };
    // SAFETY: a valid itimerval; the old value is not wanted.
    let r = unsafe { libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()) };
    assert_eq!(r, 0, "setitimer: {}", std::io::Error::last_os_error());
}

fn pause_interrupted(n: u64) {
    handle_without_restart(libc::SIGALRM);
    for _ in 0..n {
        real_timer(10_000, 0);
        // The pause syscall itself where the architecture has one (arm64 has none: glibc's
        // pause() is a ppoll there).
        // SAFETY: pause has no arguments; the handler is installed.
        #[cfg(target_arch = "x86_64")]
        let r = unsafe { libc::syscall(libc::SYS_pause) };
        // SAFETY: as above.
        #[cfg(not(target_arch = "x86_64"))]
        let r = unsafe { libc::pause() } as libc::c_long;
        let err = std::io::Error::last_os_error().raw_os_error();
        assert!(r == -1 && err == Some(libc::EINTR), "pause: {r} {err:?}");
    }
}

fn spin_errno_register(ms: u64) {
    handle_without_restart(libc::SIGALRM);
    real_timer(1000, 1000);
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {
        // Some 10^7 iterations with the return register holding -22 throughout: a signal
        // delivered meanwhile saves it, and rt_sigreturn restores it as its "return value".
        let mut n: u64 = 1 << 24;
        // SAFETY: the loop touches only the two registers it declares.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("mov rax, -22", "2:", "dec {n}", "jnz 2b", n = inout(reg) n, out("rax") _);
        }
        // SAFETY: as above.
        #[cfg(target_arch = "aarch64")]
        unsafe {
            std::arch::asm!("mov x0, #-22", "2:", "subs {n}, {n}, #1", "b.ne 2b", n = inout(reg) n, out("x0") _);
        }
        let _ = n;
    }
    real_timer(0, 0);
    eprintln!("signals={}", SIGNALS.load(Ordering::Relaxed));
}
