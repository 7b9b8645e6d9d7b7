//! The block I/O collector against ground truth, on the real kernel with the real probes:
//! `dd` in a fresh cgroup moves an exact number of bytes through a loop device the test owns,
//! and sysscope must report them for that cgroup and device, with every request in the
//! latency histogram; flushes and discards must show up as their own operations; and a
//! broken block configuration must take down the block collector alone.

use std::{process::Command, time::Duration};

use crate::common::*;

const MIB: u64 = 1024 * 1024;

/// Runs `program args` inside `cg` and asserts it succeeded.
fn run_in(cg: &TestCgroup, program: &str, args: &[&str]) {
    let out = cg.command(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (bytes, requests) of `cgroup` (all cgroups if `None`) on `device` for `op`.
fn io(samples: &[Sample], cgroup: Option<&str>, device: &str, op: &str) -> (u64, u64) {
    let mut want = vec![("device", device), ("op", op)];
    if let Some(cg) = cgroup {
        want.push(("cgroup", cg));
    }
    (
        sum(samples, "sysscope_block_io_bytes_total", &want) as u64,
        sum(samples, "sysscope_block_io_requests_total", &want) as u64,
    )
}

/// Requests in the latency histogram of `device` / `op`.
fn histogram_count(samples: &[Sample], device: &str, op: &str) -> u64 {
    sum(
        samples,
        "sysscope_block_io_duration_seconds_count",
        &[("device", device), ("op", op)],
    ) as u64
}

fn within_one_percent_above(got: u64, truth: u64) -> bool {
    got >= truth && (got - truth) as f64 <= truth as f64 * 0.01
}

#[test]
fn dd_bytes_land_on_its_cgroup_and_loop_device() {
    if !require_root("dd_bytes_land_on_its_cgroup_and_loop_device") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let dev = LoopDevice::new(80 * MIB);
    let cg = TestCgroup::new("sysscope-test-bio");

    let of = format!("of={}", dev.path);
    let iff = format!("if={}", dev.path);
    run_in(
        &cg,
        "dd",
        &["if=/dev/zero", &of, "bs=1M", "count=64", "oflag=direct"],
    );
    run_in(
        &cg,
        "dd",
        &[&iff, "of=/dev/null", "bs=1M", "count=64", "iflag=direct"],
    );

    let truth = 64 * MIB;
    // Direct I/O completes before dd returns; the read of the maps happens at the scrape.
    let samples = eventually(Duration::from_secs(10), || {
        let s = parse_samples(&exporter.scrape());
        let (w, _) = io(&s, Some(&cg.rel), &dev.name, "write");
        let (r, _) = io(&s, Some(&cg.rel), &dev.name, "read");
        (w >= truth && r >= truth).then_some(s)
    })
    .unwrap_or_else(|| {
        // Say where the bytes went: every series of the device, and what was missed.
        let s = parse_samples(&exporter.scrape());
        for x in s.iter().filter(|x| {
            x.name.starts_with("sysscope_block_io_")
                && !x.name.ends_with("_bucket")
                && x.labels.get("device").map(String::as_str) == Some(dev.name.as_str())
                || x.name == "sysscope_probe_missed_events_total"
                || x.name == "sysscope_map_insert_failures_total"
        }) {
            eprintln!("{} {:?} = {}", x.name, x.labels, x.value);
        }
        s
    });

    for op in ["write", "read"] {
        let (bytes, requests) = io(&samples, Some(&cg.rel), &dev.name, op);
        eprintln!(
            "{op}: dd moved {truth} bytes, sysscope reports {bytes} bytes in {requests} requests"
        );
        assert!(
            within_one_percent_above(bytes, truth),
            "{op}: {bytes} bytes reported for {} on {}, dd moved {truth}",
            cg.rel,
            dev.name
        );
        // 1 MiB per call: at least one request per call, whatever the device splits them into.
        assert!(requests >= 64, "{op}: only {requests} requests");
        // Every byte of this cgroup on this device is dd's.
        let comms: Vec<_> = select(
            &samples,
            "sysscope_block_io_bytes_total",
            &[("cgroup", &cg.rel), ("device", &dev.name), ("op", op)],
        )
        .iter()
        .map(|s| s.labels["comm"].clone())
        .collect();
        assert_eq!(comms, vec!["dd".to_string()], "{op}");
    }

    // Every completed request the exporter saw on the device is in the histogram, whoever
    // issued it. Totals, not increases since a baseline scrape: udev reads a loop device as it is
    // attached, and a request completing between the scrape's read of the statistics and of
    // the latency map would be in one and not the other of a baseline taken then.
    let consistent = eventually(Duration::from_secs(5), || {
        let now = parse_samples(&exporter.scrape());
        let ok = ["write", "read"].iter().all(|op| {
            let requests = io(&now, None, &dev.name, op).1;
            requests == histogram_count(&now, &dev.name, op) && requests >= 64
        });
        ok.then_some(())
    });
    if consistent.is_none() {
        let now = parse_samples(&exporter.scrape());
        let report: Vec<String> = ["write", "read"]
            .iter()
            .map(|op| {
                format!(
                    "{op}: requests {} vs histogram count {}",
                    io(&now, None, &dev.name, op).1,
                    histogram_count(&now, &dev.name, op)
                )
            })
            .collect();
        panic!("on {}: {}", dev.name, report.join("; "));
    }
    // Latency of a loop device request is positive and below a second.
    let sum_s = sum(
        &samples,
        "sysscope_block_io_duration_seconds_sum",
        &[("device", &dev.name), ("op", "write")],
    );
    assert!(sum_s > 0.0, "write latency sum {sum_s}");
}

#[test]
fn flushes_and_discards_have_their_own_op() {
    if !require_root("flushes_and_discards_have_their_own_op") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let dev = LoopDevice::new(32 * MIB);
    let cg = TestCgroup::new("sysscope-test-bio-flush");

    // fsync of a block device with a write-back cache sends a cache flush to the device.
    let of = format!("of={}", dev.path);
    run_in(
        &cg,
        "dd",
        &[
            "if=/dev/zero",
            &of,
            "bs=1M",
            "count=4",
            "oflag=direct",
            "conv=fsync",
        ],
    );
    run_in(&cg, "blkdiscard", &[&dev.path]);

    let samples = eventually(Duration::from_secs(10), || {
        let s = parse_samples(&exporter.scrape());
        let flushes = io(&s, None, &dev.name, "flush").1;
        let discarded = io(&s, None, &dev.name, "discard").0;
        (flushes >= 1 && discarded >= dev.size).then_some(s)
    })
    .unwrap_or_else(|| parse_samples(&exporter.scrape()));

    let (flush_bytes, flushes) = io(&samples, None, &dev.name, "flush");
    assert!(flushes >= 1, "no flush request on {}", dev.name);
    assert_eq!(flush_bytes, 0, "a flush moves no data");
    // Totals, as in the test above: a baseline can split a request between the two maps.
    assert_eq!(
        histogram_count(&samples, &dev.name, "flush"),
        flushes,
        "flush requests vs histogram count"
    );

    // blkdiscard discards the whole device, in one or more requests.
    let (discarded, discards) = io(&samples, None, &dev.name, "discard");
    assert_eq!(discarded, dev.size, "bytes discarded on {}", dev.name);
    assert!(discards >= 1);
    assert_eq!(
        histogram_count(&samples, &dev.name, "discard"),
        discards,
        "discard requests vs histogram count"
    );
    // With the submission tracepoint, the discard belongs to blkdiscard's cgroup even when
    // the block layer dispatches it from a kernel worker.
    let at_submit = sum(
        &samples,
        "sysscope_probe_attached",
        &[("program", "block_io_start")],
    ) == 1.0;
    if at_submit {
        assert_eq!(
            io(&samples, Some(&cg.rel), &dev.name, "discard").0,
            dev.size,
            "discard bytes of {}",
            cg.rel
        );
    }
    // dd's data writes are writes, not flushes.
    assert_eq!(
        io(&samples, Some(&cg.rel), &dev.name, "write").0,
        4 * MIB,
        "write bytes of {}",
        cg.rel
    );
}

#[test]
fn latency_by_cgroup_splits_the_histogram() {
    if !require_root("latency_by_cgroup_splits_the_histogram") {
        return;
    }
    let config = format!("{TEST_CONFIG}[block_io]\nlatency_by_cgroup = true\n");
    let exporter = Exporter::start(&config, &[]);
    let dev = LoopDevice::new(16 * MIB);
    let cg = TestCgroup::new("sysscope-test-bio-latcg");
    let of = format!("of={}", dev.path);
    run_in(
        &cg,
        "dd",
        &["if=/dev/zero", &of, "bs=1M", "count=4", "oflag=direct"],
    );
    let samples = parse_samples(&exporter.scrape());
    let (bytes, requests) = io(&samples, Some(&cg.rel), &dev.name, "write");
    assert_eq!(bytes, 4 * MIB);
    let counted = sum(
        &samples,
        "sysscope_block_io_duration_seconds_count",
        &[("cgroup", &cg.rel), ("device", &dev.name), ("op", "write")],
    ) as u64;
    assert!(requests >= 4);
    assert_eq!(counted, requests, "histogram of {} vs its requests", cg.rel);
    let inf = sum(
        &samples,
        "sysscope_block_io_duration_seconds_bucket",
        &[
            ("cgroup", &cg.rel),
            ("device", &dev.name),
            ("op", "write"),
            ("le", "+Inf"),
        ],
    ) as u64;
    assert_eq!(inf, requests);
}

#[test]
fn entries_of_exited_processes_are_reclaimed_and_counters_stay() {
    if !require_root("entries_of_exited_processes_are_reclaimed_and_counters_stay") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let dev = LoopDevice::new(16 * MIB);
    let cg = TestCgroup::new("sysscope-test-bio-reclaim");
    let of = format!("of={}", dev.path);
    run_in(
        &cg,
        "dd",
        &["if=/dev/zero", &of, "bs=1M", "count=8", "oflag=direct"],
    );
    let written = |exporter: &Exporter| {
        io(
            &parse_samples(&exporter.scrape()),
            Some(&cg.rel),
            &dev.name,
            "write",
        )
        .0
    };
    assert_eq!(written(&exporter), 8 * MIB);
    let id = cg.id();
    assert!(
        kernel_block_entries_for_cgroup(&exporter, id) > 0,
        "dd's entries must be in the kernel map before they are reclaimed"
    );
    // dd has exited: its kernel entries go once it has been known gone for a reclaim interval
    // (a few seconds).
    let reclaimed = eventually(Duration::from_secs(30), || {
        exporter.scrape();
        (kernel_block_entries_for_cgroup(&exporter, id) == 0).then_some(())
    });
    assert!(
        reclaimed.is_some(),
        "BLOCK_STATS entries of dd were not reclaimed"
    );
    assert_eq!(written(&exporter), 8 * MIB, "counter changed after reclaim");
    // A second dd adds to the same series.
    run_in(
        &cg,
        "dd",
        &["if=/dev/zero", &of, "bs=1M", "count=2", "oflag=direct"],
    );
    assert_eq!(written(&exporter), 10 * MIB);
}

/// Keys of `exporter`'s `BLOCK_STATS` map whose cgroup id is `id`, read with bpftool
/// (independent of sysscope). Its own map only: another test's exporter may exit, and its maps
/// go, while bpftool walks every map of that name.
fn kernel_block_entries_for_cgroup(exporter: &Exporter, id: u64) -> usize {
    let entries = dump_exporter_map(exporter, "BLOCK_STATS");
    entries
        .iter()
        .filter(|e| {
            let key = e["key"].as_array().expect("entry has a key");
            let bytes: Vec<u8> = key
                .iter()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect();
            assert_eq!(bytes.len(), 40, "BlockKey is 40 bytes");
            u64::from_le_bytes(bytes[..8].try_into().unwrap()) == id
        })
        .count()
}

#[test]
fn a_missing_or_mismatched_tracepoint_downs_block_io_only() {
    if !require_root("a_missing_or_mismatched_tracepoint_downs_block_io_only") {
        return;
    }
    for tracepoints in [
        r#"["block_rq_issue", "block_rq_no_such_tracepoint"]"#,
        // Exists, but passes other arguments than the completion probe reads.
        r#"["block_rq_issue", "block_rq_issue"]"#,
    ] {
        let config = format!("{TEST_CONFIG}[block_io]\ntracepoints = {tracepoints}\n");
        let exporter = Exporter::start(&config, &[]);
        let cg = TestCgroup::new("sysscope-test-bio-down");
        run_workload_joined(&cg, &["getppid", "321"]);
        let samples = parse_samples(&exporter.scrape());
        let up = |c: &str| sum(&samples, "sysscope_collector_up", &[("collector", c)]);
        assert_eq!(up("block_io"), 0.0, "{tracepoints}");
        assert_eq!(
            select(
                &samples,
                "sysscope_collector_up",
                &[("collector", "block_io")]
            )
            .len(),
            1,
            "block_io must be reported, as down"
        );
        assert_eq!(up("syscalls"), 1.0, "{tracepoints}");
        assert_eq!(
            getppid_calls(&samples, &cg),
            321.0,
            "{tracepoints}: syscalls still counted"
        );
        assert!(
            select(
                &samples,
                "sysscope_probe_attached",
                &[("collector", "block_io")]
            )
            .iter()
            .all(|s| s.value == 0.0),
            "no block program may stay attached to a down collector"
        );
    }
}

#[test]
fn btf_offsets_match_bpftool() {
    // Reading kernel BTF needs no privileges; bpftool is the independent reference.
    let btf = sysscope::kernel::btf::Btf::from_kernel();
    if !require("btf_offsets_match_bpftool", "the kernel's BTF", btf.is_ok()) {
        return;
    }
    let btf = btf.unwrap();
    let out = Command::new("bpftool")
        .args([
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
            "format",
            "raw",
        ])
        .output();
    // scripts/setup.sh --test installs it.
    if !require("btf_offsets_match_bpftool", "bpftool", out.is_ok()) {
        return;
    }
    let out = out.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // bpftool: "[12833] STRUCT 'request' size=248 vlen=31" then "\t'cmd_flags' type_id=.. bits_offset=192".
    let bpftool_offset = |strukt: &str, member: &str| -> u32 {
        let header = format!("STRUCT '{strukt}' ");
        let mut lines = text.lines().skip_while(|l| !l.contains(&header));
        lines
            .next()
            .unwrap_or_else(|| panic!("bpftool: no struct {strukt}"));
        let want = format!("'{member}' ");
        let line = lines
            .take_while(|l| l.starts_with('\t'))
            .find(|l| l.trim_start().starts_with(&want))
            .unwrap_or_else(|| panic!("bpftool: no {strukt}.{member}"));
        let bits: u32 = line
            .split("bits_offset=")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        bits / 8
    };
    let plan = sysscope::kernel::block_io::resolve_offsets(&btf, true, false).unwrap();
    assert_eq!(plan.rq_cmd_flags, bpftool_offset("request", "cmd_flags"));
    assert_eq!(plan.rq_data_len, bpftool_offset("request", "__data_len"));
    assert_eq!(plan.rq_bio, bpftool_offset("request", "bio"));
    assert_eq!(
        plan.disk_first_minor,
        bpftool_offset("gendisk", "first_minor")
    );
    if plan.q_disk != sysscope_abi::NO_FIELD {
        assert_eq!(plan.rq_q, bpftool_offset("request", "q"));
        assert_eq!(plan.q_disk, bpftool_offset("request_queue", "disk"));
    }
    if plan.bio_cgroup != 0 {
        assert_eq!(plan.bio_blkg, bpftool_offset("bio", "bi_blkg"));
        assert_eq!(plan.cgroup_kn, bpftool_offset("cgroup", "kn"));
        assert_eq!(plan.kn_id, bpftool_offset("kernfs_node", "id"));
    }
}

/// Mount point of a cgroup v1 hierarchy with the blkio controller, if any.
fn blkio_v1_mount() -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, _source, options) = (r.next()?, r.next()?, r.next()?);
        if fstype != "cgroup" || !options.split(',').any(|o| o == "blkio") {
            return None;
        }
        left.split_whitespace().nth(4).map(std::path::PathBuf::from)
    })
}

