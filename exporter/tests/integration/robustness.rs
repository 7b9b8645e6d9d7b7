//! Faults, lifecycle and hostile input, on the real binary and the real kernel: a probe that
//! fails to attach, SIGINT/SIGTERM leaving nothing behind (checked with bpftool), restarts
//! and port conflicts, malformed HTTP from a raw socket, and malformed configuration.

use std::{process::Command, time::Duration};

use crate::common::*;

fn metric(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let s = select(samples, name, labels);
    (!s.is_empty()).then(|| s.iter().map(|x| x.value).sum())
}

/// Raw-tracepoint links on the machine whose program is one of `ids` (bpftool).
fn links_of(ids: &[u64]) -> Vec<u64> {
    bpftool_show("link")
        .iter()
        .filter_map(|l| l["prog_id"].as_u64())
        .filter(|p| ids.contains(p))
        .collect()
}

/// The ids among `ids` of programs with one of `names` (the kernel keeps 15 characters).
fn programs_named(ids: &[u64], names: &[&str]) -> Vec<u64> {
    bpftool_show("prog")
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| names.contains(&n)))
        .filter_map(|p| p["id"].as_u64())
        .filter(|id| ids.contains(id))
        .collect()
}

#[test]
fn a_probe_that_fails_to_attach_takes_down_only_its_collector() {
    if !require_root("a_probe_that_fails_to_attach_takes_down_only_its_collector") {
        return;
    }
    // The syscall collector's entry probe is attached to a tracepoint that does not exist.
    let fault = [(sysscope::kernel::FAULT_ENV, "sys_enter")];
    let mut exporter = Exporter::spawn_with_env(free_port(), TEST_CONFIG, &[], &fault);
    exporter.wait_ready(Duration::from_secs(30));
    let samples = parse_samples(&exporter.scrape());
    assert_eq!(
        metric(
            &samples,
            "sysscope_collector_up",
            &[("collector", "syscalls")]
        ),
        Some(0.0),
        "the syscall collector must report itself down"
    );
    assert_eq!(
        metric(
            &samples,
            "sysscope_probe_attached",
            &[("program", "sys_enter")]
        ),
        Some(0.0)
    );
    assert_eq!(
        metric(&samples, "sysscope_build_info", &[]),
        Some(1.0),
        "self-metrics are still served"
    );
    // What the failed collector had attached before the failure is detached again: nothing
    // runs in the kernel that no one reads.
    let ids = bpf_program_ids_of(exporter.child.id());
    assert!(!ids.is_empty(), "programs are loaded");
    // Other collectors (block I/O) keep their programs attached; the failed one's are gone.
    let syscall_programs = programs_named(&ids, &["sys_enter", "sys_exit", "sched_process_e"]);
    assert_eq!(
        links_of(&syscall_programs),
        Vec::<u64>::new(),
        "links of the failed collector's programs remain"
    );
    assert_eq!(
        metric(
            &samples,
            "sysscope_probe_attached",
            &[("program", "sched_process_exit")]
        ),
        Some(0.0)
    );
    let (status, _) = exporter.stop();
    assert!(status.success(), "{status}");

    // --config.check reports the failure and exits non-zero.
    let out = Command::new(sysscope_bin())
        .arg("--config.check")
        .env(sysscope::kernel::FAULT_ENV, "sys_enter")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("collector syscalls failed") && stdout.contains("sys_enter"),
        "{stdout}"
    );
}

#[test]
fn a_block_io_probe_on_a_missing_tracepoint_leaves_syscalls_running() {
    if !require_root("a_block_io_probe_on_a_missing_tracepoint_leaves_syscalls_running") {
        return;
    }
    let config = format!(
        "{TEST_CONFIG}[block_io]\ntracepoints = [\"block_rq_issue\", \"sysscope_no_such_tracepoint\"]\n"
    );
    let exporter = Exporter::start(&config, &[]);
    let samples = parse_samples(&exporter.scrape());
    assert_eq!(
        metric(
            &samples,
            "sysscope_collector_up",
            &[("collector", "block_io")]
        ),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &samples,
            "sysscope_collector_up",
            &[("collector", "syscalls")]
        ),
        Some(1.0)
    );
    let cg = TestCgroup::new("sysscope-test-fault");
    run_workload_joined(&cg, &["getppid", "77"]);
    let samples = parse_samples(&exporter.scrape());
    assert_eq!(getppid_calls(&samples, &cg), 77.0);
}

