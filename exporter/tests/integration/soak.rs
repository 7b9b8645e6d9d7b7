//! Bounded soaks on the real kernel: scrape load (50 concurrent clients for 30 s with `wrk`)
//! and process/cgroup churn (20,000 short-lived processes across 200 short-lived cgroups).
//! Each checks correctness against ground truth the test controls and that memory stays
//! bounded; the figures they print are the ones recorded in docs/operations.md.
//!
//! The two run one after the other (they would skew each other's figures on two cores).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::common::*;

/// A private copy of the workload binary, taken once: the churn runs it hundreds of times over
/// half a minute, and a rebuild (of this or another checkout sharing the target directory)
/// must not swap it mid-run.
fn churn_workload() -> &'static std::path::Path {
    static COPY: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    &COPY
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("sysscope-workload");
            std::fs::copy(workload_bin(), &path).unwrap();
            let ok = Command::new(&path)
                .args(["fork-children", "1", "1", "probe"])
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "{} has no fork-children step: it is not this build's binary",
                workload_bin()
            );
            (dir, path)
        })
        .1
}

/// Resident memory is "bounded" when, under a constant load after a warm-up, the peak of the
/// second half of the run is no more than `GROWTH_KIB` above the peak of the first half (a
/// leak grows steadily with the requests served; allocator noise does not), plus what the
/// data itself grew by: on a live machine new processes keep adding series, and every byte
/// of exposition is held a few times over (the series, the encodings of both formats, the
/// responses in flight), allowed for as `DATA_FACTOR` times the growth of the exposition.
/// The peak must also stay under `CEILING_KIB`.
const GROWTH_KIB: u64 = 8 * 1024;
const DATA_FACTOR: u64 = 16;
const CEILING_KIB: u64 = 256 * 1024;

fn series_key(s: &Sample) -> String {
    format!("{}{:?}", s.name, s.labels)
}

/// Samples VmRSS of `pid` every 250 ms until `stop` is set.
fn sample_rss(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Some(kib) = vm_rss_kib(pid) {
                out.push(kib);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        out
    })
}

fn assert_bounded(what: &str, rss: &[u64], data_growth_kib: u64) {
    assert!(rss.len() >= 8, "{what}: too few RSS samples: {rss:?}");
    let half = rss.len() / 2;
    let first = *rss[..half].iter().max().unwrap();
    let second = *rss[half..].iter().max().unwrap();
    let allowed = GROWTH_KIB + DATA_FACTOR * data_growth_kib;
    eprintln!(
        "{what}: VmRSS first-half peak {first} KiB, second-half peak {second} KiB, start {} KiB, \
         end {} KiB; exposition grew {data_growth_kib} KiB, growth allowed {allowed} KiB",
        rss[0],
        rss[rss.len() - 1]
    );
    assert!(
        second <= first + allowed,
        "{what}: resident memory grew by {} KiB between the halves of the run (allowed {allowed})",
        second - first
    );
    assert!(
        second <= CEILING_KIB && first <= CEILING_KIB,
        "{what}: resident memory above {CEILING_KIB} KiB"
    );
}

/// wrk's summary: (requests, non-2xx responses, socket errors, p50 ms, p99 ms).
fn parse_wrk(out: &str) -> (u64, u64, u64, f64, f64) {
    let ms = |v: &str| -> f64 {
        let v = v.trim();
        if let Some(x) = v.strip_suffix("us") {
            x.parse::<f64>().unwrap() / 1000.0
        } else if let Some(x) = v.strip_suffix("ms") {
            x.parse().unwrap()
        } else if let Some(x) = v.strip_suffix('s') {
            x.parse::<f64>().unwrap() * 1000.0
        } else {
            panic!("wrk latency {v}")
        }
    };
    let mut requests = 0;
    let mut non2xx = 0;
    let mut socket_errors = 0;
    let (mut p50, mut p99) = (f64::NAN, f64::NAN);
    for line in out.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("50%") {
            p50 = ms(rest);
        } else if let Some(rest) = l.strip_prefix("99%") {
            p99 = ms(rest);
        } else if l.contains("requests in") {
            requests = l.split_whitespace().next().unwrap().parse().unwrap();
        } else if let Some(rest) = l.strip_prefix("Non-2xx or 3xx responses:") {
            non2xx = rest.trim().parse().unwrap();
        } else if let Some(rest) = l.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            socket_errors = rest
                .split(',')
                .filter_map(|p| p.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum();
        }
    }
    (requests, non2xx, socket_errors, p50, p99)
}

