//! The metric families the exporter emits are the ones docs/metrics.md lists, no more and no
//! fewer: an exporter runs with every collector and every optional destination enabled (an
//! OTLP endpoint and a Kubernetes API that refuse connections are enough for their families to
//! exist), and the family names of its exposition are compared with the names of the
//! reference's tables. The GPU collector's device families need NVML: without it, only the
//! documented `sysscope_gpu_*` families may be missing.

use std::collections::BTreeSet;

use crate::common::*;

/// The family names docs/metrics.md documents: the metric names in the first cell of its
/// tables (with `_total` for counters, as the Prometheus text format names them).
fn documented() -> BTreeSet<String> {
    let doc = include_str!("../../../docs/metrics.md");
    let mut names = BTreeSet::new();
    for line in doc.lines() {
        let Some(first_cell) = line.strip_prefix("| `sysscope_").map(|_| &line[2..]) else {
            continue;
        };
        let first_cell = first_cell.split(" |").next().unwrap_or_default();
        // A cell may name several families (`a{...}`, `b{…}`), each possibly with labels.
        for name in first_cell.split('`').filter(|s| s.starts_with("sysscope_")) {
            let name = name.split('{').next().unwrap_or(name);
            names.insert(name.to_string());
        }
    }
    names
}

/// The family names of a Prometheus text exposition (its `# TYPE` lines).
fn emitted(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_exporter_emits_exactly_the_documented_families() {
    if !require_root("the_exporter_emits_exactly_the_documented_families") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on these ports: the pod watch and the OTLP exporters start, fail their
    // requests and count them, which is all their families need.
    let closed = format!("127.0.0.1:{}", free_port());
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster:\n    server: http://{closed}\ncontexts:\n- name: none\n  context:\n    cluster: none\n    user: none\ncurrent-context: none\nusers:\n- name: none\n  user:\n    token: none\n"
        ),
    )
    .unwrap();
    let config = format!(
        "{TEST_CONFIG}[kubernetes]\npod_watch = \"on\"\nnode_name = \"node-test\"\n\
         [block_io]\nenabled = true\n[cpu]\nenabled = true\n[gpu]\nenabled = true\n"
    );
    let endpoint = format!("http://{closed}");
    let exporter = Exporter::start_with_env(
        &config,
        &[],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ],
    );
    // Some families appear at the first refresh of what they count (probe statistics, map
    // occupancy): the second scrape has them all.
    exporter.scrape();
    let text = exporter.scrape();
    let emitted = emitted(&text);
    let documented = documented();
    let samples = parse_samples(&text);
    let gpu_up = select(&samples, "sysscope_collector_up", &[("collector", "gpu")])
        .iter()
        .any(|s| s.value == 1.0);

    let undocumented: Vec<&String> = emitted.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "families emitted but not in docs/metrics.md: {undocumented:?}"
    );
    let missing: Vec<&String> = documented
        .difference(&emitted)
        .filter(|name| gpu_up || !name.starts_with("sysscope_gpu_"))
        .collect();
    assert!(
        missing.is_empty(),
        "families in docs/metrics.md that the exporter does not emit: {missing:?}"
    );
    assert!(
        emitted.len() > 40,
        "only {} families: {emitted:?}",
        emitted.len()
    );
}
