//! Property-based fuzzing (proptest) of every hand-written parser that sees outside input:
//! the TOML config and its durations, the web config (YAML) and the `Authorization` header,
//! cgroup mountinfo parsing and unescaping, `/proc/<pid>/comm` sanitising, `Accept`
//! negotiation, the OpenMetrics -> 0.0.4 rewrite, histogram folding and the series budget.
//! Each property is bounded in cases so the whole file runs in seconds; none needs root.

use std::{path::Path, sync::Arc, time::Duration};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use proptest::prelude::*;
use sysscope::{
    config::{Config, HistogramResolution},
    exposition::{
        format::{openmetrics_to_prometheus_text, Format},
        web_config::{parse_basic, WebConfig},
    },
    hist::{exported_bounds, fold_buckets},
    metadata::{
        cgroups::{find_v2_mount, unescape_mountinfo},
        processes::{comm_from_bytes, sanitize},
    },
    series::{Budget, CgroupLabels, Workload},
    util::duration as durations,
};
use sysscope_abi::hist::HIST_BUCKETS;

/// Keys of the config file with a generator of plausible and implausible values.
const KEYS: &[(&str, &str)] = &[
    ("collection", "min_interval"),
    ("collection", "background_interval"),
    ("collection", "series_retention"),
    ("labels", "pid"),
    ("labels", "kubernetes_ids"),
    ("limits", "max_series"),
    ("limits", "max_threads"),
    ("limits", "max_syscall_entries"),
    ("limits", "max_error_entries"),
    ("limits", "max_exited_processes"),
    ("syscalls", "enabled"),
    ("syscalls", "histogram_resolution"),
    ("block_io", "max_inflight"),
    ("block_io", "tracepoints"),
    ("slow_calls", "threshold"),
    ("slow_calls", "exclude"),
    ("slow_calls", "ring_buffer_bytes"),
    ("slow_calls", "resolve_file_paths"),
    ("slow_calls", "proc_fallback"),
    ("kubernetes", "pod_watch"),
    ("kubernetes", "max_pods"),
    ("nonsense", "key"),
    ("limits", "max_seriess"),
];

fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (0u64..100_000).prop_map(|v| v.to_string()),
        any::<bool>().prop_map(|v| v.to_string()),
        "[0-9]{1,6}(ns|us|ms|s|m|h|d|)".prop_map(|v| format!("\"{v}\"")),
        "[a-z0-9_ ]{0,12}".prop_map(|v| format!("\"{v}\"")),
        prop::collection::vec("[a-z_]{1,10}", 0..4).prop_map(|v| format!(
            "[{}]",
            v.iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Just("1.5e308".to_string()),
        Just("nan".to_string()),
        Just("{}".to_string()),
    ]
}