#[test]
fn fifty_clients_scraping_for_thirty_seconds() {
    if !require_root("fifty_clients_scraping_for_thirty_seconds") {
        return;
    }
    // Fifty clients for thirty seconds take both cores: tests beside it would starve.
    let _alone = alone();
    if Command::new("wrk").arg("--version").output().is_err() {
        panic!("wrk is not installed: run scripts/setup.sh --test");
    }
    // The production default: scrapes within 1 s share one read of the maps.
    let exporter = Exporter::start("", &[]);
    let pid = exporter.child.id();
    let cg = TestCgroup::new("sysscope-test-load");
    let labels = [
        ("cgroup", cg.rel.as_str()),
        ("comm", WORKLOAD_COMM),
        ("syscall", "getppid"),
    ];

    // A known workload runs during the whole load: 1 thread of getppid for 42 s.
    let workload = Command::new(workload_bin())
        .args(["join-cgroup"])
        .arg(&cg.dir)
        .args(["loop-getppid", "42", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("workload");

    let lost_before = lost_records(&parse_samples(&exporter.scrape()));
    // A checker scrapes beside wrk: the workload's counter never goes back.
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let stop = stop.clone();
        let port = exporter.port;
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        std::thread::spawn(move || {
            let want: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let mut last = 0.0f64;
            let mut scrapes = 0u32;
            let mut sizes: Vec<(Instant, usize)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let (status, _, body) = http_get(port, "/metrics", None).expect("checker scrape");
                assert_eq!(status, 200);
                let samples = parse_samples(&body);
                let v = sum(&samples, "sysscope_syscalls_total", &want);
                assert!(v >= last, "counter went back from {last} to {v}");
                // Every series appears once: no duplicate label sets in one exposition.
                let mut seen = BTreeSet::new();
                for s in &samples {
                    assert!(seen.insert(series_key(s)), "duplicate series {s:?}");
                }
                last = v;
                scrapes += 1;
                sizes.push((Instant::now(), body.len()));
                std::thread::sleep(Duration::from_millis(200));
            }
            (last, scrapes, sizes)
        })
    };

    // Warm-up at the same load first: buffers, caches and allocator arenas grow to their
    // working size, so the measured run shows growth, not ramp-up.
    let warm = Command::new("wrk")
        .args(["-t2", "-c50", "-d10s", "--timeout", "10s"])
        .arg(format!("http://127.0.0.1:{}/metrics", exporter.port))
        .output()
        .expect("wrk");
    assert!(warm.status.success());
    let rss = sample_rss(pid, stop.clone());
    let measured_from = Instant::now();
    let out = Command::new("wrk")
        .args(["-t2", "-c50", "-d30s", "--latency", "--timeout", "10s"])
        .arg(format!("http://127.0.0.1:{}/metrics", exporter.port))
        .output()
        .expect("wrk");
    stop.store(true, Ordering::Relaxed);
    let wrk = String::from_utf8_lossy(&out.stdout).to_string();
    let (last, scrapes, sizes) = checker.join().expect("checker");
    let measured: Vec<usize> = sizes
        .iter()
        .filter(|(t, _)| *t >= measured_from)
        .map(|(_, n)| *n)
        .collect();
    let data_growth_kib = measured
        .iter()
        .max()
        .zip(measured.first())
        .map_or(0, |(max, first)| max.saturating_sub(*first) as u64 / 1024);
    let rss = rss.join().unwrap();
    assert!(out.status.success(), "wrk failed: {wrk}");
    let (requests, non2xx, socket_errors, p50, p99) = parse_wrk(&wrk);
    eprintln!(
        "scrape load: {requests} requests in 30 s by 50 clients ({:.0}/s), p50 {p50:.2} ms, p99 {p99:.2} ms, {non2xx} non-2xx, {socket_errors} socket errors; checker saw {scrapes} monotonic scrapes\n{wrk}",
        requests as f64 / 30.0
    );
    assert!(requests > 1000, "too few requests completed: {wrk}");
    assert_eq!(non2xx, 0, "non-2xx responses under load: {wrk}");
    assert_eq!(socket_errors, 0, "socket errors under load: {wrk}");
    assert!(scrapes > 10 && last > 0.0);
    assert_bounded("scrape load", &rss, data_growth_kib);

    // No double counting: once the workload is done, the series equals its own count.
    let out = workload.wait_with_output().expect("workload");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let calls: f64 = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("calls="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("workload output: {stdout}"));
    // Exactly, unless the kernel map overflowed meanwhile (a busy machine can fill it): then
    // never more, and the shortfall is within what the probes counted as lost.
    let mut seen = (0.0, 0.0);
    let exact = eventually(Duration::from_secs(5), || {
        let samples = parse_samples(&exporter.scrape());
        seen = (
            sum(&samples, "sysscope_syscalls_total", &labels),
            lost_records(&samples) - lost_before,
        );
        (seen.0 == calls).then_some(())
    });
    let (counted, lost) = seen;
    eprintln!("scrape load: workload made {calls} getppid calls, sysscope counted {counted} ({lost} records lost machine-wide)");
    if exact.is_none() {
        // Where the calls went: every series of the workload's cgroup and the probes' own
        // counts of what they could not place.
        let body = exporter.scrape();
        for line in body.lines().filter(|l| {
            (l.starts_with("sysscope_syscalls_total") && l.contains(cg.rel.as_str()))
                || l.starts_with("sysscope_probe_missed_events_total")
                || l.starts_with("sysscope_map_insert_failures_total")
                || l.starts_with("sysscope_syscalls_folded_total")
                || l.starts_with("sysscope_dropped_series_total")
        }) {
            eprintln!("scrape load: {line}");
        }
    }
    assert!(counted <= calls, "double counted: {counted} > {calls}");
    assert!(
        exact.is_some() || counted + lost >= calls,
        "{} calls missing and only {lost} records counted as lost",
        calls - counted
    );
}

