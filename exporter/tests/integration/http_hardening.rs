//! The HTTP endpoint under hostile load, on the real binary: password guessing from one
//! address does not delay a login from another, an early SIGTERM still exits cleanly, and a
//! flood of JSON route requests leaves `/metrics` answering.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, TcpStream},
    os::fd::FromRawFd,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::common::*;
use base64::Engine;

/// A TCP connection to 127.0.0.1:`port` from the loopback address `source` (127.0.0.0/8 is all
/// local), so one test can play several peers.
fn connect_from(source: Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor we own; the addresses outlive the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let local = sockaddr(source, 0);
        if libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = sockaddr(Ipv4Addr::LOCALHOST, port);
        if libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// One GET with basic auth from `source`; the status code.
fn get_as(source: Ipv4Addr, port: u16, path: &str, user: &str, password: &str) -> u16 {
    let Ok(mut s) = connect_from(source, port) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    );
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn password_guessing_from_one_address_does_not_delay_a_login_from_another() {
    if !require_root("password_guessing_from_one_address_does_not_delay_a_login_from_another") {
        return;
    }
    // Cost 11: each check takes about a tenth of a second, so 60 queued guesses would hold a
    // login for seconds if they all shared one queue.
    let hash = bcrypt::hash("right", 11).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, format!("basic_auth_users:\n  alice: '{hash}'\n")).unwrap();
    let port = free_port();
    let mut exporter = Exporter::spawn_on(
        port,
        TEST_CONFIG,
        &[&format!("--web.config.file={}", web.display())],
    );
    exporter.wait_for(|| matches!(http_get(port, "/-/ready", None), Ok((401, _, _))));

    let guesser = Ipv4Addr::new(127, 0, 0, 2);
    let stop = Arc::new(AtomicBool::new(false));
    let guesses = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..60)
        .map(|i| {
            let (stop, guesses) = (stop.clone(), guesses.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let status = get_as(guesser, port, "/metrics", "alice", &format!("guess{i}"));
                    assert_eq!(status, 401, "a wrong password must get 401");
                    guesses.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Let the guesses queue up behind the password checks.
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let status = get_as(
        Ipv4Addr::new(127, 0, 0, 3),
        port,
        "/metrics",
        "alice",
        "right",
    );
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(status, 200, "the right password must get in");
    assert!(
        guesses.load(Ordering::Relaxed) > 0,
        "the guessers never got an answer"
    );
    // Availability deadline: one check in progress plus its own, with a wide margin.
    assert!(
        took < Duration::from_secs(2),
        "a login from another address waited {took:?} behind 60 guessers"
    );
}

#[test]
fn an_early_sigterm_exits_cleanly() {
    if !require_root("an_early_sigterm_exits_cleanly") {
        return;
    }
    for delay_ms in [20, 50, 100, 200] {
        let mut exporter = Exporter::spawn_on(free_port(), TEST_CONFIG, &[]);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let (status, _) = exporter.stop();
        assert!(
            status.success(),
            "SIGTERM {delay_ms} ms after start: exit status {status}, expected 0"
        );
    }
}
