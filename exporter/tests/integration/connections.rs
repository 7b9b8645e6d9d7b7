//! Availability of the HTTP endpoint against clients that open connections and never use
//! them: silent TCP connections up to the cap, half an HTTP/2 preface, a full preface then
//! silence, and TLS handshakes followed by silence. `/metrics` and `/-/healthy` (the
//! DaemonSet's liveness probe) must keep answering within a second all along.

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::common::*;

/// Connections the exporter serves at once (`exposition::http::MAX_CONNECTIONS`).
const CAP: usize = 512;

/// A GET over a fresh plain connection; returns the status and how long the answer took.
fn timed_get(port: u16, path: &str) -> (u16, Duration) {
    let started = Instant::now();
    let (status, _, _) =
        http_get(port, path, None).unwrap_or_else(|e| panic!("GET {path} failed: {e}"));
    (status, started.elapsed())
}

/// How long a request may take while connections are held: far below the 10 s the server
/// gives a silent connection, so an answer in time means nobody waited for one to time out.
/// `/metrics` reads every map (a debug build, on a machine the neighbouring tests load), so it
/// gets more room than the health check.
fn answer_limit(path: &str) -> Duration {
    if path == "/metrics" {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(1)
    }
}

fn assert_answers_quickly(port: u16, when: &str) {
    for path in ["/-/healthy", "/metrics"] {
        let (status, took) = timed_get(port, path);
        assert_eq!(status, 200, "{path} {when}");
        assert!(took < answer_limit(path), "{path} took {took:?} {when}");
    }
}

#[test]
fn silent_and_half_open_connections_lock_nobody_out() {
    if !require_root("silent_and_half_open_connections_lock_nobody_out") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let port = exporter.port;
    assert_answers_quickly(port, "before the flood");

    let mut held: Vec<TcpStream> = Vec::new();
    // Half an HTTP/2 preface, and a whole one with an empty SETTINGS frame, then nothing.
    for _ in 0..16 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n").unwrap();
        held.push(s);
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .unwrap();
        held.push(s);
    }
    // Silent connections up to (and past) the cap.
    while held.len() < CAP + 32 {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => held.push(s),
            Err(e) => panic!("connect {}: {e}", held.len()),
        }
    }
    // Within the idle deadline (the flood is still held) and after it (the flood reconnects).
    assert_answers_quickly(port, "with the cap filled by silent connections");
    std::thread::sleep(Duration::from_secs(5));
    assert_answers_quickly(port, "5 s into the flood");
    std::thread::sleep(Duration::from_secs(7));
    // Past the idle deadline the server has closed what the flood left silent.
    let mut closed = 0;
    for s in held.iter_mut().take(64) {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = [0u8; 64];
        if matches!(s.read(&mut b), Ok(0) | Err(_)) {
            closed += 1;
        }
    }
    assert!(closed > 0, "silent connections are still open after 12 s");
    held.clear();
    for _ in 0..CAP {
        held.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    assert_answers_quickly(port, "after the flood reconnected");
}

#[test]
fn tls_handshakes_followed_by_silence_lock_nobody_out() {
    if !require_root("tls_handshakes_followed_by_silence_lock_nobody_out") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {0}/server.pem\n  key_file: {0}/server.key\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let port = free_port();
    let mut exporter = Exporter::spawn_on(
        port,
        TEST_CONFIG,
        &[&format!("--web.config.file={}", web.display())],
    );

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let https_get = |path: &str| -> (u16, Duration) {
        let started = Instant::now();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
        let Ok(sock) = TcpStream::connect(("127.0.0.1", port)) else {
            return (0, started.elapsed());
        };
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, sock);
        if write!(
            tls,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .is_err()
        {
            return (0, started.elapsed());
        }
        let mut resp = Vec::new();
        let _ = tls.read_to_end(&mut resp);
        let text = String::from_utf8_lossy(&resp);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, started.elapsed())
    };

    exporter.wait_for(|| https_get("/-/ready").0 == 200);

    // Handshakes completed, then silence, up to past the cap.
    let mut held = Vec::new();
    while held.len() < CAP + 16 {
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
        let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
        while conn.is_handshaking() {
            if conn.complete_io(&mut sock).is_err() {
                break;
            }
        }
        held.push((conn, sock));
    }
    for path in ["/-/healthy", "/metrics"] {
        let (status, took) = https_get(path);
        assert_eq!(
            status, 200,
            "{path} over TLS with the cap held by idle TLS connections"
        );
        assert!(took < answer_limit(path), "{path} took {took:?}");
    }
}