const CGROUPS: usize = 200;
const CHILDREN: u64 = 100;
const CALLS: u64 = 3;
/// Series the test's own label sets may use, on top of what the machine already has.
const MAX_SERIES: usize = 20_000;

/// Exported series of the syscall families, in the budget's unit (every histogram line).
fn syscall_series(samples: &[Sample]) -> usize {
    samples
        .iter()
        .filter(|s| {
            s.name == "sysscope_syscalls_total"
                || s.name.starts_with("sysscope_syscall_duration_seconds")
        })
        .count()
}

fn counter(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    sum(samples, name, labels)
}

fn lost_records(samples: &[Sample]) -> f64 {
    counter(
        samples,
        "sysscope_map_insert_failures_total",
        &[("map", "SYSCALL_STATS")],
    ) + counter(
        samples,
        "sysscope_map_insert_failures_total",
        &[("map", "SYSCALL_THREADS")],
    )
}

/// With the default map sizes, this churn (about 5,000 new processes a second) creates
/// entries faster than two reads apart can reclaim them: the maps fill, and every record that
/// does not fit must be counted.
#[test]
fn twenty_thousand_processes_in_two_hundred_cgroups_default_maps() {
    if !require_root("twenty_thousand_processes_in_two_hundred_cgroups_default_maps") {
        return;
    }
    // Thousands of processes and cgroups: the other tests' series would fold.
    let _alone = alone();
    churn("", 2);
}

