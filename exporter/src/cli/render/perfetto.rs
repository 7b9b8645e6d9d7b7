//! Writers of `sysscope trace` output: Trace Event Format JSON (what Perfetto UI and
//! `chrome://tracing` open) and a `strace -f -T`-like text log.
//!
//! TEF layout: one `X` slice per syscall on its thread's track (`pid` = tgid, `tid` = tid,
//! `ts`/`dur` in µs since the trace started, args: arguments, return value, errno, path, and
//! for reads and writes `fd_kind` and `fs`), and inside it one `X` slice (category `sched`)
//! per stretch the call spent off its CPU, named `blocked`, `waiting for CPU` or
//! `off CPU (unknown)` (from `OFFCPU_EVENTS`; the rest of the call was on CPU),
//! `M` metadata naming every process and thread (and labelling processes with their cgroup),
//! `C` counter tracks for the node's CPU utilisation (and GPUs when NVML is present) on a
//! "node" process (pid 0), and `otherData` with the clock, the target and what was dropped.
//! The target's block I/O, when recorded, goes to a "block I/O of the target" process
//! ([`BLOCK_PID`]): `C` counter tracks `<device> bytes` and `<device> requests` (cumulative,
//! one series per op) and one `X` slice per request, issue to completion, on tracks named
//! after the device (several per device when requests overlap, so slices always nest).
//! Records are streamed to the file as they arrive, so memory stays flat; metadata comes last.

use std::{
    collections::{BTreeMap, HashMap},
    io::Write,
    path::Path,
    sync::Arc,
};

use sysscope_abi::{block_op, call_state, trace_flags, BlockTraceEvent, OffCpuEvent, TraceEvent};

use super::strace as format;
use crate::cli::sink::{BlockTotals, EventSink};
use crate::sources::nvml::{Nvml, NvmlLibrary};
use crate::{
    metadata::{
        cgroups::{self, CgroupResolver},
        devices::DeviceResolver,
    },
    sources::proc_stat::{self, CpuTicks, ProcStat},
    syscall_table,
};

/// Pid of the synthetic process that carries the node's counter tracks.
pub(crate) const NODE_PID: u32 = 0;

/// Pid of the synthetic process that carries the target's block I/O tracks: above any pid
/// the kernel hands out (`pid_max` is at most 2^22), within an i32 as viewers expect.
pub(crate) const BLOCK_PID: u32 = 0x7fff_0000;

/// Tracks per device for requests in flight at once; beyond, slices may overlap.
const MAX_LANES_PER_DEVICE: usize = 64;

/// The target's block I/O as tracks: device names, slice lanes, the latest totals.
#[derive(Debug, Default)]
struct BlockTracks {
    devices: DeviceResolver,
    names: HashMap<u32, Arc<str>>,
    /// Per device: (tid, end of the latest slice) of each lane.
    lanes: HashMap<u32, Vec<(u32, u64)>>,
    /// Lane tid -> track name.
    lane_names: BTreeMap<u32, String>,
    /// Latest totals, and the values of the last counter sample written.
    totals: BlockTotals,
    sampled: BlockTotals,
}

impl BlockTracks {
    fn name(&mut self, dev: u32) -> Arc<str> {
        if let Some(n) = self.names.get(&dev) {
            return n.clone();
        }
        let n = self.devices.resolve(dev);
        self.names.insert(dev, n.clone());
        n
    }

