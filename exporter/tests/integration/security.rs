//! Security on the real binary: `--web.config.file` TLS (with and without client
//! certificates) and basic auth against real TLS clients (reqwest/rustls and curl/OpenSSL)
//! with certificates made by the test, the capabilities left after start-up in every thread,
//! the loaded programs' helpers (nothing reads user memory), and the loopback default.

use std::{path::Path, process::Command, time::Duration};

use crate::common::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A CA, a server certificate for 127.0.0.1/localhost, a client certificate from the same CA
/// and one from another CA, as PEM files in a temporary directory (`ca.pem`, `server.pem`,
/// `server.key`).
pub(crate) struct Pki {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) ca: String,
    client: String,
    rogue_client: String,
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, names[0].to_string());
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

pub(crate) fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

pub(crate) fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca1 = ca("sysscope test CA");
    let ca2 = ca("someone else's CA");
    let (server_cert, server_key) = leaf(
        &ca1,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) =
        leaf(&ca1, &["prometheus"], ExtendedKeyUsagePurpose::ClientAuth);
    let (rogue_cert, rogue_key) = leaf(&ca2, &["prometheus"], ExtendedKeyUsagePurpose::ClientAuth);
    std::fs::write(dir.path().join("ca.pem"), ca1.pem()).unwrap();
    std::fs::write(dir.path().join("server.pem"), server_cert).unwrap();
    std::fs::write(dir.path().join("server.key"), server_key).unwrap();
    Pki {
        ca: ca1.pem(),
        client: format!("{client_cert}{client_key}"),
        rogue_client: format!("{rogue_cert}{rogue_key}"),
        dir,
    }
}

pub(crate) fn client(ca: &str, identity: Option<&str>) -> reqwest::blocking::Client {
    tls_provider();
    let mut b = reqwest::blocking::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
        .timeout(Duration::from_secs(20));
    if let Some(id) = identity {
        b = b.identity(reqwest::Identity::from_pem(id.as_bytes()).unwrap());
    }
    b.build().unwrap()
}

fn write_web_config(dir: &Path, text: &str) -> String {
    let path = dir.join("web.yml");
    std::fs::write(&path, text).unwrap();
    format!("--web.config.file={}", path.display())
}

#[test]
fn tls_and_basic_auth_with_real_clients() {
    if !require_root("tls_and_basic_auth_with_real_clients") {
        return;
    }
    let pki = pki();
    // Cost 4 keeps the test fast; production hashes use 10 or more.
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    // Relative paths are relative to the web config file.
    let flag = write_web_config(
        pki.dir.path(),
        &format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_version: TLS13\n\
             basic_auth_users:\n  prometheus: '{hash}'\n\
             http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
        ),
    );
    let port = free_port();
    let mut exporter = Exporter::spawn_on(port, TEST_CONFIG, &[&flag]);
    let https = |path: &str| format!("https://127.0.0.1:{port}{path}");
    let c = client(&pki.ca, None);
    exporter.wait_for(|| {
        c.get(https("/-/ready"))
            .basic_auth("prometheus", Some("s3cret"))
            .send()
            .is_ok_and(|r| r.status() == 200)
    });

    // TLS with the right credentials: 200, the metrics, and the configured header.
    let r = c
        .get(https("/metrics"))
        .basic_auth("prometheus", Some("s3cret"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert!(r.text().unwrap().contains("sysscope_build_info"));
    // No or wrong credentials: 401 with a Basic challenge (and still the header).
    let r = c.get(https("/metrics")).send().unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Basic"));
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    for (user, pass) in [("prometheus", "wrong"), ("nobody", "s3cret"), ("", "")] {
        let r = c
            .get(https("/metrics"))
            .basic_auth(user, Some(pass))
            .send()
            .unwrap();
        assert_eq!(r.status(), 401, "{user}:{pass}");
    }
    // A client that does not trust our CA refuses the server.
    let stranger = client(&ca("unrelated CA").pem(), None);
    assert!(stranger.get(https("/metrics")).send().is_err());

    // Plain HTTP to the TLS port: a readable 400, never the metrics.
    let (status, _, body) = http_get(port, "/metrics", None).unwrap();
    assert_eq!(status, 400);
    assert!(body.contains("HTTPS"), "{body}");
    assert!(!body.contains("sysscope_"));

    // curl (OpenSSL) as a second, independent client; and min_version TLS13 is enforced.
    let curl = |extra: &[&str]| {
        Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "20",
            ])
            .arg("--cacert")
            .arg(pki.dir.path().join("ca.pem"))
            .args(["-u", "prometheus:s3cret"])
            .args(extra)
            .arg(https("/metrics"))
            .output()
            .expect("curl")
    };
    let ok = curl(&[]);
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "200");
    // HTTP/2 is offered through ALPN.
    let h2 = curl(&["--http2", "-w", "%{http_code} %{http_version}"]);
    assert_eq!(String::from_utf8_lossy(&h2.stdout), "200 2");
    let old = curl(&["--tlsv1.2", "--tls-max", "1.2"]);
    assert!(
        !old.status.success(),
        "a TLS 1.2 client was accepted with min_version TLS13"
    );
    assert!(exporter.child.try_wait().unwrap().is_none());
}