/// With maps sized for the churn, (nearly) nothing is lost, so the folding is checked tightly.
#[test]
fn twenty_thousand_processes_in_two_hundred_cgroups_sized_maps() {
    if !require_root("twenty_thousand_processes_in_two_hundred_cgroups_sized_maps") {
        return;
    }
    // Thousands of processes and cgroups: the other tests' series would fold.
    let _alone = alone();
    churn(
        "max_syscall_entries = 65536\nmax_exited_processes = 32768\n",
        1,
    );
}

/// Runs `rounds` rounds of churn against one exporter. Resident memory is bounded when it
/// peaks under `CEILING_KIB` and, once a round's entries and series are reclaimed and the
/// exporter has given its freed heap back, a later round settles no more than `GROWTH_KIB`
/// above the first (hash tables keep their capacity, so memory need not return to the
/// baseline, but repeating the same churn must not need more). Peaks are not compared: they
/// depend on how the churn's reads and scrapes happen to overlap.
fn churn(limits: &str, rounds: usize) {
    let config = |max_series: usize| {
        format!(
            "[collection]\nmin_interval = \"0s\"\nbackground_interval = \"500ms\"\nseries_retention = \"10s\"\n\
             [limits]\nmax_series = {max_series}\n{limits}"
        )
    };
    // The budget must leave room for the test's cgroups whatever else runs on the machine:
    // measure what the machine exports on its own first.
    let baseline = {
        let probe = Exporter::start(&config(10_000_000), &[]);
        std::thread::sleep(Duration::from_secs(2));
        syscall_series(&parse_samples(&probe.scrape()))
    };
    let budget = baseline + MAX_SERIES;
    let exporter = Exporter::start(&config(budget), &[]);
    // Let start-up settle before the baseline.
    std::thread::sleep(Duration::from_secs(2));
    let settled: Vec<u64> = (0..rounds)
        .map(|r| churn_round(&exporter, r, budget, rounds > 1, limits.is_empty()))
        .collect();
    if let (Some(first), Some(last)) = (settled.first(), settled.last()) {
        eprintln!("churn: VmRSS settled after each round {settled:?} KiB");
        assert!(
            *last <= first + GROWTH_KIB,
            "resident memory after a round grew from {first} KiB to {last} KiB over rounds of \
             the same churn"
        );
    }
}