    /// The track of a slice from `start` to `end` on `dev`: the first lane whose slices all
    /// ended by `start`. Requests arrive in completion order, so a lane whose latest end is
    /// at or before `start` holds nothing the new slice could overlap.
    fn lane(&mut self, dev: u32, start: u64, end: u64) -> u32 {
        let name = self.name(dev);
        let lanes = self.lanes.entry(dev).or_default();
        let free = lanes.iter().position(|(_, last_end)| *last_end <= start);
        let i = match free {
            Some(i) => i,
            None if lanes.len() < MAX_LANES_PER_DEVICE => {
                let tid = BLOCK_PID + 1 + self.lane_names.len() as u32;
                let label = if lanes.is_empty() {
                    name.to_string()
                } else {
                    format!("{name} ({})", lanes.len() + 1)
                };
                self.lane_names.insert(tid, label);
                lanes.push((tid, 0));
                lanes.len() - 1
            }
            // Full: the lane that frees first (slices there may overlap).
            None => lanes
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, e))| *e)
                .map(|(i, _)| i)
                .unwrap_or(0),
        };
        let lane = &mut lanes[i];
        lane.1 = lane.1.max(end);
        lane.0
    }

    /// (device name, op name, bytes, requests) of every total, by device then op.
    fn summary(&mut self) -> Vec<(Arc<str>, &'static str, u64, u64)> {
        let totals: Vec<_> = self.totals.iter().map(|(k, v)| (*k, *v)).collect();
        totals
            .into_iter()
            .filter_map(|((dev, op), (bytes, requests))| {
                Some((self.name(dev), block_op::name(op)?, bytes, requests))
            })
            .collect()
    }
}

/// The output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    TraceEventJson,
    Text,
}

/// What the writer knows about a thread, for the metadata events.
#[derive(Debug, Clone)]
struct ThreadInfo {
    tgid: u32,
    comm: String,
}

/// Samples the node's CPU utilisation from /proc/stat.
#[derive(Debug, Default)]
pub(crate) struct CpuSampler {
    /// Per line (the total, then each CPU by number): the ticks of each mode at the previous
    /// sample.
    last: HashMap<Option<u32>, CpuTicks>,
}

impl CpuSampler {
    /// Utilisation (%) per mode of every cpu line since the previous call (empty the first
    /// time): `("cpu", [("user", 12.5), ...])`, then one line per CPU.
    pub(crate) fn sample(&mut self, stat: &ProcStat) -> Vec<(String, Vec<(&'static str, f64)>)> {
        let mut out = Vec::new();
        let lines = stat
            .total
            .iter()
            .map(|ticks| (None, ticks))
            .chain(stat.cpus.iter().map(|(cpu, ticks)| (Some(*cpu), ticks)));
        for (cpu, ticks) in lines {
            if let Some(prev) = self.last.get(&cpu) {
                let deltas = ticks.since(prev);
                let total: u64 = deltas.iter().sum();
                if total > 0 {
                    let modes = proc_stat::MODES
                        .iter()
                        .zip(&deltas)
                        .map(|(m, d)| (*m, *d as f64 * 100.0 / total as f64))
                        .collect();
                    let name = cpu.map_or_else(|| "cpu".to_string(), |n| format!("cpu{n}"));
                    out.push((name, modes));
                }
            }
            self.last.insert(cpu, *ticks);
        }
        out
    }
}

/// GPU utilisation through NVML (the same source as the `gpu` collector), when the library
/// and a GPU are present.
pub(crate) struct GpuSampler {
    nvml: Box<dyn Nvml>,
    devices: u32,
}

impl GpuSampler {
    /// `None` when NVML cannot be loaded from `library` (no NVIDIA driver) or sees no GPU.
    pub(crate) fn open(library: &str) -> Option<Self> {
        let mut nvml: Box<dyn Nvml> = Box::new(NvmlLibrary::connect(library).ok()?);
        let devices = nvml.device_count().ok()?;
        (devices > 0).then_some(Self { nvml, devices })
    }

    /// (gpu index, utilisation %, memory-controller utilisation %).
    pub(crate) fn sample(&mut self) -> Vec<(u32, f64, f64)> {
        (0..self.devices)
            .filter_map(|i| {
                let (gpu, memory) = self.nvml.utilization(i).ok()??;
                Some((i, gpu as f64, memory as f64))
            })
            .collect()
    }
}

/// Counts kept by the writer, for the summary line and `otherData`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WriterStats {
    /// Syscall slices written.
    pub written: u64,
    /// Records received beyond `--max-events`.
    pub(crate) over_limit: u64,
    /// Counter samples written.
    pub(crate) counter_samples: u64,
    /// Block request slices written.
    pub(crate) block_written: u64,
    /// Block requests received beyond `--max-events` (a budget of their own).
    pub(crate) block_over_limit: u64,
    /// Slices of calls' stretches off CPU written.
    pub(crate) off_cpu_written: u64,
    /// Stretches off CPU received beyond `--max-events` (a budget of their own).
    pub(crate) off_cpu_over_limit: u64,
}