#[test]
fn client_certificates_are_required_and_verified() {
    if !require_root("client_certificates_are_required_and_verified") {
        return;
    }
    let pki = pki();
    for (auth_type, anonymous_allowed) in [
        ("RequireAndVerifyClientCert", false),
        ("VerifyClientCertIfGiven", true),
    ] {
        let flag = write_web_config(
            pki.dir.path(),
            &format!(
                "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
                 client_auth_type: {auth_type}\n  client_ca_file: ca.pem\n"
            ),
        );
        let port = free_port();
        let mut exporter = Exporter::spawn_on(port, TEST_CONFIG, &[&flag]);
        let url = format!("https://127.0.0.1:{port}/metrics");
        let good = client(&pki.ca, Some(&pki.client));
        exporter.wait_for(|| good.get(&url).send().is_ok());

        let r = good.get(&url).send().unwrap();
        assert_eq!(r.status(), 200, "{auth_type}");
        assert!(r.text().unwrap().contains("sysscope_build_info"));
        // A certificate from another CA is refused either way: no response at all.
        let rogue = client(&pki.ca, Some(&pki.rogue_client));
        assert!(
            rogue.get(&url).send().is_err(),
            "{auth_type}: untrusted client certificate accepted"
        );
        // Without a certificate: refused unless the certificate is optional.
        let anonymous = client(&pki.ca, None);
        assert_eq!(
            anonymous.get(&url).send().is_ok(),
            anonymous_allowed,
            "{auth_type}: client without a certificate"
        );
        // And the exporter is still fine.
        assert_eq!(good.get(&url).send().unwrap().status(), 200);
        assert!(exporter.child.try_wait().unwrap().is_none());
    }
}

fn status_field(pid: u32, tid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or("")
        .trim()
        .to_string()
}

fn threads_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

