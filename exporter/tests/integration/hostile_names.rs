//! Names a tenant chooses (its process name, the name of a cgroup it may create) must never
//! break the exposition for the node: both formats parse with promtool and the reference
//! parsers, and every name comes back intact (control characters shown as `?`).

use std::{
    ffi::OsStr,
    os::unix::ffi::OsStrExt,
    path::PathBuf,
    process::{Command, Stdio},
};

use crate::common::*;

/// A cgroup directory with an arbitrary byte name, removed on drop.
struct RawCgroup {
    dir: PathBuf,
}

impl RawCgroup {
    fn new(name: &[u8]) -> Self {
        let dir = cgroup_root().join(OsStr::from_bytes(name));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self { dir }
    }

    /// Runs the workload inside, named `comm`, making `calls` getppid calls.
    fn run(&self, comm: &str, calls: u64) {
        let status = command_in_cgroup(&self.dir, workload_bin())
            .args(["set-name", comm, "getppid", &calls.to_string()])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "workload in {}", self.dir.display());
    }
}

impl Drop for RawCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn hostile_process_and_cgroup_names_keep_both_formats_valid() {
    if !require_root("hostile_process_and_cgroup_names_keep_both_formats_valid") {
        return;
    }
    let exporter = Exporter::start(
        "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n",
        &[],
    );
    let tag = format!("{}{}", std::process::id(), rand_suffix());
    // (cgroup name bytes, comm, what the cgroup label must read, what comm must read).
    let cases: Vec<(Vec<u8>, &str, String, &str)> = vec![
        (
            format!("hash # {{x{tag}").into_bytes(),
            "ok # {evil",
            format!("/hash # {{x{tag}"),
            "ok # {evil",
        ),
        (
            format!("q\"uote\\{tag}").into_bytes(),
            "q\"uote\\",
            format!("/q\"uote\\{tag}"),
            "q\"uote\\",
        ),
        (
            format!("# HELP y{tag}").into_bytes(),
            "# HELP x",
            format!("/# HELP y{tag}"),
            "# HELP x",
        ),
        (
            format!("}}{{a=\"b\"{tag}").into_bytes(),
            "}{a=\"b\"",
            format!("/}}{{a=\"b\"{tag}"),
            "}{a=\"b\"",
        ),
        (
            format!("ctl\t\r\x01\x7f{tag}").into_bytes(),
            "c\x01t\x7fl",
            format!("/ctl????{tag}"),
            "c?t?l",
        ),
        (
            [b"bad\xffutf8".as_slice(), tag.as_bytes()].concat(),
            "caf\u{e9}",
            format!("/bad\u{fffd}utf8{tag}"),
            "caf\u{e9}",
        ),
    ];
    let mut groups = Vec::new();
    for (i, (name, comm, _, _)) in cases.iter().enumerate() {
        let cg = RawCgroup::new(name);
        cg.run(comm, 100 + i as u64);
        groups.push(cg);
    }
    let text = exporter.scrape();
    let om = exporter.scrape_openmetrics();

    let (_dir, text_path, om_path) = exposition_files(&text, &om);
    let out = promtool_check_metrics(&text_path);
    // promtool lints naming conventions too (on stdout); only a parse error fails.
    assert!(
        out.status.success()
            || !String::from_utf8_lossy(&out.stderr).contains("error while linting"),
        "promtool rejected the 0.0.4 text:\n{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );

    // Both reference parsers, printing every (cgroup, comm, value) of getppid as JSON.
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
def rows(families):
    out = []
    for f in families:
        for s in f.samples:
            if s.name == "sysscope_syscalls_total" and s.labels.get("syscall") == "getppid":
                out.append([s.labels["cgroup"], s.labels["comm"], s.value])
    return out
print(json.dumps({"text": rows(text_string_to_metric_families(open(sys.argv[1], encoding="utf-8").read())),
                  "om": rows(om_families(open(sys.argv[2], encoding="utf-8").read()))}))
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&text_path)
        .arg(&om_path)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "the reference parsers rejected the exposition:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for format in ["text", "om"] {
        let rows = parsed[format].as_array().unwrap();
        for (i, (_, _, cgroup, comm)) in cases.iter().enumerate() {
            let found = rows.iter().any(|r| {
                r[0] == cgroup.as_str() && r[1] == *comm && r[2].as_f64() == Some(100.0 + i as f64)
            });
            assert!(
                found,
                "{format}: no getppid series for cgroup {cgroup:?} comm {comm:?} with {} calls; parsed rows of these cgroups: {:?}",
                100 + i,
                rows.iter().filter(|r| r[0].as_str().is_some_and(|c| c.contains(&tag))).collect::<Vec<_>>()
            );
        }
    }
}