#[test]
fn sigint_and_sigterm_detach_every_program_and_map() {
    if !require_root("sigint_and_sigterm_detach_every_program_and_map") {
        return;
    }
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let mut exporter = Exporter::start(TEST_CONFIG, &[]);
        let pid = exporter.child.id();
        let programs = bpf_program_ids_of(pid);
        let maps = bpf_map_ids_of(pid);
        assert!(programs.len() >= 3, "{name}: programs {programs:?}");
        assert!(maps.len() >= 4, "{name}: maps {maps:?}");
        assert!(
            links_of(&programs).len() >= 3,
            "{name}: attached programs have links (positive control for the fault test)"
        );
        // Every id seen in fdinfo is really loaded (the check below is not vacuous).
        let loaded = loaded_map_ids();
        assert!(maps.iter().all(|m| loaded.contains(m)), "{name}: {maps:?}");
        let (status, took) = exporter.stop_with(signal);
        assert!(status.success(), "{name}: exit status {status}");
        assert!(took < Duration::from_secs(5), "{name}: took {took:?}");
        let gone = eventually(Duration::from_secs(5), || {
            let p = loaded_program_ids();
            let m = loaded_map_ids();
            let left: Vec<u64> = programs
                .iter()
                .chain(maps.iter())
                .copied()
                .filter(|id| p.contains(id) || m.contains(id))
                .collect();
            left.is_empty().then_some(())
        });
        assert!(
            gone.is_some(),
            "{name}: programs {programs:?} / maps {maps:?} still loaded after exit"
        );
    }
}

/// The stop is told truthfully: "stopped; all probes detached" comes only once the exporter
/// holds no program and no program has a link left (read the moment the line arrives, while the
/// process may still be exiting); it counts the programs the agent held (the
/// `sysscope_probe_attached` series it served), and the kernel then frees them (bpftool).
#[test]
fn sigterm_says_the_probes_are_detached_only_after_they_are() {
    if !require_root("sigterm_says_the_probes_are_detached_only_after_they_are") {
        return;
    }
    let _node = share_node();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sysscope.toml");
    std::fs::write(&config, TEST_CONFIG).unwrap();
    let port = free_port();
    let mut child = Command::new(sysscope_bin())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--config.file={}", config.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sysscope");
    let pid = child.id();
    // Each log line, with what of the exporter's programs was left when the line was read:
    // those it still held open, and those still linked to a tracepoint.
    let (lines, received) = std::sync::mpsc::channel::<(String, Vec<u64>)>();
    let stderr = child.stderr.take().unwrap();
    let programs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let ours = programs.clone();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let ours = ours.lock().unwrap().clone();
            let mut left = bpf_program_ids_of(pid);
            left.extend(links_of(&ours));
            let _ = lines.send((line, left));
        }
    });
    let ready = eventually(Duration::from_secs(30), || {
        matches!(http_get(port, "/-/ready", None), Ok((200, _, _))).then_some(())
    });
    assert!(ready.is_some(), "sysscope not ready");
    let (status, _, body) = http_get(port, "/metrics", None).expect("scrape");
    assert_eq!(status, 200);
    let attached = select(&parse_samples(&body), "sysscope_probe_attached", &[]).len();
    *programs.lock().unwrap() = bpf_program_ids_of(pid);
    assert!(
        programs.lock().unwrap().len() >= 3 && attached >= 3,
        "positive control: programs {:?}, {attached} attached series",
        programs.lock().unwrap()
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait sysscope");
    reader.join().unwrap();
    assert!(status.success(), "exit status {status}");
    let log: Vec<(String, Vec<u64>)> = received.try_iter().collect();
    let text: Vec<&str> = log.iter().map(|(l, _)| l.as_str()).collect();
    let stopped = log
        .iter()
        .position(|(l, _)| l.contains("stopped; all probes detached"))
        .unwrap_or_else(|| panic!("no stop line in {text:#?}"));
    let term = log
        .iter()
        .position(|(l, _)| l.contains("SIGTERM received"))
        .unwrap_or_else(|| panic!("no SIGTERM line in {text:#?}"));
    assert!(term < stopped, "{text:#?}");
    assert_eq!(
        log[stopped].1,
        Vec::<u64>::new(),
        "programs held or linked when the exporter said they were detached: {}",
        log[stopped].0
    );
    assert!(
        log[stopped].0.contains(&format!("programs={attached}")),
        "the stop line counts the {attached} programs: {}",
        log[stopped].0
    );
    let ours = programs.lock().unwrap().clone();
    let freed = eventually(Duration::from_secs(5), || {
        let loaded = loaded_program_ids();
        ours.iter().all(|id| !loaded.contains(id)).then_some(())
    });
    assert!(freed.is_some(), "programs {ours:?} left behind after exit");
}

