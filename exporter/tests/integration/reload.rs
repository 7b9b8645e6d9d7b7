//! Configuration reload without restart (SIGHUP and `POST /-/reload`): live keys take effect on
//! the real probes, restart-only keys and bad files are refused with the running configuration
//! kept, every outcome is counted, and the endpoint sits behind basic auth. The web config file
//! (users, headers) applies when it changes, and a broken one fails closed.

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::Command,
    time::Duration,
};

use base64::Engine as _;

use crate::common::*;

const BASE: &str = "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n";

/// Slow calls are sampled only from 1 h: nothing is, unless a reload lowers a threshold.
fn config(extra: &str) -> String {
    format!("{BASE}[slow_calls]\nthreshold = \"1h\"\n{extra}")
}

/// `METHOD path` with optional basic credentials: (status, raw head, body); status 0 while
/// nothing listens.
fn request(
    port: u16,
    method: &str,
    path: &str,
    credentials: Option<(&str, &str)>,
) -> (u16, String, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = credentials
        .map(|(user, password)| {
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Authorization: Basic {token}\r\n")
        })
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (status, head.to_string(), body.to_string())
}

/// `POST path` with optional basic credentials: (status, body).
fn post(port: u16, path: &str, credentials: Option<(&str, &str)>) -> (u16, String) {
    let (status, _, body) = request(port, "POST", path, credentials);
    (status, body)
}

/// `GET path` with optional basic credentials: (status, raw head).
fn get_as(port: u16, path: &str, credentials: Option<(&str, &str)>) -> (u16, String) {
    let (status, head, _) = request(port, "GET", path, credentials);
    (status, head)
}

fn reloads(exporter: &Exporter, result: &str) -> f64 {
    sum(
        &parse_samples(&exporter.scrape()),
        "sysscope_config_reloads_total",
        &[("result", result)],
    )
}

/// Slow `read`s at `/api/v1/slow-calls` from process `pid`.
fn slow_reads_of(exporter: &Exporter, pid: u32) -> usize {
    let (_, _, body) = http_get(exporter.port, "/api/v1/slow-calls", None).unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["slow_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .filter(|c| {
                    c["name"] == "read" && c["attributes"]["process.pid"] == serde_json::json!(pid)
                })
                .count()
        })
        .unwrap_or(0)
}

/// A child making three 40 ms pipe reads; its pid.
fn slow_reader() -> u32 {
    let child = Command::new(workload_bin())
        .args(["slow-pipe-read", "3", "40"])
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    pid
}

fn hangup(exporter: &Exporter) {
    // SAFETY: a signal to our own child, which is alive.
    let sent = unsafe { libc::kill(exporter.child.id() as i32, libc::SIGHUP) };
    assert_eq!(sent, 0);
}

#[test]
fn sighup_applies_live_keys_and_keeps_the_config_on_refusal() {
    if !require_root("sighup_applies_live_keys_and_keeps_the_config_on_refusal") {
        return;
    }
    let exporter = Exporter::start(&config(""), &[]);
    // Before: no slow read is sampled (threshold 1 h).
    let before = slow_reader();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(slow_reads_of(&exporter, before), 0);

    // A live key: reads from 20 ms are sampled from now on, in the kernel.
    std::fs::write(
        &exporter.config,
        config("[slow_calls.thresholds]\nread = \"20ms\"\n"),
    )
    .unwrap();
    hangup(&exporter);
    eventually(Duration::from_secs(10), || {
        (reloads(&exporter, "success") == 1.0).then_some(())
    })
    .expect("the SIGHUP reload never succeeded");
    let after = slow_reader();
    eventually(Duration::from_secs(10), || {
        (slow_reads_of(&exporter, after) == 3).then_some(())
    })
    .expect("the reloaded read threshold did not sample the three slow reads");
    let samples = parse_samples(&exporter.scrape());
    assert_eq!(
        sum(&samples, "sysscope_config_last_reload_successful", &[]),
        1.0
    );

    // A key that needs a restart (a map size) next to a live one: refused as a whole, named,
    // counted; the running configuration stays (the read threshold still samples, the new
    // global threshold of 1 ms does not apply).
    std::fs::write(
        &exporter.config,
        format!(
            "{BASE}max_syscall_entries = 4096\n[slow_calls]\nthreshold = \"1ms\"\n\
             [slow_calls.thresholds]\nread = \"20ms\"\n"
        ),
    )
    .unwrap();
    let (status, body) = post(exporter.port, "/-/reload", None);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("limits.max_syscall_entries") && body.contains("restart"),
        "{body}"
    );
    assert!(!body.contains("slow_calls.threshold"), "{body}");
    let samples = parse_samples(&exporter.scrape());
    assert_eq!(
        sum(
            &samples,
            "sysscope_config_reloads_total",
            &[("result", "failure")]
        ),
        1.0
    );
    assert_eq!(
        sum(&samples, "sysscope_config_last_reload_successful", &[]),
        0.0
    );
    let kept = slow_reader();
    eventually(Duration::from_secs(10), || {
        (slow_reads_of(&exporter, kept) == 3).then_some(())
    })
    .expect("the running read threshold was lost by a refused reload");

    // A bad value: refused, naming the key; a GET is not a reload.
    std::fs::write(
        &exporter.config,
        format!("{BASE}[slow_calls]\nthreshold = 5\n"),
    )
    .unwrap();
    let (status, body) = post(exporter.port, "/-/reload", None);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("threshold"), "{body}");
    let (status, _, _) = http_get(exporter.port, "/-/reload", None).unwrap();
    assert_eq!(status, 405);
    assert_eq!(reloads(&exporter, "failure"), 2.0);
    assert_eq!(reloads(&exporter, "success"), 1.0);
}