#[test]
fn capabilities_are_dropped_in_every_thread_after_start() {
    if !require_root("capabilities_are_dropped_in_every_thread_after_start") {
        return;
    }
    use sysscope::privileges::{CAP_DAC_READ_SEARCH, CAP_SYS_ADMIN, CAP_SYS_PTRACE};
    for (config, expected) in [
        // Default, as root: the /proc fallback of slow-call file names keeps these two, which
        // root holds. Probe statistics are sampled, switched by a helper process: the exporter
        // keeps no CAP_SYS_ADMIN.
        (
            TEST_CONFIG.to_string(),
            (1u64 << CAP_DAC_READ_SEARCH) | (1 << CAP_SYS_PTRACE),
        ),
        // Statistics kept on from the start, file paths from the kernel without the fallback:
        // nothing at all, although root held everything.
        (
            format!("{TEST_CONFIG}probe_stats = \"always\"\n[slow_calls]\nproc_fallback = false\n"),
            0u64,
        ),
    ] {
        let exporter = Exporter::start(&config, &[]);
        let pid = exporter.child.id();
        // Several scrapes: threads of the blocking pool are started by now.
        for _ in 0..3 {
            exporter.scrape();
        }
        let threads = threads_of(pid);
        assert!(threads.len() >= 2, "{threads:?}");
        let hex = |v: &str| u64::from_str_radix(v, 16).unwrap();
        for tid in threads {
            for field in ["CapEff", "CapPrm", "CapBnd"] {
                assert_eq!(
                    hex(&status_field(pid, tid, field)),
                    expected,
                    "thread {tid} {field} (config {config:?})"
                );
            }
            assert_eq!(hex(&status_field(pid, tid, "CapInh")), 0);
            assert_eq!(hex(&status_field(pid, tid, "CapAmb")), 0);
            assert_eq!(status_field(pid, tid, "NoNewPrivs"), "1");
        }
        // The statistics helper (sampled mode, the default) holds CAP_SYS_ADMIN and nothing
        // else; with statistics always on there is no helper at all.
        let helpers: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                    String::from_utf8_lossy(&c).contains(sysscope::kernel::probe_stats::HELPER_ARG)
                }) && status_field(*p, *p, "PPid") == pid.to_string()
            })
            .collect();
        if config == TEST_CONFIG {
            assert_eq!(helpers.len(), 1, "statistics helpers of {pid}: {helpers:?}");
            let helper = helpers[0];
            for field in ["CapEff", "CapPrm", "CapBnd"] {
                assert_eq!(
                    hex(&status_field(helper, helper, field)),
                    1u64 << CAP_SYS_ADMIN,
                    "statistics helper {field}"
                );
            }
            assert_eq!(status_field(helper, helper, "NoNewPrivs"), "1");
        } else {
            assert!(helpers.is_empty(), "a statistics helper with {config:?}");
        }
        // Reading the maps still works without CAP_BPF: exact counts after the drop.
        let cg = TestCgroup::new("sysscope-test-caps");
        run_workload_joined(&cg, &["getppid", "321"]);
        let samples = parse_samples(&exporter.scrape());
        assert_eq!(getppid_calls(&samples, &cg), 321.0);
    }
}