#[test]
fn restart_on_the_same_port_resumes_cleanly() {
    if !require_root("restart_on_the_same_port_resumes_cleanly") {
        return;
    }
    let port = free_port();
    for round in 0..2 {
        let mut exporter = Exporter::start_on(port, TEST_CONFIG, &[]);
        // A client holding a keep-alive connection while the exporter stops must not keep
        // the port from being reused.
        let _idle = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let cg = TestCgroup::new("sysscope-test-restart");
        let n = 100 + round * 11;
        run_workload_joined(&cg, &["getppid", &n.to_string()]);
        let samples = parse_samples(&exporter.scrape());
        assert_eq!(getppid_calls(&samples, &cg), n as f64, "round {round}");
        let (status, _) = exporter.stop();
        assert!(status.success(), "round {round}: {status}");
    }
}

#[test]
fn a_second_instance_on_the_same_port_fails_clearly() {
    if !require_root("a_second_instance_on_the_same_port_fails_clearly") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let out = Command::new(sysscope_bin())
        .arg(format!("--web.listen-address=127.0.0.1:{}", exporter.port))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", exporter.port))
            && stderr.contains("in use")
            && stderr.contains("another sysscope"),
        "{stderr}"
    );
    // The first one is unaffected.
    assert!(parse_samples(&exporter.scrape()).len() > 10);
}