#[test]
fn post_reload_is_behind_basic_auth() {
    if !require_root("post_reload_is_behind_basic_auth") {
        return;
    }
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, format!("basic_auth_users:\n  ops: '{hash}'\n")).unwrap();
    let port = free_port();
    let mut exporter = Exporter::spawn_on(
        port,
        &config(""),
        &[&format!("--web.config.file={}", web.display())],
    );
    exporter.wait_for(|| matches!(http_get(port, "/metrics", None), Ok((401, _, _))));
    std::fs::write(
        &exporter.config,
        "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 20000\n\
         [slow_calls]\nthreshold = \"1h\"\n",
    )
    .unwrap();
    let (status, _) = post(port, "/-/reload", None);
    assert_eq!(status, 401);
    let (status, _) = post(port, "/-/reload", Some(("ops", "wrong")));
    assert_eq!(status, 401);
    let (status, body) = post(port, "/-/reload", Some(("ops", "s3cret")));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("limits.max_series"), "{body}");
}

/// Replaces `path` the way Kubernetes updates a mounted Secret: a new file renamed over it.
fn replace(path: &std::path::Path, text: impl AsRef<[u8]>) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

#[test]
fn web_config_changes_apply_without_restart() {
    if !require_root("web_config_changes_apply_without_restart") {
        return;
    }
    let users = |password: &str, extra: &str| {
        let hash = bcrypt::hash(password, 4).unwrap();
        format!("basic_auth_users:\n  ops: '{hash}'\n{extra}")
    };
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, users("old", "")).unwrap();
    let port = free_port();
    let mut exporter = Exporter::spawn_on(
        port,
        &config(""),
        &[&format!("--web.config.file={}", web.display())],
    );
    exporter.wait_for(|| get_as(port, "/metrics", Some(("ops", "old"))).0 == 200);
    assert_eq!(get_as(port, "/metrics", None).0, 401);

    // A rotated password (and a new header) apply within a couple of seconds, and the old
    // password stops working: no restart.
    replace(
        &web,
        users(
            "new",
            "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
        ),
    );
    let rotated = eventually(Duration::from_secs(10), || {
        (get_as(port, "/metrics", Some(("ops", "new"))).0 == 200).then_some(())
    });
    assert!(rotated.is_some(), "the new password was not accepted");
    assert_eq!(get_as(port, "/metrics", Some(("ops", "old"))).0, 401);
    let (status, head) = get_as(port, "/metrics", Some(("ops", "new")));
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase().contains("x-frame-options: deny"),
        "{head}"
    );

    // A broken file fails closed, with neither password, until it is fixed.
    replace(&web, "basic_auth_users: [\n");
    let refused = eventually(Duration::from_secs(10), || {
        (get_as(port, "/metrics", Some(("ops", "new"))).0 == 500).then_some(())
    });
    assert!(refused.is_some(), "an invalid web config was not refused");
    assert_eq!(get_as(port, "/metrics", Some(("ops", "old"))).0, 500);
    replace(&web, users("fixed", ""));
    let fixed = eventually(Duration::from_secs(10), || {
        (get_as(port, "/metrics", Some(("ops", "fixed"))).0 == 200).then_some(())
    });
    assert!(fixed.is_some(), "the fixed web config was not applied");
    assert_eq!(get_as(port, "/metrics", Some(("ops", "new"))).0, 401);
}

/// `--collector.<name>` / `--no-collector.<name>` win over the file's keys, at start and at
/// every reload: a file that turns the CPU collector off and block I/O and the GPU on runs with
/// CPU on and block I/O and the GPU off (no `gpu` row at all, where an enabled GPU collector
/// without NVML reports 0), and reloading it (or a version that flips those keys) changes
/// nothing.
#[test]
fn collector_flags_win_over_the_file_across_reloads() {
    if !require_root("collector_flags_win_over_the_file_across_reloads") {
        return;
    }
    let file = |cpu: bool, block_io: bool| {
        config(&format!(
            "[cpu]\nenabled = {cpu}\n[block_io]\nenabled = {block_io}\n[gpu]\nenabled = true\n"
        ))
    };
    let exporter = Exporter::start(
        &file(false, true),
        &[
            "--collector.cpu",
            "--no-collector.block_io",
            "--no-collector.gpu",
        ],
    );
    let collectors = || {
        let mut up: Vec<(String, f64)> = parse_samples(&exporter.scrape())
            .into_iter()
            .filter(|s| s.name == "sysscope_collector_up")
            .map(|s| (s.labels["collector"].clone(), s.value))
            .collect();
        up.sort_by(|a, b| a.0.cmp(&b.0));
        up
    };
    let want = vec![("cpu".to_string(), 1.0), ("syscalls".to_string(), 1.0)];
    assert_eq!(collectors(), want);
    // The same file again, then one whose collector keys say the opposite: the flags still
    // decide, so neither is a change (which would need a restart).
    for (cpu, block_io) in [(false, true), (true, false), (false, true)] {
        std::fs::write(&exporter.config, file(cpu, block_io)).unwrap();
        let (status, body) = post(exporter.port, "/-/reload", None);
        assert_eq!(status, 200, "{body}");
        assert_eq!(collectors(), want);
    }
    assert_eq!(reloads(&exporter, "success"), 3.0);
}
