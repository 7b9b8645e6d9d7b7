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

/// A running exporter whose one user, alice, has the password "right" hashed at bcrypt
/// `cost`, and the directory of its web config file (keep it while the exporter runs).
fn with_alice(cost: u32) -> (tempfile::TempDir, Exporter) {
    let hash = bcrypt::hash("right", cost).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, format!("basic_auth_users:\n  alice: '{hash}'\n")).unwrap();
    let port = free_port();
    let mut exporter = Exporter::spawn_on(
        port,
        TEST_CONFIG,
        &[&format!("--web.config.file={}", web.display())],
    );
    exporter.wait_for(|| matches!(http_get(port, "/metrics", None), Ok((401, _, _))));
    (dir, exporter)
}

#[test]
fn password_guessing_from_one_address_does_not_delay_a_login_from_another() {
    if !require_root("password_guessing_from_one_address_does_not_delay_a_login_from_another") {
        return;
    }
    // A low cost keeps the test short; what is checked is the order, not the time.
    // The directory is declared first, so dropped after the exporter has stopped.
    let (_web, exporter) = with_alice(6);
    let port = exporter.port;

    let guesser = Ipv4Addr::new(127, 0, 0, 2);
    let stop = Arc::new(AtomicBool::new(false));
    let guesses = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..60)
        .map(|i| {
            let (stop, guesses) = (stop.clone(), guesses.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let status = get_as(guesser, port, "/metrics", "alice", &format!("guess{i}"));
                    assert_ne!(status, 200, "a wrong password got in");
                    guesses.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Let the guesses queue up behind the password checks.
    std::thread::sleep(Duration::from_millis(500));
    let before = guesses.load(Ordering::SeqCst);
    // The landing page, not /metrics: the login is checked as a scrape's is, but what it
    // then serves costs nothing, so the count below is of the checks it waited for, not of
    // what a scrape of the node costs meanwhile.
    let status = get_as(Ipv4Addr::new(127, 0, 0, 3), port, "/", "alice", "right");
    let during = guesses.load(Ordering::SeqCst) - before;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(status, 200, "the right password must get in");
    assert!(before > 0, "the guessers never got an answer");
    // Not a timing: how many guesses were checked while the login waited. Queued behind
    // them, it waits for all 60 (61 measured); in its own lane, for the one check in progress
    // and the few the guessers' lane gets through beside its own on a busy machine.
    assert!(
        during <= 15,
        "{during} guesses were answered while the login from another address waited"
    );
}

/// Peers that fill the connection cap with requests waiting for their password checks (they
/// can send them far faster than bcrypt answers them) do not lock anyone else out: their
/// waiting connections make room for a newcomer. One peer's requests wait in its lane; many
/// peers' wait for one of the two check slots.
#[test]
fn peers_filling_the_cap_with_password_checks_lock_nobody_out() {
    if !require_root("peers_filling_the_cap_with_password_checks_lock_nobody_out") {
        return;
    }
    flood_of_password_checks_then_login("one peer", |_| Ipv4Addr::new(127, 0, 0, 4));
    flood_of_password_checks_then_login("a peer per connection", |i| {
        Ipv4Addr::new(127, 1, (i / 200) as u8, (i % 200 + 1) as u8)
    });
}

/// Fills the cap with connections from `source(i)`, each with wrong passwords pipelined, then
/// logs in from another address: the login must get in.
fn flood_of_password_checks_then_login(what: &str, source: impl Fn(usize) -> Ipv4Addr) {
    const CAP: usize = sysscope::exposition::http::MAX_CONNECTIONS;
    const PIPELINED: usize = 20;
    // Cost 4 (the least): the flood (20 checks a connection, 10,240 in all) still lasts tens
    // of seconds, and a login from another address waits behind at most one check of every
    // other peer (4 s at cost 6 on an idle 2-core machine, unoptimized). The directory is
    // declared first, so dropped after the exporter has stopped.
    let (_web, exporter) = with_alice(4);
    let port = exporter.port;
    let wrong = base64::engine::general_purpose::STANDARD.encode("alice:wrong");
    // Pipelined: once a request is answered the next one is in progress at once, so no
    // connection of the flood is ever idle.
    let requests =
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {wrong}\r\n\r\n")
            .repeat(PIPELINED);
    let mut flood = Vec::with_capacity(CAP);
    for i in 0..CAP {
        let mut s =
            connect_from(source(i), port).unwrap_or_else(|e| panic!("{what}: connect {i}: {e}"));
        s.write_all(requests.as_bytes()).unwrap();
        flood.push(s);
    }
    // Let the server read every request and queue it for its check.
    std::thread::sleep(Duration::from_secs(1));
    let login = std::time::Instant::now();
    let status = get_as(
        Ipv4Addr::new(127, 0, 0, 5),
        port,
        "/metrics",
        "alice",
        "right",
    );
    let login = login.elapsed();
    // The scenario happened: most of the flood's connections still had requests waiting
    // (fewer answers than requests sent, and not closed) when the login came.
    let waiting = flood
        .iter()
        .filter(|s| {
            let mut s: &TcpStream = s;
            s.set_nonblocking(true).unwrap();
            let mut answers = Vec::new();
            let mut b = [0u8; 4096];
            loop {
                match s.read(&mut b) {
                    Ok(0) => return false,
                    Ok(n) => answers.extend_from_slice(&b[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // Reset: closed, not waiting.
                    Err(_) => return false,
                }
            }
            String::from_utf8_lossy(&answers)
                .matches("HTTP/1.1 ")
                .count()
                < PIPELINED
        })
        .count();
    assert!(
        waiting >= CAP / 2,
        "{what}: only {waiting} of the flood's {CAP} connections still had requests waiting: \
         the cap was not full of them"
    );
    assert_eq!(
        status, 200,
        "{what}: a login was locked out by {CAP} connections waiting for password checks"
    );
    eprintln!(
        "{what}: cap filled by {CAP} connections waiting for password checks ({waiting} still \
         waiting after): login got in after {login:?}"
    );
}

/// Whether `pid` catches `signal` (SigCgt in /proc/<pid>/status).
fn catches(pid: u32, signal: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let mask = s
                .lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&mask, 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

#[test]
fn an_early_sigterm_exits_cleanly() {
    if !require_root("an_early_sigterm_exits_cleanly") {
        return;
    }
    // SIGTERM as soon as the process catches it, and again once the probes start loading:
    // both long before it is ready, both must end in a clean exit with status 0.
    for stage in ["before any probe loads", "while the probes load"] {
        let mut exporter = Exporter::spawn_on(free_port(), TEST_CONFIG, &[]);
        let pid = exporter.child.id();
        // A tight poll: the window between the handler and the first probe is milliseconds.
        let started = Instant::now();
        while !catches(pid, libc::SIGTERM) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "SIGTERM never caught"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        if stage == "before any probe loads" {
            assert!(
                bpf_program_ids_of(pid).is_empty(),
                "SIGTERM is caught only once probes are loaded: a stop during start-up kills it"
            );
        } else {
            let loading = eventually(Duration::from_secs(30), || {
                (!bpf_program_ids_of(pid).is_empty()).then_some(())
            });
            assert!(loading.is_some(), "no probe ever loaded");
        }
        let (status, _) = exporter.stop();
        assert!(
            status.success(),
            "SIGTERM {stage}: exit status {status}, expected 0"
        );
    }
}

/// Parses one logfmt line strictly: `key=value` pairs separated by one space, each value bare
/// (no space, quote, `=` or backslash) or quoted with `\"`, `\\`, `\n`, `\r`, `\t`, `\u{..}`
/// escapes. `None` if the line is not logfmt.
fn parse_logfmt(line: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut rest = line;
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        if key.is_empty() || key.contains([' ', '"']) {
            return None;
        }
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                let (i, c) = chars.next()?;
                match c {
                    '"' => break i + 1,
                    '\\' => match chars.next()?.1 {
                        '"' => value.push('"'),
                        '\\' => value.push('\\'),
                        'n' => value.push('\n'),
                        'r' => value.push('\r'),
                        't' => value.push('\t'),
                        'u' => {
                            let hex: String = chars
                                .by_ref()
                                .map(|(_, c)| c)
                                .skip(1)
                                .take_while(|c| *c != '}')
                                .collect();
                            value.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                        }
                        _ => return None,
                    },
                    c if c.is_control() => return None,
                    c => value.push(c),
                }
            };
            (value, &quoted[end..])
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            let value = &after[..end];
            if value.is_empty() || value.contains(['"', '=', '\\']) {
                return None;
            }
            (value.to_string(), &after[end..])
        };
        pairs.push((key.to_string(), value));
        rest = match after.strip_prefix(' ') {
            Some(r) if !r.is_empty() => r,
            None if after.is_empty() => "",
            _ => return None,
        };
    }
    Some(pairs)
}

#[test]
fn logs_of_a_real_run_are_logfmt_without_escape_codes() {
    if !require_root("logs_of_a_real_run_are_logfmt_without_escape_codes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sysscope.toml");
    std::fs::write(&config, TEST_CONFIG).unwrap();
    let port = free_port();
    // stderr is a pipe here, as under kubectl logs, journald or a file.
    let child = std::process::Command::new(sysscope_bin())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--config.file={}", config.display()))
        .arg("--log.format=logfmt")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ready = eventually(Duration::from_secs(30), || {
        matches!(http_get(port, "/-/ready", None), Ok((200, _, _))).then_some(())
    });
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(ready.is_some(), "sysscope did not become ready");
    assert!(out.status.success(), "exit status {}", out.status);
    let stderr = String::from_utf8(out.stderr).expect("logs are UTF-8");
    assert!(
        !stderr.contains('\u{1b}'),
        "escape codes in logs written to a pipe:\n{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() >= 3, "too few log lines:\n{stderr}");
    let mut messages = Vec::new();
    for line in &lines {
        let pairs = parse_logfmt(line).unwrap_or_else(|| panic!("not logfmt: {line}"));
        let keys: Vec<&str> = pairs.iter().take(4).map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["ts", "level", "target", "msg"], "{line}");
        assert!(
            ["error", "warn", "info", "debug", "trace"].contains(&pairs[1].1.as_str()),
            "{line}"
        );
        messages.push(pairs[3].1.clone());
        if pairs[3].1 == "serving metrics" {
            let address = pairs.iter().find(|(k, _)| k == "address").unwrap();
            assert_eq!(address.1, format!("127.0.0.1:{port}"), "{line}");
        }
    }
    assert!(
        messages.iter().any(|m| m == "serving metrics"),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m == "stopped; all probes detached"),
        "{messages:?}"
    );
}

/// `/metrics` as curl gets it from `url`: (HTTP status, body).
fn curl(url: &str) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-g", "--max-time", "20", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl (installed by scripts/setup.sh --test)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// `--web.listen-address=:PORT` and `[::]:PORT` (the node_exporter forms) listen on every
/// address of both families: curl over 127.0.0.1 and over [::1] gets the metrics, from one
/// exporter each time. `0.0.0.0:PORT` stays IPv4.
#[test]
fn listens_on_every_family() {
    if !require_root("listens_on_every_family") {
        return;
    }
    let has_ipv6_loopback = std::fs::read_to_string("/proc/net/if_inet6")
        .is_ok_and(|t| t.lines().any(|l| l.starts_with(&format!("{:032x}", 1))));
    // CI machines have ::1: there its absence fails the test.
    let ipv6 = require(
        "listens_on_every_family (over IPv6)",
        "::1 on the loopback interface",
        has_ipv6_loopback,
    );
    for form in [":{port}", "[::]:{port}", "0.0.0.0:{port}"] {
        let port = free_port();
        let address = form.replace("{port}", &port.to_string());
        // The flag is given once: the harness's own 127.0.0.1 address is not used here.
        let _node = share_node();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("sysscope.toml");
        std::fs::write(&config, TEST_CONFIG).unwrap();
        let mut child = std::process::Command::new(sysscope_bin())
            .arg(format!("--web.listen-address={address}"))
            .arg(format!("--config.file={}", config.display()))
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn sysscope");
        let ready = eventually(Duration::from_secs(30), || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "sysscope on {address} exited"
            );
            (curl(&format!("http://127.0.0.1:{port}/-/ready")).0 == 200).then_some(())
        });
        let v4 = curl(&format!("http://127.0.0.1:{port}/metrics"));
        let v6 = ipv6.then(|| curl(&format!("http://[::1]:{port}/metrics")));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
        assert!(ready.is_some(), "sysscope on {address} not ready over IPv4");
        assert_eq!(v4.0, 200, "{address} over 127.0.0.1");
        assert!(
            v4.1.contains("sysscope_build_info{"),
            "{address} over 127.0.0.1: {}",
            v4.1
        );
        if let Some((code, body)) = v6 {
            if form.starts_with("0.0.0.0") {
                assert_eq!(code, 0, "{address} answered over [::1]: it must stay IPv4");
            } else {
                assert_eq!(code, 200, "{address} over [::1]");
                assert!(
                    body.contains("sysscope_build_info{"),
                    "{address} over [::1]: {body}"
                );
            }
        }
    }
}