fn status_of(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn hostile_http_gets_clear_errors_and_no_panic() {
    if !require_root("hostile_http_gets_clear_errors_and_no_panic") {
        return;
    }
    let mut exporter = Exporter::start(TEST_CONFIG, &[]);
    let port = exporter.port;
    let t = Duration::from_secs(15);
    let ask = |bytes: &[u8]| raw_request(port, bytes, t).expect("request");

    // Not HTTP at all.
    assert_eq!(status_of(&ask(b"HELLO THERE\r\n\r\n")), 400);
    assert_eq!(status_of(&ask(b"\x00\x01\x02\xff\r\n\r\n")), 400);
    // Oversized headers: one huge header, and too many small ones.
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    assert_eq!(status_of(&ask(huge.as_bytes())), 431);
    let mut many = String::from("GET /metrics HTTP/1.1\r\nHost: x\r\n");
    for i in 0..500 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    assert_eq!(status_of(&ask(many.as_bytes())), 431);
    // A very long URI.
    let long = format!(
        "GET /metrics?{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "q".repeat(100 * 1024)
    );
    let s = status_of(&ask(long.as_bytes()));
    assert!(s == 414 || s == 431, "long URI: {s}");
    // Methods other than GET and HEAD.
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"] {
        let a = ask(
            format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(status_of(&a), 405, "{method}: {a}");
        assert!(a.to_ascii_lowercase().contains("allow: get, head"), "{a}");
    }
    // Unexpected query strings are ignored; unknown paths are 404.
    let (s, _, body) = http_get(port, "/metrics?name[]=x&format=json&%ff=%00", None).unwrap();
    assert_eq!(s, 200);
    assert!(body.contains("sysscope_build_info"));
    // Raw: a client would normalize the dot segments away before sending them.
    assert_eq!(
        status_of(&ask(
            b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )),
        404
    );
    assert_eq!(http_get(port, "/metrics/extra", None).unwrap().0, 404);
    // Odd but valid requests: HTTP/1.0 without Host, strange Accept, non-UTF-8 header bytes.
    assert_eq!(
        status_of(&ask(b"GET /metrics HTTP/1.0\r\n\r\n")),
        200,
        "HTTP/1.0"
    );
    let a = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;q=NaN, */*;q=1e999, ;;;,\r\nConnection: close\r\n\r\n");
    assert_eq!(status_of(&a), 200, "{a}");
    let a =
        ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: \xff\xfe\r\nConnection: close\r\n\r\n");
    assert_eq!(status_of(&a), 200);
    // Broken framing: a bad chunked body, and an HTTP/2 preface followed by garbage.
    let a = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    assert!(matches!(status_of(&a), 0 | 200 | 400), "{a}");
    let _ = raw_request(
        port,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00garbage-garbage-garbage",
        Duration::from_secs(5),
    );
    // A client that connects and says nothing does not block others.
    let _silent = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();

    // Still alive and serving.
    assert!(
        exporter.child.try_wait().unwrap().is_none(),
        "exporter died"
    );
    assert!(parse_samples(&exporter.scrape()).len() > 10);
    let (status, _) = exporter.stop();
    assert!(status.success());
}

// Malformed configuration: rejected before anything is loaded, naming the key (no root).

fn run_with_config(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(sysscope_bin())
        .arg(format!("--config.file={}", path.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn malformed_config_files_are_rejected_naming_the_key() {
    let cases: &[(&str, &[&str])] = &[
        ("[limits]\nmax_seriess = 10\n", &["max_seriess"]),
        ("[nonsense]\nx = 1\n", &["nonsense"]),
        (
            "[limits]\nmax_series = \"many\"\n",
            &["max_series", "line 2"],
        ),
        ("[limits]\nmax_series = 5\n", &["limits.max_series", "5"]),
        ("[limits]\nmax_series = -5\n", &["max_series"]),
        ("[limits]\nmax_threads = 99999999999\n", &["max_threads"]),
        (
            "[collection]\nbackground_interval = \"10ms\"\n",
            &["collection.background_interval"],
        ),
        (
            "[collection]\nseries_retention = \"1s\"\n",
            &["collection.series_retention"],
        ),
        ("[collection]\nmin_interval = \"soon\"\n", &["soon"]),
        (
            "[slow_calls]\nring_buffer_bytes = 1000\n",
            &["slow_calls.ring_buffer_bytes"],
        ),
        (
            "[slow_calls]\nexclude = [\"nosuchcall\"]\n",
            &["nosuchcall"],
        ),
        (
            "[kubernetes]\npod_watch = \"sometimes\"\n",
            &["kubernetes.pod_watch"],
        ),
        ("[block_io]\ntracepoints = []\n", &["block_io.tracepoints"]),
        ("[syscalls]\nhistogram_resolution = \"log3\"\n", &["log3"]),
        ("limits = 5\n", &["limits"]),
        ("[limits\nmax_series = 1\n", &["line 1"]),
        ("\u{0}\u{1}\u{2}", &["config file"]),
    ];
    for (text, wants) in cases {
        let (code, stderr) = run_with_config(text);
        assert_eq!(code, Some(2), "{text:?}: {stderr}");
        for want in *wants {
            assert!(stderr.contains(want), "{text:?}: `{want}` not in: {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{text:?}: {stderr}");
    }
    // A missing file names the file.
    let out = Command::new(sysscope_bin())
        .arg("--config.file=/nonexistent/sysscope.toml")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("/nonexistent/sysscope.toml"), "{stderr}");
}

#[test]
fn malformed_web_config_files_are_rejected_naming_the_key() {
    let cases: &[(&str, &str)] = &[
        ("tls_server_config:\n  cert_fil: a\n", "cert_fil"),
        (
            "tls_server_config:\n  cert_file: a.pem\n",
            "tls_server_config.key_file",
        ),
        (
            "tls_server_config:\n  cert_file: /nonexistent/a.pem\n  key_file: /nonexistent/a.key\n",
            "/nonexistent/a.pem",
        ),
        (
            "basic_auth_users:\n  alice: hunter2\n",
            "basic_auth_users.alice",
        ),
        ("basic_auth_users: 7\n", "basic_auth_users"),
        // Cost 31 would take days per check (every first login): refused at load.
        (
            "basic_auth_users:\n  alice: '$2y$31$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy'\n",
            "bcrypt cost 31 of user `alice` is above 16",
        ),
        (
            "http_server_config:\n  headers:\n    Server: me\n",
            "http_server_config.headers.Server",
        ),
        ("tls_server_config: [\n", "web"),
    ];
    for (text, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, text).unwrap();
        let out = Command::new(sysscope_bin())
            .arg(format!("--web.config.file={}", path.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{}", free_port()))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {stderr}");
        assert!(stderr.contains(want), "{text:?}: `{want}` not in: {stderr}");
        assert!(stderr.contains("--web.config.file"), "{stderr}");
    }
}

#[test]
fn a_connection_flood_is_capped_and_recovers() {
    if !require_root("a_connection_flood_is_capped_and_recovers") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let cap = sysscope::exposition::http::MAX_CONNECTIONS;
    // Idle connections up to the cap (each is accepted and waits for a request head).
    let mut idle: Vec<std::net::TcpStream> = (0..cap)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", exporter.port)).unwrap())
        .collect();
    // A client beyond the cap is served: an idle connection makes room for it...
    let (status, _, _) = http_get(exporter.port, "/-/healthy", None).unwrap();
    assert_eq!(status, 200, "a client beyond the cap was not served");
    // ...so the cap still holds: the server closed at least one of the idle ones.
    let mut closed = 0;
    for s in idle.iter_mut() {
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut b = [0u8; 1];
        if matches!(std::io::Read::read(s, &mut b), Ok(0)) {
            closed += 1;
        }
    }
    assert!(closed >= 1, "no idle connection was closed to make room");
    let sockets = std::fs::read_dir(format!("/proc/{}/fd", exporter.child.id()))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("socket:"))
        .count();
    assert!(
        sockets <= cap + 8,
        "the exporter holds {sockets} sockets with a cap of {cap}"
    );
    // And once the flood goes away, service goes on.
    drop(idle);
    let served = eventually(Duration::from_secs(10), || {
        http_get(exporter.port, "/-/healthy", None)
            .ok()
            .filter(|r| r.0 == 200)
    });
    assert!(served.is_some(), "not serving after the flood ended");
}

#[test]
fn sigterm_under_fifty_concurrent_scrapers_exits_cleanly() {
    if !require_root("sigterm_under_fifty_concurrent_scrapers_exits_cleanly") {
        return;
    }
    let mut exporter = Exporter::start(TEST_CONFIG, &[]);
    let pid = exporter.child.id();
    let programs = bpf_program_ids_of(pid);
    let maps = bpf_map_ids_of(pid);
    let mut wrk = Command::new("wrk")
        .args(["-t2", "-c50", "-d8s", "--timeout", "5s"])
        .arg(format!("http://127.0.0.1:{}/metrics", exporter.port))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("wrk is not installed: run scripts/setup.sh --test");
    std::thread::sleep(Duration::from_secs(2));
    let (status, took) = exporter.stop();
    let _ = wrk.kill();
    let _ = wrk.wait();
    assert!(status.success(), "exit status under load: {status}");
    assert!(
        took < Duration::from_secs(5),
        "took {took:?} to stop under load"
    );
    let gone = eventually(Duration::from_secs(5), || {
        let p = loaded_program_ids();
        let m = loaded_map_ids();
        (!programs.iter().any(|id| p.contains(id)) && !maps.iter().any(|id| m.contains(id)))
            .then_some(())
    });
    assert!(
        gone.is_some(),
        "programs or maps left behind after SIGTERM under load"
    );
}
