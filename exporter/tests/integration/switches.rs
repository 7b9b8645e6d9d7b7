//! Every documented switch loads: each case of `scripts/vm/data/switches.txt` (a setting of a
//! configuration key that changes what sysscope loads into the kernel or starts) gives a
//! `--config.check` with every enabled collector up and every program attached, and an
//! exporter that counts a child's calls exactly, on the kernel the tests run on. The VM
//! scenario `basic` walks the same cases on every kernel of the matrix. That list is held to
//! docs/configuration.md: every boolean or enumerated key is there in each value other than
//! its default, or named here as changing nothing that is loaded or started.

use std::collections::BTreeSet;

use crate::common::*;

const CASES: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../scripts/vm/data/switches.txt"
));
const REFERENCE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/configuration.md"
));

/// Keys (a `section.` prefix, a key, or `key = value`) of docs/configuration.md that change
/// nothing the kernel is given and start or stop no collector, and why.
const LOADS_NOTHING: &[(&str, &str)] = &[
    (
        "labels.",
        "labels are given to series in user space, as the maps are read",
    ),
    ("exposition.", "the form a scrape gets"),
    ("otlp.", "where and how collected data is sent"),
    (
        "syscalls.histogram_resolution",
        "bucket bounds are applied in user space, as the maps are read",
    ),
    (
        "slow_calls.proc_fallback",
        "capabilities kept after start-up (security tests), not what is loaded",
    ),
    (
        "kubernetes.pod_watch = \"on\"",
        "needs a Kubernetes API server and a node name (pods tests)",
    ),
];

/// The collectors whose `<name>.enabled` key turns them on and off, on by default.
const SWITCHED_COLLECTORS: [&str; 3] = ["syscalls", "block_io", "cpu"];

struct Case {
    name: String,
    /// `kernel` or `host` (see switches.txt).
    place: String,
    /// `section.key = value`, spacing as written.
    settings: Vec<String>,
}

impl Case {
    /// The case as a config file, with `extra` dotted keys first.
    fn toml(&self, extra: &[&str]) -> String {
        let mut lines: Vec<&str> = extra.to_vec();
        lines.extend(self.settings.iter().map(String::as_str));
        lines.join("\n") + "\n"
    }

    /// Whether the case sets `key` to `value` (TOML spelling).
    fn sets(&self, key: &str, value: &str) -> bool {
        self.settings
            .iter()
            .any(|s| normalize(s) == format!("{key} = {value}"))
    }

    fn collector_enabled(&self, collector: &str) -> bool {
        !self.sets(&format!("{collector}.enabled"), "false")
    }
}

/// `key = value` with single spaces around `=`.
fn normalize(setting: &str) -> String {
    match setting.split_once('=') {
        Some((k, v)) => format!("{} = {}", k.trim(), v.trim()),
        None => setting.trim().to_string(),
    }
}

fn cases() -> Vec<Case> {
    CASES
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|line| {
            let line = line.trim();
            let (name, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let rest = rest.trim_start();
            let (place, settings) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            Case {
                name: name.to_string(),
                place: place.to_string(),
                settings: settings
                    .split(';')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            }
        })
        .collect()
}