/// The trace writer: an [`EventSink`] streaming to `out`.
pub(crate) struct TraceWriter {
    out: Box<dyn Write>,
    format: Format,
    base_ns: u64,
    max_events: u64,
    stats: WriterStats,
    first: bool,
    threads: BTreeMap<u32, ThreadInfo>,
    cgroups: HashMap<u32, u64>,
    error: Option<std::io::Error>,
    cpu: Option<CpuSampler>,
    gpu: Option<GpuSampler>,
    sample_every_ns: u64,
    next_sample_ns: u64,
    /// Present once block totals or requests of the target arrived.
    block: Option<BlockTracks>,
}

impl std::fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("format", &self.format)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// `ns` as µs with three decimals, the unit of TEF timestamps.
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

impl TraceWriter {
    /// `counters_every_ns`: CPU (and GPU) sampling period, 0 for none.
    pub(crate) fn new(
        out: Box<dyn Write>,
        format: Format,
        max_events: u64,
        counters_every_ns: u64,
    ) -> Self {
        let cpu =
            (counters_every_ns > 0 && format == Format::TraceEventJson).then(CpuSampler::default);
        let mut w = Self {
            out,
            format,
            base_ns: 0,
            max_events,
            stats: WriterStats::default(),
            first: true,
            threads: BTreeMap::new(),
            cgroups: HashMap::new(),
            error: None,
            cpu,
            gpu: None,
            sample_every_ns: counters_every_ns,
            next_sample_ns: 0,
            block: None,
        };
        if format == Format::TraceEventJson {
            w.raw("{\"traceEvents\":[\n");
        }
        w
    }

    /// Adds GPU counter tracks from the NVML library `library` (`gpu.nvml_library`), when
    /// counters are sampled and NVML sees a GPU; `None` leaves them out (`gpu.enabled = false`).
    pub(crate) fn with_gpu(mut self, library: Option<&str>) -> Self {
        if self.cpu.is_some() {
            self.gpu = library.and_then(GpuSampler::open);
        }
        self
    }