/// The bio -> blkcg -> cgroup -> kernfs id chain, read at offsets found in BTF, must name the
/// cgroup the kernel charged the I/O to. Production turns this chain on only when the io
/// controller is on cgroup v2; here it is forced on and checked against a cgroup v1 blkio
/// hierarchy (the machine's layout), where the bio's cgroup is a v1 directory whose inode
/// number the test knows. The test process sits outside that cgroup, so the bio's cgroup wins.
#[test]
fn bio_cgroup_chain_names_the_charged_cgroup() {
    if !require_root("bio_cgroup_chain_names_the_charged_cgroup") {
        return;
    }
    let Some(blkio) = blkio_v1_mount() else {
        eprintln!(
            "SKIPPED bio_cgroup_chain_names_the_charged_cgroup: no cgroup v1 blkio hierarchy"
        );
        return;
    };
    use sysscope::{
        config::Config,
        kernel::{block_io, LoadOptions, Probes},
    };
    use sysscope_abi::{maps, programs, BlockKey, BlockStats};

    let btf = sysscope::kernel::btf::Btf::from_kernel().unwrap();
    let plan = block_io::resolve_offsets(&btf, true, false).unwrap();
    assert_eq!(plan.bio_cgroup, 1, "this kernel has CONFIG_BLK_CGROUP");
    let config = Config::default();
    let mut probes = Probes::load(
        &config,
        &LoadOptions {
            block_io: Some(plan),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let stats: aya::maps::HashMap<_, BlockKey, BlockStats> =
        aya::maps::HashMap::try_from(probes.take_map(maps::BLOCK_STATS).unwrap()).unwrap();
    for (program, tracepoint) in [
        (programs::BLOCK_RQ_COMPLETE, "block_rq_complete"),
        (programs::BLOCK_RQ_ISSUE, "block_rq_issue"),
        (programs::BLOCK_IO_START, "block_io_start"),
    ] {
        // The verifier must accept the programs with the chain switched on.
        probes
            .attach_raw_tracepoint("test", program, tracepoint)
            .unwrap();
    }

    let dev = LoopDevice::new(8 * MIB);
    let v1 = blkio.join(format!("sysscope-test-bio-v1-{}", rand_suffix()));
    std::fs::create_dir(&v1).unwrap();
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _v1_guard = RemoveOnDrop(v1.clone());
    let v1_id = sysscope::metadata::cgroups::id_of(&v1).unwrap();
    let procs = v1.join("cgroup.procs");
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        &format!(
            "echo $$ > {} && exec dd if=/dev/zero of={} bs=1M count=4 oflag=direct",
            procs.display(),
            dev.path
        ),
    ]);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let loop_dev = {
        let majmin = std::fs::read_to_string(format!("/sys/block/{}/dev", dev.name)).unwrap();
        let (ma, mi) = majmin.trim().split_once(':').unwrap();
        sysscope_abi::dev::make(ma.parse().unwrap(), mi.parse().unwrap())
    };
    let mut charged: Vec<(u64, u64)> = stats
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, _)| k.dev == loop_dev && k.op == sysscope_abi::block_op::WRITE)
        .filter(|(k, _)| k.comm.starts_with(b"dd\0"))
        .map(|(k, v)| (k.cgroup_id, v.bytes))
        .collect();
    charged.sort_unstable();
    assert_eq!(
        charged,
        vec![(v1_id, 4 * MIB)],
        "dd's writes must be charged to the blkio cgroup {} (id {v1_id})",
        v1.display()
    );
}