/// A capability drop that fails is fatal: the exporter says why and exits non-zero rather than
/// run on with what it promised to give up.
#[test]
fn a_failed_capability_drop_stops_the_exporter() {
    if !require_root("a_failed_capability_drop_stops_the_exporter") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sysscope.toml");
    std::fs::write(&config, TEST_CONFIG).unwrap();
    let out = Command::new(sysscope_bin())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{}", free_port()))
        .env(sysscope::privileges::FAULT_DROP_ENV, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exited {:?}: {stderr}", out.status);
    assert!(
        stderr.contains("could not drop the capabilities"),
        "no reason given: {stderr}"
    );
}

/// `--config.check` says what the /proc fallback of slow-call file names can do: without its
/// two capabilities (the DaemonSet's CAP_BPF and CAP_PERFMON only) it succeeds, keeps nothing
/// and says the fallback is off for other users' processes; with `proc_fallback = false` root
/// keeps nothing either. (Root with the default is checked with the attached programs.)
#[test]
fn config_check_says_what_the_proc_fallback_keeps() {
    if !require_root("config_check_says_what_the_proc_fallback_keeps") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let check = |wrapper: &[&str], config: &str| {
        let path = dir.path().join("sysscope.toml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(sysscope_bin());
                c
            }
            None => Command::new(sysscope_bin()),
        };
        let out = cmd
            .arg("--config.check")
            .arg(format!("--config.file={}", path.display()))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let daemonset = [
        "setpriv",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all,+bpf,+perfmon",
    ];
    let without = check(&daemonset, TEST_CONFIG);
    assert!(
        without
            .lines()
            .any(|l| l == "capabilities kept after start-up: none"),
        "{without}"
    );
    assert!(
        without.lines().any(|l| l.starts_with(
            "slow-call file names: from the kernel; /proc fallback off for other users' \
             processes (CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE not held at start)"
        ) && l.contains("permission_denied")),
        "{without}"
    );
    let off = check(
        &[],
        &format!("{TEST_CONFIG}[slow_calls]\nproc_fallback = false\n"),
    );
    assert!(
        off.lines()
            .any(|l| l == "capabilities kept after start-up: none"),
        "{off}"
    );
    assert!(
        off.lines().any(|l| l
            == "slow-call file names: from the kernel; /proc fallback off (slow_calls.proc_fallback = false)"),
        "{off}"
    );
}

#[test]
fn loaded_programs_never_read_user_memory() {
    if !require_root("loaded_programs_never_read_user_memory") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let ids = bpf_program_ids_of(exporter.child.id());
    assert!(ids.len() >= 3);
    // Helpers that copy from user memory (syscall buffers, path strings, ...).
    const USER_MEMORY: &[&str] = &[
        "probe_read_user",
        "copy_from_user",
        "bpf_probe_read#",
        "bpf_probe_read_str#",
        "d_path",
    ];
    let mut calls = 0;
    for id in ids {
        let out = Command::new("bpftool")
            .args(["prog", "dump", "xlated", "id", &id.to_string()])
            .output()
            .expect("bpftool");
        let text = String::from_utf8_lossy(&out.stdout);
        calls += text.matches("call ").count();
        for helper in USER_MEMORY {
            assert!(
                !text.contains(helper),
                "program {id} calls {helper}:\n{text}"
            );
        }
    }
    assert!(
        calls > 0,
        "bpftool showed no helper calls: the check would be vacuous"
    );
}

#[test]
fn the_default_listen_address_is_loopback() {
    let out = Command::new(sysscope_bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[default: 127.0.0.1:9812]"), "{help}");
}

#[test]
fn a_rotated_certificate_is_served_without_restart() {
    if !require_root("a_rotated_certificate_is_served_without_restart") {
        return;
    }
    let pki = pki();
    let flag = write_web_config(
        pki.dir.path(),
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n",
    );
    let port = free_port();
    let mut exporter = Exporter::spawn_on(port, TEST_CONFIG, &[&flag]);
    let url = format!("https://127.0.0.1:{port}/-/healthy");
    let old = client(&pki.ca, None);
    exporter.wait_for(|| old.get(&url).send().is_ok());

    // A new CA issues a new certificate; the files are replaced in place.
    let ca2 = ca("rotated CA");
    let (cert, key) = leaf(
        &ca2,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    // Key first, then certificate: in between, the pair does not match and the previous one
    // stays in use. Long enough in between for the files to be read alike twice (once a
    // second), so the mismatched pair is applied, not merely not yet seen.
    std::fs::write(pki.dir.path().join("server.key"), key).unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    // A fresh client, so a new handshake (not a pooled connection) is checked.
    assert_eq!(
        client(&pki.ca, None).get(&url).send().unwrap().status(),
        200,
        "the previous pair must stay in use while the new one does not match"
    );
    std::fs::write(pki.dir.path().join("server.pem"), cert).unwrap();
    let new = client(&ca2.pem(), None);
    let rotated = eventually(Duration::from_secs(10), || {
        new.get(&url).send().ok().filter(|r| r.status() == 200)
    });
    assert!(rotated.is_some(), "the rotated certificate was not served");
    assert!(
        client(&pki.ca, None).get(&url).send().is_err(),
        "the old certificate is still served"
    );
}