    fn raw(&mut self, s: &str) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(s.as_bytes()) {
                self.error = Some(e);
            }
        }
    }

    /// Writes one JSON event, with the separator the array needs.
    fn json_event(&mut self, body: &str) {
        let sep = if self.first { "" } else { ",\n" };
        self.first = false;
        let s = format!("{sep}{body}");
        self.raw(&s);
    }

    fn slice(&mut self, e: &TraceEvent) {
        let name = format::name_of(e);
        let ts = micros(e.call.start_ns.saturating_sub(self.base_ns));
        let dur = micros(e.call.end_ns.saturating_sub(e.call.start_ns));
        let mut args = format!("\"args\":{}", json_str(&format::format_args(e)));
        if e.flags & trace_flags::NO_RETURN == 0 {
            if let Some(errno) = format::errno_of(e.ret) {
                args.push_str(&format!(
                    ",\"ret\":-1,\"errno\":{}",
                    json_str(&syscall_table::errno_label(errno))
                ));
            } else {
                let ret = format::format_return(e.nr, e.ret);
                // Numbers stay numbers; addresses are hex strings.
                let ret = if ret.starts_with("0x") {
                    json_str(&ret)
                } else {
                    ret
                };
                args.push_str(&format!(",\"ret\":{ret}"));
            }
        }
        if let Some(p) = format::path_of(e) {
            args.push_str(&format!(",\"path\":{}", json_str(&p)));
        }
        // What the descriptor was at entry, as the kernel classified it.
        let mut fd_labels = Vec::with_capacity(2);
        crate::kernel::fd_class::push_labels(&e.fd, &mut fd_labels);
        for (label, value) in fd_labels {
            args.push_str(&format!(",\"{label}\":{}", json_str(&value)));
        }
        let body = format!(
            "{{\"ph\":\"X\",\"cat\":\"syscall\",\"name\":{},\"pid\":{},\"tid\":{},\"ts\":{ts},\"dur\":{dur},\"args\":{{{args}}}}}",
            json_str(&name),
            e.call.tgid,
            e.call.tid
        );
        self.json_event(&body);
    }

    /// A stretch off CPU inside a call, on the calling thread's track: it lies within the
    /// call's slice, so the viewer nests it there; the rest of the call is on CPU.
    fn off_cpu_slice(&mut self, e: &OffCpuEvent) {
        let name = match e.state {
            call_state::BLOCKED => "blocked",
            call_state::RUNNABLE => "waiting for CPU",
            _ => "off CPU (unknown)",
        };
        let body = format!(
            "{{\"ph\":\"X\",\"cat\":\"sched\",\"name\":\"{name}\",\"pid\":{},\"tid\":{},\"ts\":{},\"dur\":{},\"args\":{{\"syscall\":{}}}}}",
            e.tgid,
            e.tid,
            micros(e.start_ns.saturating_sub(self.base_ns)),
            micros(e.end_ns.saturating_sub(e.start_ns)),
            json_str(&syscall_table::label(e.nr)),
        );
        self.json_event(&body);
    }

    fn block_slice(&mut self, e: &BlockTraceEvent) {
        let Some(op) = block_op::name(e.op) else {
            return;
        };
        let block = self.block.get_or_insert_with(BlockTracks::default);
        let device = block.name(e.dev);
        let tid = block.lane(e.dev, e.issue_ns, e.complete_ns);
        let latency = e.complete_ns.saturating_sub(e.issue_ns);
        let mut args = format!(
            "\"device\":{},\"op\":\"{op}\",\"bytes\":{},\"sector\":{},\"latency_us\":{},\"queued_us\":{},\"pid\":{},\"comm\":{}",
            json_str(&device),
            e.bytes,
            e.sector,
            micros(latency),
            micros(e.issue_ns.saturating_sub(e.submit_ns)),
            e.tgid,
            json_str(&crate::metadata::processes::comm_from_bytes(&e.comm)),
        );
        if e.error != 0 {
            args.push_str(&format!(",\"error\":{}", e.error));
        }
        let body = format!(
            "{{\"ph\":\"X\",\"cat\":\"block\",\"name\":\"{op}\",\"pid\":{BLOCK_PID},\"tid\":{tid},\"ts\":{},\"dur\":{},\"args\":{{{args}}}}}",
            micros(e.issue_ns.saturating_sub(self.base_ns)),
            micros(latency)
        );
        self.json_event(&body);
    }

    /// Block counter samples: `<device> bytes` and `<device> requests`, one series per op
    /// (bytes without `flush`, which moves none). A device starts at 0 at the trace's start;
    /// later samples are written when a value changed, and always with `force`.
    fn sample_block(&mut self, now_ns: u64, force: bool) {
        let Some(block) = self.block.as_mut() else {
            return;
        };
        let mut samples: Vec<(String, u64, String)> = Vec::new();
        let devices: Vec<u32> = block
            .totals
            .keys()
            .map(|(d, _)| *d)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for dev in devices {
            let ops: Vec<(u8, (u64, u64))> = block
                .totals
                .range((dev, 0)..=(dev, u8::MAX))
                .map(|((_, op), v)| (*op, *v))
                .collect();
            let new_device = !block.sampled.keys().any(|(d, _)| *d == dev);
            let changed = ops
                .iter()
                .any(|(op, v)| block.sampled.get(&(dev, *op)) != Some(v));
            if !(changed || force) {
                continue;
            }
            let name = block.name(dev);
            let series = |bytes: bool, zero: bool| {
                ops.iter()
                    .filter(|(op, _)| !(bytes && *op == block_op::FLUSH))
                    .filter_map(|(op, (b, r))| {
                        let v = if zero {
                            0
                        } else if bytes {
                            *b
                        } else {
                            *r
                        };
                        Some(format!("\"{}\":{v}", block_op::name(*op)?))
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let base = self.base_ns;
            for (unit, bytes) in [("bytes", true), ("requests", false)] {
                let track = format!("{name} {unit}");
                if new_device {
                    samples.push((track.clone(), base, series(bytes, true)));
                }
                samples.push((track, now_ns, series(bytes, false)));
            }
            for (op, v) in ops {
                block.sampled.insert((dev, op), v);
            }
        }
        for (track, ts, args) in samples {
            let body = format!(
                "{{\"ph\":\"C\",\"name\":{},\"pid\":{BLOCK_PID},\"tid\":{BLOCK_PID},\"ts\":{},\"args\":{{{args}}}}}",
                json_str(&track),
                micros(ts.saturating_sub(self.base_ns))
            );
            self.json_event(&body);
            self.stats.counter_samples += 1;
        }
    }

    /// (device, op, bytes, requests) of the target's block I/O so far, by device then op.
    pub(crate) fn block_summary(&mut self) -> Vec<(Arc<str>, &'static str, u64, u64)> {
        self.block
            .as_mut()
            .map(BlockTracks::summary)
            .unwrap_or_default()
    }

    fn counter(&mut self, name: &str, ts_ns: u64, values: &[(&str, f64)]) {
        let args = values
            .iter()
            .map(|(k, v)| format!("{}:{v:.2}", json_str(k)))
            .collect::<Vec<_>>()
            .join(",");
        let body = format!(
            "{{\"ph\":\"C\",\"name\":{},\"pid\":{NODE_PID},\"tid\":{NODE_PID},\"ts\":{},\"args\":{{{args}}}}}",
            json_str(name),
            micros(ts_ns.saturating_sub(self.base_ns))
        );
        self.json_event(&body);
        self.stats.counter_samples += 1;
    }

    fn sample_counters(&mut self, now_ns: u64) {
        if let Some(cpu) = self.cpu.as_mut() {
            let lines = proc_stat::read(Path::new(proc_stat::PATH))
                .map(|stat| cpu.sample(&stat))
                .unwrap_or_default();
            for (name, modes) in lines {
                if name == "cpu" {
                    let values: Vec<(&str, f64)> = modes
                        .iter()
                        .filter(|(m, _)| *m != "idle")
                        .map(|(m, v)| (*m, *v))
                        .collect();
                    self.counter("CPU utilization (%)", now_ns, &values);
                } else {
                    let busy: f64 = modes
                        .iter()
                        .filter(|(m, _)| *m != "idle" && *m != "iowait")
                        .map(|(_, v)| v)
                        .sum();
                    self.counter(&format!("{name} busy (%)"), now_ns, &[("busy", busy)]);
                }
            }
        }
        let gpu_samples = self.gpu.as_mut().map(|g| g.sample()).unwrap_or_default();
        for (i, util, mem) in gpu_samples {
            self.counter(
                &format!("gpu{i} utilization (%)"),
                now_ns,
                &[("gpu", util), ("memory", mem)],
            );
        }
    }

    /// Writes the metadata and the closing part, and flushes. `other` is merged into
    /// `otherData`.
    pub(crate) fn finish(
        mut self,
        other: serde_json::Value,
    ) -> Result<WriterStats, std::io::Error> {
        if self.sample_every_ns > 0 {
            // One last sample, so even a run shorter than the period has its counters.
            let now = crate::cli::monotonic_ns();
            self.sample_counters(now);
            if self.format == Format::TraceEventJson {
                self.sample_block(now, true);
            }
        }
        let block_summary = self.block_summary();
        match self.format {
            Format::TraceEventJson => {
                let threads = std::mem::take(&mut self.threads);
                let mut processes: BTreeMap<u32, String> = BTreeMap::new();
                for (tid, t) in &threads {
                    // The process is named after its main thread, else after any thread.
                    if *tid == t.tgid || !processes.contains_key(&t.tgid) {
                        processes.insert(t.tgid, t.comm.clone());
                    }
                }
                if self.cpu.is_some() || self.gpu.is_some() {
                    processes.insert(NODE_PID, "node".to_string());
                }
                let lanes = self
                    .block
                    .as_ref()
                    .map(|b| b.lane_names.clone())
                    .unwrap_or_default();
                if !lanes.is_empty() || !block_summary.is_empty() {
                    processes.insert(BLOCK_PID, "block I/O of the target".to_string());
                }
                let mut resolver = None;
                for (pid, name) in &processes {
                    let body = format!(
                        "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":{pid},\"args\":{{\"name\":{}}}}}",
                        json_str(name)
                    );
                    self.json_event(&body);
                    if let Some(cg) = self.cgroups.get(pid).copied() {
                        let label = cgroup_label(&mut resolver, cg);
                        let body = format!(
                            "{{\"ph\":\"M\",\"name\":\"process_labels\",\"pid\":{pid},\"tid\":{pid},\"args\":{{\"labels\":{}}}}}",
                            json_str(&label)
                        );
                        self.json_event(&body);
                    }
                }
                for (tid, t) in &threads {
                    let body = format!(
                        "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                        t.tgid,
                        json_str(&t.comm)
                    );
                    self.json_event(&body);
                }
                for (tid, name) in &lanes {
                    let body = format!(
                        "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{BLOCK_PID},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                        json_str(name)
                    );
                    self.json_event(&body);
                }
                let mut data = serde_json::json!({
                    "tool": "sysscope trace",
                    "version": crate::build_info::VERSION,
                    "clock": "CLOCK_MONOTONIC",
                    "start_monotonic_ns": self.base_ns,
                    "events_written": self.stats.written,
                    "dropped_over_max_events": self.stats.over_limit,
                });
                if self.block.is_some() {
                    let mut devices = serde_json::Map::new();
                    for (dev, op, bytes, requests) in &block_summary {
                        let entry = devices
                            .entry(dev.to_string())
                            .or_insert_with(|| serde_json::json!({}));
                        entry[*op] = serde_json::json!({"bytes": bytes, "requests": requests});
                    }
                    data["block_io"] = serde_json::json!({
                        "totals": devices,
                        "requests_written": self.stats.block_written,
                        "requests_dropped_over_max_events": self.stats.block_over_limit,
                    });
                }
                if let (Some(obj), serde_json::Value::Object(extra)) = (data.as_object_mut(), other)
                {
                    obj.extend(extra);
                }
                let tail = format!(
                    "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{}\n}}\n",
                    data
                );
                self.raw(&tail);
            }
            Format::Text => {
                for (dev, op, bytes, requests) in &block_summary {
                    let line =
                        format!("# block I/O {dev} {op}: {bytes} bytes in {requests} requests\n");
                    self.raw(&line);
                }
                let line = format!(
                    "# sysscope trace: {} calls written, {} over --max-events, {}\n",
                    self.stats.written, self.stats.over_limit, other
                );
                self.raw(&line);
            }
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.stats)
    }
}

/// "cgroup=/path" for a cgroup id, when it can be resolved.
fn cgroup_label(resolver: &mut Option<CgroupResolver>, id: u64) -> String {
    if resolver.is_none() {
        *resolver = cgroups::v2_mount().ok().map(CgroupResolver::new);
    }
    match resolver.as_mut().map(|r| r.resolve(id)) {
        Some(path) if &*path != cgroups::UNRESOLVED => format!("cgroup={path}"),
        _ => format!("cgroup_id={id}"),
    }
}

impl EventSink for TraceWriter {
    fn start(&mut self, start_ns: u64) {
        self.base_ns = start_ns;
        self.next_sample_ns = start_ns;
        if self.sample_every_ns > 0 {
            self.sample_counters(start_ns);
            self.next_sample_ns = start_ns + self.sample_every_ns;
        }
    }

    fn event(&mut self, e: &TraceEvent) {
        if self.stats.written >= self.max_events {
            self.stats.over_limit += 1;
            return;
        }
        self.stats.written += 1;
        // The latest comm wins: a thread that execs is renamed.
        let comm = format::comm_of(e);
        match self.threads.get_mut(&e.call.tid) {
            Some(t) => {
                if t.comm != comm {
                    t.comm = comm;
                }
                t.tgid = e.call.tgid;
            }
            None => {
                self.threads.insert(
                    e.call.tid,
                    ThreadInfo {
                        tgid: e.call.tgid,
                        comm,
                    },
                );
            }
        }
        self.cgroups.entry(e.call.tgid).or_insert(e.call.cgroup_id);
        match self.format {
            Format::TraceEventJson => self.slice(e),
            Format::Text => {
                let mut line = format::strace_line(e, self.base_ns);
                line.push('\n');
                self.raw(&line);
            }
        }
    }

    fn tick(&mut self, now_ns: u64) {
        if self.sample_every_ns > 0 && now_ns >= self.next_sample_ns {
            self.sample_counters(now_ns);
            if self.format == Format::TraceEventJson {
                self.sample_block(now_ns, false);
            }
            self.next_sample_ns = now_ns + self.sample_every_ns;
        }
    }

    fn block_event(&mut self, e: &BlockTraceEvent) {
        // Per-request detail is for the timeline; the text log gets the totals.
        if self.format != Format::TraceEventJson {
            return;
        }
        if self.stats.block_written >= self.max_events {
            self.stats.block_over_limit += 1;
            return;
        }
        self.stats.block_written += 1;
        self.block_slice(e);
    }

    fn block_totals(&mut self, totals: &BlockTotals) {
        if totals.is_empty() && self.block.is_none() {
            return;
        }
        self.block.get_or_insert_with(BlockTracks::default).totals = totals.clone();
    }

    fn off_cpu(&mut self, e: &OffCpuEvent) {
        // Slices are for the timeline; the text log has the calls only.
        if self.format != Format::TraceEventJson {
            return;
        }
        if self.stats.off_cpu_written >= self.max_events {
            self.stats.off_cpu_over_limit += 1;
            return;
        }
        self.stats.off_cpu_written += 1;
        self.off_cpu_slice(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use sysscope_abi::CallStamp;

    /// A Write that keeps what was written, shared with the test.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn ev(tgid: u32, tid: u32, name: &str, start: u64, dur: u64, ret: i64) -> TraceEvent {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"work");
        TraceEvent {
            call: CallStamp {
                start_ns: start,
                end_ns: start + dur,
                tgid,
                tid,
                ..CallStamp::default()
            },
            nr: syscall_table::number(name).unwrap(),
            ret,
            comm,
            ..TraceEvent::default()
        }
    }

    #[test]
    fn writes_valid_trace_event_json() {
        let buf = Shared::default();
        let mut w = TraceWriter::new(Box::new(buf.clone()), Format::TraceEventJson, 2, 0);
        w.start(1_000_000);
        w.event(&ev(10, 10, "getppid", 1_001_500, 250, 1));
        w.event(&ev(10, 11, "openat", 1_002_000, 1000, -2));
        w.event(&ev(10, 11, "close", 1_003_000, 100, 0));
        let stats = w.finish(serde_json::json!({"target": "x"})).unwrap();
        assert_eq!(stats.written, 2);
        assert_eq!(stats.over_limit, 1);
        let v: serde_json::Value = serde_json::from_slice(&buf.0.lock().unwrap()).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let slices: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[0]["name"], "getppid");
        assert_eq!(slices[0]["ts"].as_f64().unwrap(), 1.5);
        assert_eq!(slices[0]["dur"].as_f64().unwrap(), 0.25);
        assert_eq!(slices[1]["args"]["errno"], "ENOENT");
        let meta: Vec<_> = events.iter().filter(|e| e["ph"] == "M").collect();
        assert!(meta
            .iter()
            .any(|m| m["name"] == "process_name" && m["pid"] == 10 && m["args"]["name"] == "work"));
        assert_eq!(
            meta.iter().filter(|m| m["name"] == "thread_name").count(),
            2
        );
        assert_eq!(v["otherData"]["dropped_over_max_events"], 1);
        assert_eq!(v["otherData"]["target"], "x");
    }

    #[test]
    fn block_requests_and_totals_become_tracks() {
        use sysscope_abi::dev;
        let buf = Shared::default();
        // A device number no machine has: the track is named major:minor.
        let disk = dev::make(4000, 7);
        let mut w = TraceWriter::new(Box::new(buf.clone()), Format::TraceEventJson, 10, 1);
        w.start(1_000_000);
        let rq = |issue: u64, complete: u64, op: u8, bytes: u64| BlockTraceEvent {
            submit_ns: issue,
            issue_ns: issue,
            complete_ns: complete,
            sector: 8,
            bytes,
            tgid: 42,
            dev: disk,
            op,
            ..BlockTraceEvent::default()
        };
        // Completion order: B (inside A) first, then A, then C after both.
        w.block_event(&rq(1_100_000, 1_200_000, block_op::WRITE, 4096));
        w.block_event(&rq(1_050_000, 1_300_000, block_op::WRITE, 8192));
        w.block_event(&rq(1_400_000, 1_500_000, block_op::READ, 512));
        let mut totals = BlockTotals::new();
        totals.insert((disk, block_op::WRITE), (12288, 2));
        totals.insert((disk, block_op::READ), (512, 1));
        totals.insert((disk, block_op::FLUSH), (0, 1));
        w.block_totals(&totals);
        let stats = w.finish(serde_json::json!({})).unwrap();
        assert_eq!(stats.block_written, 3);
        let v: serde_json::Value = serde_json::from_slice(&buf.0.lock().unwrap()).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let slices: Vec<_> = events.iter().filter(|e| e["cat"] == "block").collect();
        assert_eq!(slices.len(), 3);
        // The overlapping write went to a second track; the read reuses the first.
        assert_ne!(slices[0]["tid"], slices[1]["tid"]);
        assert_eq!(slices[2]["tid"], slices[0]["tid"]);
        assert_eq!(slices[1]["ts"].as_f64(), Some(50.0));
        assert_eq!(slices[1]["dur"].as_f64(), Some(250.0));
        assert_eq!(slices[1]["args"]["bytes"], 8192);
        assert_eq!(slices[1]["args"]["device"], "4000:7");
        let names: Vec<_> = events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == BLOCK_PID)
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["4000:7", "4000:7 (2)"]);
        let counters = |name: &str| -> Vec<&serde_json::Value> {
            events
                .iter()
                .filter(|e| e["ph"] == "C" && e["name"] == name)
                .map(|e| &e["args"])
                .collect()
        };
        let bytes = counters("4000:7 bytes");
        assert_eq!(bytes.len(), 2, "a zero at the start, then the final totals");
        assert_eq!(bytes[0]["write"], 0);
        assert_eq!(bytes[1]["write"], 12288);
        assert!(bytes[1].get("flush").is_none(), "flushes move no bytes");
        assert_eq!(counters("4000:7 requests")[1]["flush"], 1);
        assert_eq!(
            v["otherData"]["block_io"]["totals"]["4000:7"]["read"]["bytes"],
            512
        );
    }

    #[test]
    fn cpu_utilisation_from_proc_stat() {
        let mut s = CpuSampler::default();
        let stat = |text| proc_stat::parse(text, "stat").unwrap();
        let a = stat("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\n");
        let b = stat("cpu  150 0 150 900 0 0 0 0 0 0\ncpu0 150 0 150 900 0 0 0 0 0 0\n");
        assert!(s.sample(&a).is_empty());
        let out = s.sample(&b);
        assert_eq!(out.len(), 2);
        let (name, modes) = &out[0];
        assert_eq!(name, "cpu");
        let get = |m: &str| modes.iter().find(|(k, _)| *k == m).unwrap().1;
        assert_eq!(get("user"), 25.0);
        assert_eq!(get("system"), 25.0);
        assert_eq!(get("idle"), 50.0);
    }
}