/// Every boolean or enumerated key of the configuration reference: (`section.key`, its
/// values in TOML spelling, its default in TOML spelling or "" when unset).
fn documented_switches() -> Vec<(String, Vec<String>, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in REFERENCE.lines() {
        if let Some(s) = line
            .strip_prefix("## `[")
            .and_then(|s| s.strip_suffix("]`"))
        {
            section = s.to_string();
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `key` | type | default | allowed | reload |
        if cells.len() != 7 || !cells[1].starts_with('`') || section.is_empty() {
            continue;
        }
        let key = format!("{section}.{}", cells[1].trim_matches('`'));
        let default = if cells[3] == "unset" {
            String::new()
        } else {
            cells[3].trim_matches('`').to_string()
        };
        let values: Vec<String> = match cells[2] {
            "boolean" => vec!["true".into(), "false".into()],
            // An enumeration is a list of quoted words and nothing else.
            "string"
                if cells[4].starts_with('"')
                    && cells[4]
                        .split(", ")
                        .all(|v| v.len() > 2 && v.starts_with('"') && v.ends_with('"')) =>
            {
                cells[4].split(", ").map(str::to_string).collect()
            }
            _ => continue,
        };
        out.push((key, values, default));
    }
    out
}

/// The list covers every documented switch in every value, and each case is a valid config.
/// (Needs no root: a key renamed or a value added in the reference fails here first.)
#[test]
fn every_documented_switch_is_walked() {
    let cases = cases();
    let switches = documented_switches();
    // The parser found the reference's switches (not a silently empty walk).
    for key in [
        "syscalls.time_by_state",
        "collection.probe_stats",
        "block_io.latency_by_cgroup",
        "kubernetes.pod_watch",
    ] {
        assert!(
            switches.iter().any(|(k, _, _)| k == key),
            "{key} not found in docs/configuration.md"
        );
    }
    let mut names = BTreeSet::new();
    for case in &cases {
        assert!(names.insert(&case.name), "case {} twice", case.name);
        assert!(
            case.place == "kernel" || case.place == "host",
            "case {}: `{}` is neither kernel nor host",
            case.name,
            case.place
        );
        if let Err(e) = sysscope::config::Config::parse(&case.toml(&[]), &case.name) {
            panic!("case {}: {e}", case.name);
        }
    }
    assert!(names.contains(&"defaults".to_string()));
    let mut missing = Vec::new();
    for (key, values, default) in &switches {
        for value in values.iter().filter(|v| *v != default) {
            let exempt = LOADS_NOTHING.iter().any(|(what, _)| {
                *what == format!("{key} = {value}")
                    || *what == key
                    || (what.ends_with('.') && key.starts_with(what))
            });
            if !exempt && !cases.iter().any(|c| c.sets(key, value)) {
                missing.push(format!("{key} = {value}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "documented switches in no case of scripts/vm/data/switches.txt (add a case, or name \
         the key in LOADS_NOTHING with why it loads nothing): {missing:?}"
    );
}

/// What `--config.check` says that is wrong for `case`, empty when nothing is.
fn check_problems(case: &Case, code: i32, stdout: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    if code != 0 {
        wrong.push(format!("exit code {code}"));
    }
    if !stdout.lines().any(|l| l == "configuration OK: yes") {
        wrong.push("not `configuration OK: yes`".into());
    }
    for line in stdout.lines() {
        if line.starts_with("FAILED ")
            || (line.starts_with("collector ") && line.contains(" failed:"))
        {
            wrong.push(line.to_string());
        }
    }
    for collector in SWITCHED_COLLECTORS {
        let up = format!("collector {collector}: up");
        let listed = stdout
            .lines()
            .any(|l| l.starts_with(&format!("collector {collector}:")));
        let programs = stdout
            .lines()
            .any(|l| l.ends_with(&format!(" collector={collector}")));
        if case.collector_enabled(collector) {
            if !stdout.lines().any(|l| l == up) {
                wrong.push(format!("`{up}` missing"));
            }
        } else if listed || programs {
            wrong.push(format!("{collector} is off but was started or loaded"));
        }
    }
    // The GPU collector runs without a GPU but is down without one: only a failure (a GPU on
    // the bus and no NVML) is wrong, and that is a `failed:` line above.
    if !case.collector_enabled("gpu") && stdout.lines().any(|l| l.starts_with("collector gpu:")) {
        wrong.push("gpu is off but was started".into());
    }
    wrong
}

/// `--config.check` with each case: every enabled collector up, every program attached,
/// nothing of a switched-off collector started. Every failing case is listed at once.
#[test]
fn every_documented_switch_loads() {
    if !require_root("every_documented_switch_loads") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for case in cases() {
        let path = dir.path().join(format!("{}.toml", case.name));
        std::fs::write(&path, case.toml(&[])).unwrap();
        let (code, stdout, stderr) = run_sysscope(
            &["--config.file", path.to_str().unwrap(), "--config.check"],
            &[],
        );
        let wrong = check_problems(&case, code, &stdout);
        let attached = stdout
            .lines()
            .filter(|l| l.starts_with("attached "))
            .count();
        eprintln!(
            "switch {:<24} {} ({attached} programs attached){}",
            case.name,
            if wrong.is_empty() { "ok" } else { "FAILED" },
            if wrong.is_empty() {
                String::new()
            } else {
                format!(": {}", wrong.join("; "))
            }
        );
        if !wrong.is_empty() {
            let first_error = stderr
                .lines()
                .find(|l| l.contains("level=error"))
                .unwrap_or("");
            failures.push(format!(
                "{} ({}): {}\n    {first_error}",
                case.name,
                case.settings.join("; "),
                wrong.join("; ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} switch cases do not load:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// The exporter with each case that loads the syscall probes counts a child's getppid
/// calls exactly: a switch that loads must also count.
#[test]
fn every_documented_switch_counts_exactly() {
    if !require_root("every_documented_switch_counts_exactly") {
        return;
    }
    const N: u64 = 1000;
    let mut failures = Vec::new();
    for case in cases()
        .into_iter()
        .filter(|c| c.collector_enabled("syscalls"))
    {
        // Every exporter sees every process of the node: the series budget must not fold this
        // test's series while other tests run.
        let config = case.toml(&[
            "collection.min_interval = \"0s\"",
            "limits.max_series = 10000000",
        ]);
        let exporter = Exporter::start(&config, &[]);
        let cg = TestCgroup::new(&format!("sysscope-test-switch-{}", case.name));
        run_workload_joined(&cg, &["getppid", &N.to_string()]);
        // + 0.0: an empty sum is -0.0, which would print as "-0".
        let got = getppid_calls(&parse_samples(&exporter.scrape()), &cg) + 0.0;
        eprintln!("switch {:<24} getppid {got} of {N}", case.name);
        if got != N as f64 {
            failures.push(format!(
                "{} ({}): {got} getppid of {N}",
                case.name,
                case.settings.join("; ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "switch cases that do not count exactly:\n  {}",
        failures.join("\n  ")
    );
}