/// Four cgroups whose short processes each read the loop device (a `BLOCK_STATS` key each)
/// fill every entry the processes may take; a fifth cgroup's writes are still counted, in
/// full, under its shared key, and so is every flooding read.
#[test]
fn four_tenants_filling_block_stats_leave_a_fifth_counted() {
    if !require_root("four_tenants_filling_block_stats_leave_a_fifth_counted") {
        return;
    }
    // The map is small and shared with every block request of the node: nothing beside it.
    let _alone = alone();
    const ENTRIES: u32 = 64;
    let exporter = Exporter::start(
        &format!(
            "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n\
             [block_io]\nmax_entries = {ENTRIES}\n"
        ),
        &[],
    );
    let dev = LoopDevice::new(16 * MIB);
    const READERS: u64 = 30;
    const BLOCK: u64 = 4096;
    // 30 processes a cgroup, each its own key: past the cgroup's bound (a quarter of the map),
    // and four cgroups past the processes' share (seven eighths).
    let script = format!(
        "for i in $(seq {READERS}); do dd if={} of=/dev/null bs={BLOCK} count=1 skip=$i \
         iflag=direct status=none || exit 1; done",
        dev.path
    );
    let floods: Vec<TestCgroup> = (0..4)
        .map(|i| TestCgroup::new(&format!("sysscope-test-bflood{i}")))
        .collect();
    let children: Vec<_> = floods
        .iter()
        .map(|cg| cg.command("sh").args(["-c", &script]).spawn().expect("sh"))
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a flooding reader failed");
    }
    let quiet = TestCgroup::new("sysscope-test-bquiet");
    let of = format!("of={}", dev.path);
    run_in(
        &quiet,
        "dd",
        &[
            "if=/dev/zero",
            &of,
            "bs=64k",
            "count=16",
            "oflag=direct",
            "status=none",
        ],
    );

    let samples = parse_samples(&exporter.scrape());
    let (quiet_bytes, quiet_requests) = io(&samples, Some(&quiet.rel), &dev.name, "write");
    let quiet_other = sum(
        &samples,
        "sysscope_block_io_bytes_total",
        &[
            ("cgroup", &quiet.rel),
            ("device", &dev.name),
            ("comm", "other"),
        ],
    );
    let flooded: Vec<u64> = floods
        .iter()
        .map(|cg| io(&samples, Some(&cg.rel), &dev.name, "read").0)
        .collect();
    let lost = sum(
        &samples,
        "sysscope_map_insert_failures_total",
        &[("map", "BLOCK_STATS")],
    );
    eprintln!(
        "quiet cgroup: {quiet_bytes} bytes written in {quiet_requests} requests \
         ({quiet_other} under comm=\"other\"); flooding cgroups read {flooded:?}; \
         BLOCK_STATS insert failures {lost}"
    );
    assert_eq!(
        quiet_bytes, MIB,
        "the quiet cgroup's bytes, beside the flood"
    );
    for (cg, bytes) in floods.iter().zip(&flooded) {
        assert_eq!(*bytes, READERS * BLOCK, "every read of {} counted", cg.rel);
        let other = sum(
            &samples,
            "sysscope_block_io_bytes_total",
            &[
                ("cgroup", &cg.rel),
                ("device", &dev.name),
                ("comm", "other"),
            ],
        );
        assert!(other > 0.0, "{} folded past its bound", cg.rel);
    }
    assert!(
        quiet_other > 0.0,
        "the quiet cgroup found the processes' share full and counted under its shared key"
    );
}