/// One round: returns the VmRSS it settles at (`settle`), else its peak.
fn churn_round(
    exporter: &Exporter,
    round: usize,
    budget: usize,
    settle: bool,
    default_maps: bool,
) -> u64 {
    let pid = exporter.child.id();
    let prefix = format!(
        "sysscope-test-churn-{}-{}-{round}",
        std::process::id(),
        rand_suffix()
    );
    let before = parse_samples(&exporter.scrape());
    let entries_before = counter(&before, "sysscope_map_entries", &[("map", "SYSCALL_STATS")]);
    let folded_before = counter(
        &before,
        "sysscope_dropped_series_total",
        &[("family", "syscalls")],
    );
    let lost_before = lost_records(&before);
    let other_before = counter(
        &before,
        "sysscope_syscalls_total",
        &[("cgroup", "other"), ("syscall", "getppid")],
    );
    let rss_before = vm_rss_kib(pid).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    // Resident memory is sampled over the whole round: the churn, and the reclaim and
    // retirement of its entries and series that follow it.
    let rss_stop = Arc::new(AtomicBool::new(false));
    let rss = sample_rss(pid, rss_stop.clone());
    // A scraper follows the churn: it records the last value of every series (series of
    // removed cgroups may retire before the end) and checks the series budget each time.
    let scraper = {
        let stop = stop.clone();
        let port = exporter.port;
        std::thread::spawn(move || {
            let mut last: HashMap<String, (BTreeMap<String, String>, f64)> = HashMap::new();
            let mut max_series = 0usize;
            let mut scrapes = 0;
            // The catch-all getppid series may retire (idle for the retention) and start again
            // during the round: add up its increases, resets included, like increase() does.
            let mut other_prev = other_before;
            let mut other_increase = 0.0f64;
            let mut other_seen = Vec::new();
            loop {
                let done = stop.load(Ordering::Relaxed);
                let (status, _, body) = http_get(port, "/metrics", None).expect("scrape");
                assert_eq!(status, 200);
                let samples = parse_samples(&body);
                let n = syscall_series(&samples);
                // The catch-all (cgroup="other", comm="other") is admitted beyond the budget,
                // one histogram per syscall, so nothing is ever lost: allow for it exactly.
                let catch_all = select(
                    &samples,
                    "sysscope_syscalls_total",
                    &[("cgroup", "other"), ("comm", "other")],
                )
                .len();
                let cost = n / samples
                    .iter()
                    .filter(|s| s.name == "sysscope_syscalls_total")
                    .count()
                    .max(1);
                assert!(
                    n <= budget + catch_all * cost,
                    "{n} syscall series exported, budget {budget} + catch-all {catch_all}x{cost}"
                );
                max_series = max_series.max(n);
                for s in samples
                    .iter()
                    .filter(|s| s.name == "sysscope_syscalls_total")
                {
                    last.insert(series_key(s), (s.labels.clone(), s.value));
                }
                let other_now: f64 = select(
                    &samples,
                    "sysscope_syscalls_total",
                    &[("cgroup", "other"), ("syscall", "getppid")],
                )
                .iter()
                .map(|s| s.value)
                .sum();
                other_increase += if other_now >= other_prev {
                    other_now - other_prev
                } else {
                    other_now
                };
                other_prev = other_now;
                other_seen.push(other_now);
                scrapes += 1;
                if done {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            (
                last,
                max_series,
                scrapes,
                other_increase,
                other_prev,
                other_seen,
            )
        })
    };

    // 200 cgroups, 4 at a time; each is removed ~2 s after its processes are done (long
    // enough for a read to resolve its id to a path; a cgroup gone before any read is
    // labelled "(unresolved)", which docs/operations.md describes).
    let started = Instant::now();
    let mut removal: Vec<(Instant, TestCgroup)> = Vec::new();
    let mut names = BTreeSet::new();
    for chunk in (0..CGROUPS).collect::<Vec<_>>().chunks(4) {
        let mut children = Vec::new();
        for &j in chunk {
            let cg = TestCgroup::at(&format!("{prefix}-{j}"));
            names.insert(cg.rel.clone());
            let child = Command::new(churn_workload())
                .arg("join-cgroup")
                .arg(&cg.dir)
                .args([
                    "fork-children",
                    &CHILDREN.to_string(),
                    &CALLS.to_string(),
                    &format!("c{j}-"),
                ])
                .spawn()
                .expect("spawn churn workload");
            children.push((cg, child));
        }
        for (cg, mut child) in children {
            assert!(child.wait().unwrap().success());
            removal.push((Instant::now() + Duration::from_secs(2), cg));
        }
        let now = Instant::now();
        removal.retain(|(at, _)| *at > now);
    }
    let churn = started.elapsed();
    drop(removal);
    // Two background reads after the end, then the scraper's final scrape; longer while a
    // scrape does not yet account for every call (the last entries of a busy refresh may be
    // published a few cycles later), up to 12 s: what is then missing has vanished.
    std::thread::sleep(Duration::from_millis(1500));
    let wait_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < wait_until {
        let s = parse_samples(&exporter.scrape());
        let getppid = |cgroup: &dyn Fn(&str) -> bool| -> f64 {
            s.iter()
                .filter(|x| {
                    x.name == "sysscope_syscalls_total"
                        && x.labels.get("syscall").map(String::as_str) == Some("getppid")
                        && x.labels.get("cgroup").is_some_and(|c| cgroup(c))
                })
                .map(|x| x.value)
                .sum()
        };
        let accounted = getppid(&|c| names.contains(c))
            + getppid(&|c| c == "other" || c == "(unresolved)")
            - other_before;
        if accounted >= (CGROUPS as u64 * CHILDREN * CALLS) as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::Relaxed);
    let (last, max_series, scrapes, other_increase, other_last, other_seen) =
        scraper.join().expect("scraper");
    let after = parse_samples(&exporter.scrape());
    // The final scrape is the latest state of every series still exported: values deferred
    // by a cycle (cgroups newer than the walk, or removed before it) land in it.
    let mut last = last;
    for s in after.iter().filter(|s| s.name == "sysscope_syscalls_total") {
        last.insert(series_key(s), (s.labels.clone(), s.value));
    }

    let truth = (CGROUPS as u64 * CHILDREN * CALLS) as f64;
    let counted_ours: f64 = last
        .values()
        .filter(|(l, _)| {
            l.get("syscall").map(String::as_str) == Some("getppid")
                && l.get("cgroup").is_some_and(|c| names.contains(c))
        })
        .map(|(_, v)| v)
        .sum();
    let other_now = counter(
        &after,
        "sysscope_syscalls_total",
        &[("cgroup", "other"), ("syscall", "getppid")],
    );
    let other_delta = other_increase
        + if other_now >= other_last {
            other_now - other_last
        } else {
            other_now
        };
    let unresolved: f64 = last
        .values()
        .filter(|(l, _)| {
            l.get("syscall").map(String::as_str) == Some("getppid")
                && l.get("cgroup").map(String::as_str) == Some("(unresolved)")
        })
        .map(|(_, v)| v)
        .sum();
    let lost = lost_records(&after) - lost_before;
    let folded = counter(
        &after,
        "sysscope_dropped_series_total",
        &[("family", "syscalls")],
    ) - folded_before;
    let exits_lost = counter(
        &after,
        "sysscope_map_insert_failures_total",
        &[("map", "PROCESS_EXITS")],
    );
    let stats_lost = counter(
        &after,
        "sysscope_map_insert_failures_total",
        &[("map", "SYSCALL_STATS")],
    );
    let scrape_seconds = counter(&after, "sysscope_scrape_duration_seconds", &[]);
    eprintln!(
        "churn: baseline {} syscall series, SYSCALL_STATS {entries_before} entries; lost so far: \
         exit records {exits_lost}, stats records {stats_lost}; last scrape took {scrape_seconds} s",
        syscall_series(&before)
    );
    eprintln!(
        "churn: {} processes in {CGROUPS} cgroups in {churn:?}; getppid truth {truth}, counted in \
         the test cgroups {counted_ours}, in cgroup=\"other\" {}, unresolved {unresolved}, records \
         lost (counted) {lost}; label sets folded {folded}; peak syscall series {max_series} \
         (budget {budget}); {scrapes} scrapes",
        CGROUPS as u64 * CHILDREN,
        other_delta
    );
    assert!(
        counted_ours > 0.0,
        "no getppid calls attributed to the test cgroups (budget exhausted by the baseline?)"
    );
    // Never double counted...
    assert!(
        counted_ours <= truth,
        "counted {counted_ours} getppid calls in the test cgroups, only {truth} were made"
    );
    // ...and what is missing from the test cgroups' own series was folded into "other",
    // lost with its cgroup's path, or counted as lost by the probes.
    if counted_ours + other_delta + unresolved + lost < truth {
        // Say where the shortfall is: the test cgroups that came up short, and every other
        // getppid series (outside the test cgroups and "other") that changed.
        let mut per_cgroup: BTreeMap<&str, f64> = names.iter().map(|n| (n.as_str(), 0.0)).collect();
        for (l, v) in last.values() {
            if l.get("syscall").map(String::as_str) == Some("getppid") {
                if let Some(c) = l.get("cgroup").and_then(|c| per_cgroup.get_mut(c.as_str())) {
                    *c += v;
                }
            }
        }
        let short: Vec<_> = per_cgroup
            .iter()
            .filter(|(_, v)| **v + 0.5 < (CHILDREN * CALLS) as f64)
            .collect();
        eprintln!(
            "churn: {} test cgroups below {}; \"other\" getppid before {other_before}, at each \
             scrape {other_seen:?}, at the end {other_now}",
            short.len(),
            CHILDREN * CALLS
        );
        for (l, v) in last.values() {
            let c = l.get("cgroup").map(String::as_str).unwrap_or("");
            if l.get("syscall").map(String::as_str) == Some("getppid")
                && !names.contains(c)
                && c != "other"
            {
                eprintln!("churn: elsewhere {l:?} = {v}");
            }
        }
    }
    assert!(
        counted_ours + (other_delta) + unresolved + lost >= truth,
        "calls vanished silently: truth {truth}, counted {counted_ours} + other {} + unresolved \
         {unresolved} + lost {lost}",
        other_delta
    );
    // Each child is a new label set for getppid and exit_group at least: nearly all of them
    // exceed the budget (at most budget/17 label sets are admitted) and must be counted as
    // folded.
    // With the default maps the kernel itself counts most children under their cgroup's
    // shared key (the processes' own keys may hold 7/8 of the table, the rest is kept for
    // shared keys): those are no label sets of their own, and their calls are checked above.
    // The budget's folding is then checked to have happened, and tightly with sized maps.
    let label_sets = (CGROUPS as u64 * CHILDREN * 2) as f64;
    let admitted = (budget / 17) as f64;
    if default_maps {
        assert!(folded > 0.0, "no label set counted as folded");
    } else {
        assert!(
            folded >= label_sets - admitted - lost,
            "only {folded} label sets counted as folded, expected at least {}",
            label_sets - admitted - lost
        );
    }

    // The kernel map is back near its baseline once exited processes are reclaimed.
    let entries_after = eventually(Duration::from_secs(40), || {
        let s = parse_samples(&exporter.scrape());
        let e = counter(&s, "sysscope_map_entries", &[("map", "SYSCALL_STATS")]);
        (e <= entries_before + 500.0).then_some(e)
    });
    assert!(
        entries_after.is_some(),
        "SYSCALL_STATS entries stayed above baseline {entries_before} + 500"
    );

    // Series of the removed cgroups disappear after collection.series_retention (10 s).
    let gone = eventually(Duration::from_secs(30), || {
        let s = parse_samples(&exporter.scrape());
        let left = s
            .iter()
            .filter(|x| x.labels.get("cgroup").is_some_and(|c| names.contains(c)))
            .count();
        (left == 0).then_some(())
    });
    assert!(
        gone.is_some(),
        "series of removed cgroups still exported after the retention"
    );
    rss_stop.store(true, Ordering::Relaxed);
    let rss = rss.join().unwrap();
    let peak = *rss.iter().max().unwrap();
    // The exporter gives freed heap back on a background refresh at most every 10 s: the
    // lowest resident size over a longer window is what the round left behind.
    let settled = settle.then(|| {
        let stop = Arc::new(AtomicBool::new(false));
        let window = sample_rss(pid, stop.clone());
        std::thread::sleep(Duration::from_secs(11));
        stop.store(true, Ordering::Relaxed);
        window.join().unwrap().into_iter().min().unwrap_or(peak)
    });
    eprintln!(
        "churn: VmRSS before {rss_before} KiB, peak {peak} KiB, after retention {} KiB, \
         settled {settled:?} KiB",
        vm_rss_kib(pid).unwrap_or(0)
    );
    assert!(
        peak <= CEILING_KIB,
        "resident memory {peak} KiB above {CEILING_KIB} KiB during churn"
    );
    settled.unwrap_or(peak)
}