/// The values of the JSON-patch `add` operations of `components/web-auth` whose path ends in
/// `suffix`, for the target of `kind`.
fn web_auth_patch(kind: &str, suffix: &str) -> serde_yaml_ng::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/components/web-auth/kustomization.yaml"
    );
    let component: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let patches = component["patches"].as_sequence().unwrap();
    let patch = patches
        .iter()
        .find(|p| p["target"]["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("components/web-auth patches no {kind}"));
    let ops: Vec<serde_yaml_ng::Value> =
        serde_yaml_ng::from_str(patch["patch"].as_str().unwrap()).unwrap();
    ops.into_iter()
        .find(|op| op["path"].as_str().is_some_and(|p| p.ends_with(suffix)))
        .unwrap_or_else(|| panic!("components/web-auth: no {kind} patch of *{suffix}"))["value"]
        .clone()
}

/// `components/web-auth` as a cluster runs it: the Secrets made as docs/kubernetes.md says
/// (the exporter's web.yml, certificate and key; Prometheus' user, password and CA, under the
/// keys the component's PodMonitor names), the exporter started with them; then the kubelet's
/// probes (HTTPS, no credentials, no verification) pass, Prometheus' scrape (the PodMonitor's
/// basicAuth and tlsConfig: the CA and serverName) gets the metrics, and without or with a
/// wrong password the metrics and `POST /-/reload` are refused.
#[test]
fn web_auth_component_scrapes_with_its_secret_and_probes_without() {
    if !require_root("web_auth_component_scrapes_with_its_secret_and_probes_without") {
        return;
    }
    // What the component says.
    let config_arg = web_auth_patch("DaemonSet", "/args/-");
    let web_file = config_arg
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    for probe in ["livenessProbe", "readinessProbe"] {
        let scheme = web_auth_patch("DaemonSet", &format!("/{probe}/httpGet/scheme"));
        assert_eq!(scheme.as_str(), Some("HTTPS"), "{probe}");
    }
    let basic = web_auth_patch("PodMonitor", "/basicAuth");
    let tls = web_auth_patch("PodMonitor", "/tlsConfig");
    let scrape_secret = basic["username"]["name"].as_str().unwrap().to_string();
    assert_eq!(
        basic["password"]["name"].as_str(),
        Some(scrape_secret.as_str())
    );
    assert_eq!(
        tls["ca"]["secret"]["name"].as_str(),
        Some(scrape_secret.as_str())
    );
    let key = |v: &serde_yaml_ng::Value| v["key"].as_str().unwrap().to_string();
    let (user_key, password_key) = (key(&basic["username"]), key(&basic["password"]));
    let ca_key = key(&tls["ca"]["secret"]);
    let server_name = tls["serverName"].as_str().unwrap().to_string();

    // The two Secrets, as directories of their keys.
    let web_secret = tempfile::tempdir().unwrap();
    let scrape = tempfile::tempdir().unwrap();
    let ca = crate::security::ca("cluster CA");
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server_cert = rcgen::CertificateParams::new(vec![server_name.clone()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let password = format!("pw-{}", rand_suffix());
    let hash = bcrypt::hash(&password, 4).unwrap();
    std::fs::write(web_secret.path().join("tls.crt"), server_cert.pem()).unwrap();
    std::fs::write(
        web_secret.path().join("tls.key"),
        server_key.serialize_pem(),
    )
    .unwrap();
    std::fs::write(
        web_secret.path().join(&web_file),
        format!(
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n\
             basic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .unwrap();
    std::fs::write(scrape.path().join(&user_key), "prometheus").unwrap();
    std::fs::write(scrape.path().join(&password_key), &password).unwrap();
    std::fs::write(scrape.path().join(&ca_key), ca.pem()).unwrap();

    let port = free_port();
    let mut exporter = Exporter::spawn_on(
        port,
        TEST_CONFIG,
        &[&format!(
            "--web.config.file={}",
            web_secret.path().join(&web_file).display()
        )],
    );
    // The kubelet: HTTPS without verifying the certificate, and no credentials.
    let probe = |path: &str| {
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "-k",
                "--max-time",
                "20",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg(format!("https://127.0.0.1:{port}{path}"))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout)
            .parse::<u16>()
            .unwrap_or(0)
    };
    exporter.wait_for(|| probe("/-/ready") == 200);
    assert_eq!(probe("/-/healthy"), 200, "liveness probe");
    // Prometheus with the PodMonitor's settings, read from the Secret's files.
    let scrape_as = |user: &str, password: &str, method: &str, path: &str| {
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "20",
                "-X",
                method,
                "-w",
                "\n%{http_code}",
            ])
            .arg("--cacert")
            .arg(scrape.path().join(&ca_key))
            .arg("--resolve")
            .arg(format!("{server_name}:{port}:127.0.0.1"))
            .args(["-u", &format!("{user}:{password}")])
            .arg(format!("https://{server_name}:{port}{path}"))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.parse::<u16>().unwrap_or(0), body.to_string())
    };
    let user = std::fs::read_to_string(scrape.path().join(&user_key)).unwrap();
    let secret_password = std::fs::read_to_string(scrape.path().join(&password_key)).unwrap();
    let (code, body) = scrape_as(&user, &secret_password, "GET", "/metrics");
    assert_eq!(code, 200, "scrape with the Secret's credentials: {body}");
    assert!(body.contains("sysscope_build_info{"), "{body}");
    assert_eq!(scrape_as(&user, "wrong", "GET", "/metrics").0, 401);
    assert_eq!(scrape_as("", "", "GET", "/metrics").0, 401);
    assert_eq!(scrape_as(&user, "wrong", "POST", "/-/reload").0, 401);
    assert_eq!(
        scrape_as("", "", "POST", "/-/ready").0,
        401,
        "only reads of the probes skip auth"
    );
}