fn toml_document() -> impl Strategy<Value = String> {
    prop::collection::vec((0..KEYS.len(), toml_value()), 0..8).prop_map(|entries| {
        let mut by_section: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
        for (k, v) in entries {
            let (section, key) = KEYS[k];
            by_section
                .entry(section)
                .or_default()
                .push(format!("{key} = {v}"));
        }
        let mut out = String::new();
        for (section, lines) in by_section {
            out.push_str(&format!("[{section}]\n"));
            // Duplicate keys are a TOML error: keep the first of each.
            let mut seen = std::collections::BTreeSet::new();
            for l in lines {
                if seen.insert(l.split(' ').next().unwrap().to_string()) {
                    out.push_str(&l);
                    out.push('\n');
                }
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn config_parser_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
        if let Err(e) = Config::parse(&text, "fuzz.toml") {
            prop_assert!(e.to_string().contains("fuzz.toml"));
        }
    }

    #[test]
    fn config_parser_on_structured_documents(doc in toml_document()) {
        match Config::parse(&doc, "fuzz.toml") {
            // What is accepted survives a round trip through the printed form.
            Ok(c) => {
                let printed = toml::to_string(&c).unwrap();
                prop_assert_eq!(Config::parse(&printed, "printed").unwrap(), c);
            }
            // What is rejected names the file and, for unknown keys, the key.
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("fuzz.toml"), "{}", msg);
                if doc.contains("max_seriess") && msg.contains("unknown field") {
                    prop_assert!(msg.contains("max_seriess"), "{}", msg);
                }
            }
        }
    }

    #[test]
    fn durations_parse_or_explain_and_round_trip(text in "\\PC{0,16}", ms in 0u64..10_000_000) {
        let _ = durations::parse(&text);
        let d = Duration::from_millis(ms);
        prop_assert_eq!(durations::parse(&durations::format(&d)).unwrap(), d);
    }

    #[test]
    fn web_config_parser_never_panics(text in "\\PC{0,200}") {
        if let Err(e) = WebConfig::parse(&text, "web.yml", Path::new("/nonexistent")) {
            prop_assert!(e.to_string().contains("web.yml"));
        }
    }

    #[test]
    fn web_config_structured(
        keys in prop::collection::vec(
            prop::sample::select(vec![
                "tls_server_config:\n  cert_file: a\n",
                "tls_server_config:\n  key_file: b\n",
                "tls_server_config:\n  client_auth_type: RequireAnyClientCert\n",
                "tls_server_config: {}\n",
                "basic_auth_users:\n  u: x\n",
                "basic_auth_users: {}\n",
                "http_server_config:\n  http2: false\n",
                "http_server_config:\n  headers: {X-Frame-Options: deny}\n",
                "rate_limit: {}\n",
                "~\n",
            ]),
            0..3,
        )
    ) {
        let text: String = keys.concat();
        let _ = WebConfig::parse(&text, "web.yml", Path::new("/nonexistent"));
    }

    #[test]
    fn basic_auth_header_parsing(user in "[^:]{0,20}", password in prop::collection::vec(any::<u8>(), 0..40), junk in prop::collection::vec(any::<u8>(), 0..60)) {
        use base64::Engine;
        let mut raw = user.clone().into_bytes();
        raw.push(b':');
        raw.extend_from_slice(&password);
        let header = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(&raw));
        prop_assert_eq!(parse_basic(header.as_bytes()), Some((user, password)));
        let _ = parse_basic(&junk);
    }

    #[test]
    fn mountinfo_parsing_never_panics(text in "\\PC{0,300}") {
        let _ = find_v2_mount(&text);
        let _ = unescape_mountinfo(&text);
    }

    #[test]
    fn mountinfo_mount_points_round_trip(path in "/[a-zA-Z0-9 \\t\\\\_.-]{0,40}", other in "/[a-z]{1,10}") {
        // The kernel escapes space, tab, newline and backslash as octal.
        let escaped: String = path
            .chars()
            .map(|c| match c {
                ' ' | '\t' | '\n' | '\\' => format!("\\{:03o}", c as u32),
                c => c.to_string(),
            })
            .collect();
        prop_assert_eq!(unescape_mountinfo(&escaped), path.clone());
        let text = format!(
            "33 31 0:28 / {other} rw - cgroup cgroup rw,cpu\n36 35 0:30 / {escaped} rw,nosuid shared:4 - cgroup2 cgroup2 rw\n"
        );
        prop_assert_eq!(find_v2_mount(&text), Some(std::path::PathBuf::from(path)));
    }

    #[test]
    fn comm_sanitising(name in "\\PC{0,20}|[\\x00-\\x1f\\x7f]{0,16}", bytes in prop::array::uniform16(any::<u8>())) {
        let s = sanitize(&name);
        prop_assert!(!s.chars().any(char::is_control));
        prop_assert_eq!(s.chars().count(), name.chars().count());
        let c = comm_from_bytes(&bytes);
        prop_assert!(!c.is_empty());
        prop_assert!(!c.chars().any(char::is_control));
        prop_assert!(c.chars().count() <= 16);
    }

    #[test]
    fn accept_negotiation_is_total_and_sane(accept in "\\PC{0,120}") {
        let f = Format::negotiate(Some(&accept));
        prop_assert_eq!(f, Format::negotiate(Some(&accept)));
        if !accept.to_ascii_lowercase().contains("application/openmetrics-text") {
            prop_assert_eq!(f, Format::PrometheusText);
        }
    }

    #[test]
    fn openmetrics_rewrite_never_panics(text in "\\PC{0,400}") {
        let _ = openmetrics_to_prometheus_text(&text);
    }

    #[test]
    fn openmetrics_rewrite_of_real_encoder_output(
        values in prop::collection::vec("\\PC{0,12}", 1..6),
        help in "[ -~]{0,40}",
        observations in prop::collection::vec(0.0f64..100.0, 0..10),
    ) {
        let mut registry = Registry::default();
        let counters = Family::<Vec<(String, String)>, Counter>::default();
        let gauges = Family::<Vec<(String, String)>, Gauge>::default();
        let hist = Histogram::new([0.1, 1.0, 10.0]);
        registry.register("fuzz_things", help.clone(), counters.clone());
        registry.register("fuzz_level", help, gauges.clone());
        registry.register("fuzz_seconds", "Latency.", hist.clone());
        for v in &values {
            counters.get_or_create(&vec![("v".into(), v.clone())]).inc();
            gauges.get_or_create(&vec![("v".into(), v.clone())]).set(3);
        }
        for o in observations {
            hist.observe(o);
        }
        let mut om = String::new();
        encode(&mut om, &registry).unwrap();
        let text = openmetrics_to_prometheus_text(&om);
        prop_assert!(!text.contains("# EOF"));
        prop_assert!(!text.contains("# UNIT"));
        prop_assert!(text.contains("# TYPE fuzz_things_total counter\n"));
        prop_assert!(text.contains("# TYPE fuzz_seconds histogram\n"));
        // Every sample line survives, in order.
        let samples = |s: &str| s.lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect::<Vec<_>>();
        prop_assert_eq!(samples(&om), samples(&text));
        prop_assert_eq!(samples(&text).len(), values.iter().collect::<std::collections::BTreeSet<_>>().len() * 2 + 6);
    }

    #[test]
    fn histogram_folding_keeps_every_observation(buckets in prop::array::uniform26(0u64..1 << 40), log2 in any::<bool>()) {
        let res = if log2 { HistogramResolution::Log2 } else { HistogramResolution::Log4 };
        let bounds = exported_bounds(res);
        let folded = fold_buckets(&buckets, &bounds);
        prop_assert_eq!(folded.len(), bounds.len() + 1);
        prop_assert_eq!(folded.iter().map(|(_, n)| n).sum::<u64>(), buckets.iter().sum::<u64>());
        prop_assert!(folded.windows(2).all(|w| w[0].0 < w[1].0));
        prop_assert_eq!(HIST_BUCKETS, buckets.len());
    }
}