/// A loop device whose backing file lies on a tmpfs too small for it: once the tmpfs is full,
/// the loop driver fails every write. 4 KiB direct writes, each one request: those that
/// succeeded are the bytes moved, those that failed are failed requests, and not bytes.
#[test]
fn failed_writes_are_failed_requests_not_bytes() {
    if !require_root("failed_writes_are_failed_requests_not_bytes") {
        return;
    }
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let mnt = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(mnt.path())
        .status()
        .expect("mount");
    assert!(mounted.success(), "mount a tmpfs");
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(mnt.path());
    let backing = mnt.path().join("backing.img");
    std::fs::File::create(&backing)
        .and_then(|f| f.set_len(4 * MIB))
        .expect("sparse backing file");
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&backing)
        .output()
        .expect("losetup");
    assert!(out.status.success(), "losetup");
    let path = String::from_utf8(out.stdout).unwrap().trim().to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(path.clone());
    let name = path.trim_start_matches("/dev/").to_string();

    let cg = TestCgroup::new("sysscope-test-bfail");
    const WRITES: u64 = 256;
    const BLOCK: u64 = 4096;
    let (mut ok, mut failed) = (0u64, 0u64);
    for i in 0..WRITES {
        let status = cg
            .command("dd")
            .args([
                "if=/dev/urandom",
                &format!("of={path}"),
                &format!("bs={BLOCK}"),
                "count=1",
                &format!("seek={i}"),
                "oflag=direct",
                "conv=notrunc",
                "status=none",
            ])
            .stderr(std::process::Stdio::null())
            .status()
            .expect("dd");
        if status.success() {
            ok += 1;
        } else {
            failed += 1;
        }
    }
    assert!(
        ok > 0 && failed > 0,
        "the tmpfs should fill part way: {ok} writes succeeded, {failed} failed"
    );
    let samples = parse_samples(&exporter.scrape());
    let (bytes, requests) = io(&samples, Some(&cg.rel), &name, "write");
    let failed_requests = sum(
        &samples,
        "sysscope_block_io_failed_requests_total",
        &[("cgroup", &cg.rel), ("device", &name), ("op", "write")],
    ) as u64;
    eprintln!(
        "{ok} writes of {BLOCK} bytes succeeded, {failed} failed; sysscope: {bytes} bytes in \
         {requests} requests, {failed_requests} failed requests ({} bytes not counted)",
        failed * BLOCK
    );
    assert_eq!(bytes, ok * BLOCK, "bytes moved: the successful writes only");
    assert_eq!(requests, ok, "requests that completed successfully");
    assert_eq!(failed_requests, failed, "failed requests");
}