fn workload(cg: u8, comm: u8) -> Workload {
    Workload {
        cgroup: Arc::new(CgroupLabels::plain(format!("/cg{cg}"))),
        comm: Arc::from(format!("p{comm}").as_str()),
        pid: None,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Route(u8, u8, u8),
    RetainSeries(u8),
    RetainRoutes(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..20, 0u8..50, 0u8..6).prop_map(|(a, b, c)| Op::Route(a, b, c)),
        1 => any::<u8>().prop_map(Op::RetainSeries),
        1 => any::<u8>().prop_map(Op::RetainRoutes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the sequence of routes and retains, the budget never exceeds its maximum by
    /// more than the catch-all (one series per syscall), and routing is sticky while a route
    /// is remembered.
    #[test]
    fn budget_stays_bounded_and_sticky(ops in prop::collection::vec(op(), 1..400), max in 17usize..400) {
        const COST: usize = 17;
        let fold = |k: &(Workload, u32)| vec![(k.0.fold_comm(), k.1), (Workload::fold_all(), k.1)];
        let mut b: Budget<(Workload, u32)> = Budget::new(max);
        let mut last: std::collections::HashMap<(Workload, u32), (Workload, u32)> = Default::default();
        for op in ops {
            match op {
                Op::Route(cg, comm, nr) => {
                    let key = (workload(cg, comm), nr as u32);
                    let target = b.route(&key, COST, fold);
                    if let Some(prev) = last.get(&key) {
                        prop_assert_eq!(prev, &target, "route changed while remembered");
                    }
                    last.insert(key, target);
                }
                Op::RetainSeries(seed) => {
                    b.retain(|k| !(k.1 as u8 ^ seed).is_multiple_of(3));
                    last.clear();
                }
                Op::RetainRoutes(seed) => {
                    b.retain_routes(|k| (k.1 as u8 ^ seed).is_multiple_of(2));
                    last.clear();
                }
            }
            prop_assert!(b.used() <= max + 6 * COST, "used {} > {} + catch-all", b.used(), max);
        }
    }
}
