//! One slow call: the kernel's record (`SlowCallEvent` from `SLOW_EVENTS`) decoded, given its
//! process, cgroup and file context, and expressed as an OpenTelemetry span (and as JSON for
//! the local endpoint). Attribute names follow DESIGN.md: semantic-convention names where one
//! exists, `sysscope.syscall.*` for the rest.

use std::{
    borrow::Cow,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use opentelemetry::{
    trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState},
    InstrumentationScope, KeyValue,
};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use rand::Rng;
use sysscope_abi::{fd_class::file, FileIdentity, SlowCallEvent};

use super::{args, clock::WallClock};
use crate::{
    kernel::fd_class,
    metadata::{
        cgroups::UNRESOLVED,
        kubernetes,
        processes::{comm_from_bytes, UNKNOWN_COMM},
        SharedLabeler,
    },
    series::LabelControl,
    syscall_table,
};

/// Largest errno the kernel returns as a negative value.
const MAX_ERRNO: i64 = 4095;

/// A span attribute value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AttrValue {
    Int(i64),
    Str(Arc<str>),
}

impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}

impl From<&str> for AttrValue {
    fn from(v: &str) -> Self {
        AttrValue::Str(Arc::from(v))
    }
}

impl From<Arc<str>> for AttrValue {
    fn from(v: Arc<str>) -> Self {
        AttrValue::Str(v)
    }
}

/// A slow call with its context: what a span carries, independent of where it goes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SlowCall {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
    /// The syscall name (`read`), or `syscall_<nr>` for numbers the table lacks.
    pub(crate) name: Cow<'static, str>,
    pub(crate) start_unix_ns: u64,
    pub(crate) end_unix_ns: u64,
    /// Duration measured in the kernel (exit minus entry, CLOCK_MONOTONIC).
    pub(crate) duration_ns: u64,
    /// errno name when the call failed.
    pub(crate) error: Option<Cow<'static, str>>,
    pub(crate) attributes: Vec<(&'static str, AttrValue)>,
}

impl SlowCall {
    pub(crate) fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    pub(crate) fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    #[cfg(test)]
    pub(crate) fn attribute(&self, key: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find_map(|(k, v)| (*k == key).then_some(v))
    }

    /// The span as the OpenTelemetry SDK's exporters take it: a root span of its own trace
    /// (the application's trace context is not visible to the kernel), kind internal.
    pub(crate) fn to_span_data(&self, scope: &InstrumentationScope) -> SpanData {
        let attributes = self
            .attributes
            .iter()
            .map(|(k, v)| match v {
                AttrValue::Int(i) => KeyValue::new(*k, *i),
                AttrValue::Str(s) => KeyValue::new(*k, s.to_string()),
            })
            .collect();
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(self.trace_id),
                SpanId::from_bytes(self.span_id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: self.name.clone(),
            start_time: UNIX_EPOCH + Duration::from_nanos(self.start_unix_ns),
            end_time: UNIX_EPOCH + Duration::from_nanos(self.end_unix_ns),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: match &self.error {
                Some(e) => Status::error(e.clone()),
                None => Status::Unset,
            },
            instrumentation_scope: scope.clone(),
        }
    }

    /// The JSON served at the local endpoint.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let attributes: serde_json::Map<String, serde_json::Value> = self
            .attributes
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    AttrValue::Int(i) => serde_json::Value::from(*i),
                    AttrValue::Str(s) => serde_json::Value::from(s.as_ref()),
                };
                (k.to_string(), v)
            })
            .collect();
        serde_json::json!({
            "name": self.name,
            "trace_id": self.trace_id_hex(),
            "span_id": self.span_id_hex(),
            "start_time": super::clock::rfc3339(self.start_unix_ns),
            "end_time": super::clock::rfc3339(self.end_unix_ns),
            "start_time_unix_nano": self.start_unix_ns,
            "end_time_unix_nano": self.end_unix_ns,
            "duration_seconds": self.duration_ns as f64 / 1e9,
            "status": if self.error.is_some() { "error" } else { "unset" },
            "attributes": attributes,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What user space adds to the record, taken as soon as it is read, before anything that may
/// wait (the labeler lock, a blocking thread): the executable, and the name of the call's file
/// when the kernel could not give it (from `/proc`, which is gone once the process exits).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProcContext {
    /// Base name of `/proc/<pid>/exe`.
    pub(crate) exe: Option<String>,
    /// The descriptor the call used (or returned), if it is one.
    pub(crate) fd: Option<i32>,
    /// What that descriptor named: its path, or the kernel's name of a pseudo-file
    /// (`pipe:[<inode>]`, ...), when known.
    pub(crate) fd_path: Option<String>,
    /// Why it is not known (paths on, the call had a descriptor).
    pub(crate) fd_path_error: Option<&'static str>,
}

impl ProcContext {
    /// Reads the context of `ev`, whose record carried `name`, under `proc_root` (`/proc`).
    /// Paths only when `resolve_paths`.
    pub(crate) fn capture(
        ev: &SlowCallEvent,
        name: &[u8],
        resolve_paths: bool,
        proc_root: &Path,
    ) -> Self {
        let syscall = syscall_table::label(ev.nr);
        let spec = args::spec_of(&syscall);
        let failed = ev.ret < 0 && ev.ret >= -MAX_ERRNO;
        let fd = if spec.ret_fd {
            (!failed && (0..=i32::MAX as i64).contains(&ev.ret)).then_some(ev.ret as i32)
        } else {
            spec.fd
                .and_then(|i| ev.args.get(i).copied())
                .and_then(args::as_fd)
        };
        let (fd_path, fd_path_error) = match fd {
            Some(fd) if resolve_paths && !spec.consumes_fd => {
                match name_file(ev, name, fd, proc_root) {
                    Ok(path) => (Some(path), None),
                    Err(why) => (None, Some(why)),
                }
            }
            _ => (None, None),
        };
        let exe = std::fs::read_link(proc_root.join(format!("{}/exe", ev.call.tgid)))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        Self {
            exe,
            fd,
            fd_path,
            fd_path_error,
        }
    }
}

/// The name of the file behind descriptor `fd` of `ev`'s call, or why there is none.
///
/// The kernel read the file at the call's exit, while the descriptor was open: pipes, sockets
/// and anonymous inodes are named from that alone, files by the path it walked. `/proc` is
/// asked only when the kernel could not name the file (a path longer than the record holds, a
/// namespace file, a kernel without the offsets), and its answer is taken only while
/// `/proc/<pid>/fd/<fd>` still opens the file the kernel saw (same device and inode): a
/// descriptor number closed and reused for another file since the call never lends that
/// file's name. A truncated path whose full form `/proc` cannot give is marked with a leading
/// `...`.
fn name_file(
    ev: &SlowCallEvent,
    name: &[u8],
    fd: i32,
    proc_root: &Path,
) -> Result<String, &'static str> {
    let id = &ev.file;
    match id.status {
        file::OPEN => {}
        file::NOT_OPEN => return Err("not_open"),
        // Not read by the kernel (no offsets for this kernel), or unreadable there: what
        // /proc says now, unchecked.
        _ => return proc_link(ev, fd, proc_root, None),
    }
    if let Some(named) = fd_class::inode_name(id, name) {
        return Ok(named);
    }
    let walked = (id.name == file::NAME_PATH && !name.is_empty()).then(|| {
        let mut path = String::from_utf8_lossy(name).into_owned();
        if id.flags & file::DELETED != 0 {
            path.push_str(" (deleted)");
        }
        path
    });
    match walked {
        Some(path) if id.flags & file::TRUNCATED == 0 => Ok(path),
        partial => proc_link(ev, fd, proc_root, Some(id))
            .or_else(|why| partial.map(|tail| format!("...{tail}")).ok_or(why)),
    }
}

/// Where `/proc/<pid>/task/<tid>/fd/<fd>` points (the calling thread's table first: it may have
/// unshared it; then the process's, once the thread is gone), when it still opens the file
/// `expect` names (any file when `None`).
fn proc_link(
    ev: &SlowCallEvent,
    fd: i32,
    proc_root: &Path,
    expect: Option<&FileIdentity>,
) -> Result<String, &'static str> {
    let thread = proc_root.join(format!("{}/task/{}/fd/{fd}", ev.call.tgid, ev.call.tid));
    let process = proc_root.join(format!("{}/fd/{fd}", ev.call.tgid));
    read_link_of(&thread, expect).or_else(|_| read_link_of(&process, expect))
}

/// Reads descriptor link `link`, checking before and after that it opens the file `expect`
/// names: a link that opens that file on both sides of the read named it in between, unless
/// the number was reused twice within those microseconds (closed, reopened on another file,
/// closed and reopened on this one).
fn read_link_of(link: &Path, expect: Option<&FileIdentity>) -> Result<String, &'static str> {
    let opens_expected = || -> Result<(), &'static str> {
        let Some(id) = expect else {
            return Ok(());
        };
        let meta = std::fs::metadata(link).map_err(|e| path_error(&e))?;
        if meta.ino() == id.ino && fd_class::kernel_device(meta.dev()) == id.dev {
            Ok(())
        } else {
            Err("reused")
        }
    };
    opens_expected()?;
    let path = std::fs::read_link(link).map_err(|e| path_error(&e))?;
    opens_expected()?;
    Ok(path.to_string_lossy().into_owned())
}

/// A slow call and the label set of the latency series it was counted in (for exemplars).
#[derive(Debug, Clone)]
pub(crate) struct Enriched {
    pub(crate) call: SlowCall,
    /// `(label, value)` pairs of `sysscope_syscall_duration_seconds` for this call's workload.
    pub(crate) series_labels: Vec<(&'static str, String)>,
}

/// Turns kernel records into [`SlowCall`]s: wall-clock times, process and cgroup context
/// (through the labeler the collectors share, so spans and metrics name workloads alike) and,
/// when enabled, the path behind the file descriptor.
pub(crate) struct Enricher {
    labeler: SharedLabeler,
    /// What the latency series keep of their labels: the exemplar's series is the call's.
    control: LabelControl,
    clock: WallClock,
    resolve_paths: bool,
    proc_root: PathBuf,
    /// Whether the probes split calls' time by state (the records' parts off CPU are then
    /// meaningful, and the spans carry the split).
    time_by_state: bool,
}

impl std::fmt::Debug for Enricher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enricher")
            .field("resolve_paths", &self.resolve_paths)
            .finish_non_exhaustive()
    }
}

impl Enricher {
    pub(crate) fn new(labeler: SharedLabeler, resolve_paths: bool) -> Self {
        Self::with_proc_root(labeler, resolve_paths, WallClock::default(), "/proc".into())
    }

    pub(crate) fn with_proc_root(
        labeler: SharedLabeler,
        resolve_paths: bool,
        clock: WallClock,
        proc_root: PathBuf,
    ) -> Self {
        Self {
            labeler,
            control: LabelControl::default(),
            clock,
            resolve_paths,
            proc_root,
            time_by_state: false,
        }
    }

    /// Names the call's latency series as label control (`[labels]`) names it.
    pub(crate) fn with_label_control(mut self, control: LabelControl) -> Self {
        self.control = control;
        self
    }

    /// Spans carry each call's time split by state (`syscalls.time_by_state`).
    pub(crate) fn with_time_by_state(mut self, on: bool) -> Self {
        self.time_by_state = on;
        self
    }

    /// Captures the `/proc` context now and enriches (for callers with nothing to wait on).
    #[cfg(test)]
    pub(crate) fn enrich(&mut self, ev: &SlowCallEvent) -> Enriched {
        let ctx = ProcContext::capture(ev, &[], self.resolve_paths, &self.proc_root);
        self.enrich_with(ev, ctx)
    }

    /// Whether descriptor paths are resolved.
    pub(crate) fn resolve_paths(&self) -> bool {
        self.resolve_paths
    }

    pub(crate) fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Builds the slow call from the record and the context captured when it was read.
    pub(crate) fn enrich_with(&mut self, ev: &SlowCallEvent, ctx: ProcContext) -> Enriched {
        self.clock.maybe_refresh();
        let name = syscall_table::label(ev.nr);
        let spec = args::spec_of(&name);
        let mut attrs: Vec<(&'static str, AttrValue)> = Vec::with_capacity(20);

        let workload = {
            let mut labeler = self.labeler.lock().expect("labeler lock");
            // The collectors walk the cgroup hierarchy at most once per cycle and remember ids
            // a walk did not find. A slow call can be the first sight of a new cgroup, between
            // two cycles: opening a cycle first lets that lookup walk the hierarchy instead of
            // marking a live cgroup as missing for everyone. Known ids never walk.
            labeler.new_cycle();
            labeler.workload(ev.call.cgroup_id, ev.call.tgid)
        };

        attrs.push(("process.pid", i64::from(ev.call.tgid).into()));
        let thread_name = comm_from_bytes(&ev.comm);
        let leader = ev.call.tid == ev.call.tgid;
        attrs.push((
            "process.executable.name",
            AttrValue::from(
                executable_name(
                    ctx.exe.as_deref(),
                    leader.then_some(&*thread_name),
                    &workload.comm,
                    &thread_name,
                )
                .as_str(),
            ),
        ));
        attrs.push(("thread.id", i64::from(ev.call.tid).into()));
        attrs.push(("thread.name", AttrValue::from(thread_name)));
        if &*workload.cgroup.path != UNRESOLVED {
            // The semantic convention's form: the cgroup v2 line of /proc/<pid>/cgroup.
            let line = format!("0::{}", workload.cgroup.path);
            attrs.push(("process.linux.cgroup", AttrValue::from(line.as_str())));
        }
        for (label, value) in &workload.cgroup.extra {
            if let Some(key) = kubernetes::span_attribute(label) {
                attrs.push((key, AttrValue::from(value.clone())));
            }
        }
        attrs.push(("sysscope.syscall.nr", i64::from(ev.nr).into()));

        let failed = ev.ret < 0 && ev.ret >= -MAX_ERRNO;
        let arg = |i: usize| ev.args.get(i).copied().unwrap_or(0);
        if let Some(fd) = ctx.fd {
            attrs.push(("sysscope.syscall.fd", i64::from(fd).into()));
        }
        if let Some(path) = &ctx.fd_path {
            attrs.push(("file.path", AttrValue::from(path.as_str())));
        }
        if let Some(why) = ctx.fd_path_error {
            attrs.push(("sysscope.file.path_unavailable", AttrValue::from(why)));
        }
        if ev.file.status == file::OPEN {
            // What the descriptor was at the call's exit, as the kernel read it: two spans on
            // one file share these, whatever its name.
            attrs.push(("sysscope.file.inode", (ev.file.ino as i64).into()));
            let device = fd_class::device_name(ev.file.dev);
            attrs.push(("sysscope.file.device", AttrValue::from(device.as_str())));
        }
        // What the descriptor was at entry, as the kernel classified it (the series' labels).
        let mut fd_labels = Vec::with_capacity(2);
        crate::kernel::fd_class::push_labels(&ev.fd, &mut fd_labels);
        for (label, value) in &fd_labels {
            let key = if *label == "fs" {
                "sysscope.fd.fs"
            } else {
                "sysscope.fd.kind"
            };
            attrs.push((key, AttrValue::from(value.as_ref())));
        }
        if spec.ret_bytes && !failed && ev.ret >= 0 {
            attrs.push(("sysscope.syscall.bytes", ev.ret.into()));
        }
        if let Some(i) = spec.size {
            attrs.push((
                "sysscope.syscall.requested_bytes",
                (arg(i).min(i64::MAX as u64) as i64).into(),
            ));
        }
        if let Some(i) = spec.flags {
            attrs.push(("sysscope.syscall.flags", (arg(i) as u32 as i64).into()));
        }
        attrs.push(("sysscope.syscall.return_value", ev.ret.into()));
        if self.time_by_state {
            push_time_by_state(&mut attrs, ev);
        }
        let error = failed.then(|| syscall_table::errno_label((-ev.ret) as u16));
        if let Some(e) = &error {
            attrs.push(("error.type", AttrValue::from(e.as_ref())));
        }

        let mut series_labels: Vec<(&'static str, String)> = Vec::with_capacity(8);
        {
            let mut labels = Vec::with_capacity(8);
            let kept = self.control.workload(workload);
            kept.push_labels(&mut labels);
            series_labels.extend(labels.into_iter().map(|(k, v)| (k, v.into_owned())));
        }
        let series_nr = self.control.syscall(ev.nr);
        series_labels.push(("syscall", syscall_table::label(series_nr).into_owned()));
        if series_nr == ev.nr {
            series_labels.extend(fd_labels.into_iter().map(|(k, v)| (k, v.into_owned())));
        }

        let mut rng = rand::rng();
        let call = SlowCall {
            trace_id: nonzero(|| rng.random::<[u8; 16]>()),
            span_id: nonzero(|| rng.random::<[u8; 8]>()),
            name,
            start_unix_ns: self.clock.unix_ns(ev.call.start_ns),
            end_unix_ns: self.clock.unix_ns(ev.call.end_ns),
            duration_ns: ev.call.end_ns.saturating_sub(ev.call.start_ns),
            error,
            attributes: attrs,
        };
        Enriched {
            call,
            series_labels,
        }
    }
}

/// The call's time by state, in nanoseconds, as the probes stamped it: on CPU (the duration
/// less the rest), waiting for a CPU, blocked, and off CPU with no wakeup seen; they add up to
/// the span's duration.
fn push_time_by_state(attrs: &mut Vec<(&'static str, AttrValue)>, ev: &SlowCallEvent) {
    let duration = ev.call.end_ns.saturating_sub(ev.call.start_ns);
    let off = ev
        .wait_ns
        .saturating_add(ev.blocked_ns)
        .saturating_add(ev.unknown_ns);
    let ns = |v: u64| AttrValue::Int(v.min(i64::MAX as u64) as i64);
    attrs.push((
        "sysscope.syscall.on_cpu_ns",
        ns(duration.saturating_sub(off)),
    ));
    attrs.push(("sysscope.syscall.wait_cpu_ns", ns(ev.wait_ns)));
    attrs.push(("sysscope.syscall.blocked_ns", ns(ev.blocked_ns)));
    if ev.unknown_ns != 0 {
        attrs.push(("sysscope.syscall.unknown_ns", ns(ev.unknown_ns)));
    }
}

/// Why `/proc/<pid>/fd/<n>` could not be read, as a span attribute value.
fn path_error(e: &std::io::Error) -> &'static str {
    match e.kind() {
        // The process exited (or closed the descriptor) between the call and the read of its
        // record: a call right before exit.
        std::io::ErrorKind::NotFound => "gone",
        std::io::ErrorKind::PermissionDenied => "permission_denied",
        _ => "unreadable",
    }
}

/// Trace and span ids must not be all zeros (the invalid id).
fn nonzero<const N: usize>(mut gen: impl FnMut() -> [u8; N]) -> [u8; N] {
    loop {
        let id = gen();
        if id.iter().any(|b| *b != 0) {
            return id;
        }
    }
}

/// A slow call's `process.executable.name`, true at the moment of the call.
///
/// `call_comm` is the process's name as the kernel had it at the call (the record's comm,
/// when the calling thread is the process's main thread, whose name is the process's), `exe`
/// the base name of `/proc/<pid>/exe` read once the record arrived, `cached` the name last
/// read for the pid. The executable is named by `exe` where it is the program of the call
/// (the kernel names a process after its executable, cut to 15 bytes: `exe` gives the whole
/// name); by `call_comm` where it is not (the process exec'd another program since, or gave
/// itself another name) or `exe` could not be read (the process is gone, or another user's
/// without the capabilities of the `/proc` fallback): a shell that forked and exec'd a program
/// has that program's name on its first call, not the shell's the pid had before. Calls of
/// other threads (whose name is the thread's) fall back to `exe`, then `cached`, then `thread`
/// (the calling thread's name at the call).
fn executable_name(
    exe: Option<&str>,
    call_comm: Option<&str>,
    cached: &str,
    thread: &str,
) -> String {
    let call_comm = call_comm.filter(|c| *c != UNKNOWN_COMM);
    match (exe, call_comm) {
        (Some(exe), Some(comm)) => {
            let cut = &exe.as_bytes()[..exe.len().min(TASK_COMM_BYTES)];
            if cut == comm.as_bytes() {
                exe.to_string()
            } else {
                comm.to_string()
            }
        }
        (None, Some(comm)) => comm.to_string(),
        (Some(exe), None) => exe.to_string(),
        (None, None) if cached != UNKNOWN_COMM => cached.to_string(),
        (None, None) => thread.to_string(),
    }
}

/// The bytes of a task's name the kernel keeps (`TASK_COMM_LEN` less the NUL).
const TASK_COMM_BYTES: usize = 15;

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::metadata::Labeler;
    use sysscope_abi::CallStamp;

    fn enricher(resolve_paths: bool) -> Enricher {
        let labeler = Arc::new(Mutex::new(Labeler::new(
            "/nonexistent-cgroup-root".into(),
            false,
        )));
        Enricher::with_proc_root(
            labeler,
            resolve_paths,
            WallClock::fixed(1_000_000_000),
            "/proc".into(),
        )
    }

    fn event(nr: &str, args: [u64; 6], ret: i64) -> SlowCallEvent {
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"worker");
        SlowCallEvent {
            call: CallStamp {
                start_ns: 5_000,
                end_ns: 30_005_000,
                cgroup_id: 1,
                tgid: std::process::id(),
                tid: std::process::id(),
            },
            nr: syscall_table::number(nr).unwrap(),
            _pad: 0,
            fd: sysscope_abi::FdClass::NONE,
            ret,
            args,
            comm,
            file: FileIdentity::NONE,
            wait_ns: 0,
            blocked_ns: 0,
            unknown_ns: 0,
        }
    }

    #[test]
    fn the_executable_is_the_program_that_made_the_call() {
        // The main thread's call: its comm is the process's name at the call.
        let long = "sysscope-workload";
        assert_eq!(
            executable_name(Some(long), Some("sysscope-worklo"), "bash", "t"),
            long
        );
        // exe unreadable (gone, another user's): not the name the pid had before its exec.
        assert_eq!(
            executable_name(None, Some("python3"), "bash", "t"),
            "python3"
        );
        // The process exec'd again before the record was read.
        assert_eq!(
            executable_name(Some("sleep"), Some("python3"), "sh", "t"),
            "python3"
        );
        // Another thread's call (its comm is the thread's): as before.
        assert_eq!(
            executable_name(Some("python3.11"), None, "bash", "t"),
            "python3.11"
        );
        assert_eq!(executable_name(None, None, "bash", "t"), "bash");
        assert_eq!(executable_name(None, None, UNKNOWN_COMM, "t"), "t");
        assert_eq!(
            executable_name(None, Some(UNKNOWN_COMM), "bash", "t"),
            "bash",
            "a record without a comm"
        );
    }

    /// The exemplar's series is the one label control counts the call in: no `comm` when it
    /// is dropped, `syscall="other"` for a syscall not exported by name; the span keeps both.
    #[test]
    fn series_labels_follow_label_control() {
        let control = LabelControl::new(&crate::config::LabelsConfig {
            comm: false,
            syscalls: vec!["getppid".into()],
            ..Default::default()
        });
        let mut e = enricher(false).with_label_control(control);
        let out = e.enrich(&event("read", [0; 6], 1));
        assert!(out.series_labels.iter().all(|(k, _)| *k != "comm"));
        assert!(out
            .series_labels
            .contains(&("syscall", "other".to_string())));
        assert_eq!(out.call.name, "read");
        assert!(out.call.attribute("process.executable.name").is_some());
    }

    #[test]
    fn read_of_a_real_fd_gets_path_bytes_and_times() {
        let file = tempfile::NamedTempFile::new().unwrap();
        use std::os::fd::AsRawFd;
        let fd = file.as_file().as_raw_fd();
        let mut e = enricher(true);
        let out = e.enrich(&event("read", [fd as u64, 0, 4096, 0, 0, 0], 100));
        let c = &out.call;
        assert_eq!(c.name, "read");
        assert_eq!(c.duration_ns, 30_000_000);
        assert_eq!(c.start_unix_ns, 1_000_005_000);
        assert_eq!(c.end_unix_ns, 1_030_005_000);
        assert!(c.error.is_none());
        let path = file.path().canonicalize().unwrap();
        assert_eq!(
            c.attribute("file.path"),
            Some(&AttrValue::from(path.to_str().unwrap()))
        );
        assert_eq!(
            c.attribute("sysscope.syscall.fd"),
            Some(&AttrValue::Int(fd as i64))
        );
        assert_eq!(
            c.attribute("sysscope.syscall.bytes"),
            Some(&AttrValue::Int(100))
        );
        assert_eq!(
            c.attribute("sysscope.syscall.requested_bytes"),
            Some(&AttrValue::Int(4096))
        );
        assert_eq!(c.attribute("thread.name"), Some(&AttrValue::from("worker")));
        assert_eq!(
            c.attribute("process.pid"),
            Some(&AttrValue::Int(std::process::id() as i64))
        );
        assert!(out.series_labels.contains(&("syscall", "read".to_string())));
        // Unresolvable cgroup: no attribute rather than a placeholder.
        assert!(c.attribute("process.linux.cgroup").is_none());
    }

    #[test]
    fn failures_carry_error_type_and_no_bytes() {
        let mut e = enricher(false);
        let out = e.enrich(&event("read", [3, 0, 10, 0, 0, 0], -11));
        let c = &out.call;
        assert_eq!(c.error.as_deref(), Some("EAGAIN"));
        assert_eq!(c.attribute("error.type"), Some(&AttrValue::from("EAGAIN")));
        assert!(c.attribute("sysscope.syscall.bytes").is_none());
        assert!(c.attribute("file.path").is_none(), "paths are off");
        let span = c.to_span_data(&InstrumentationScope::builder("t").build());
        assert!(matches!(span.status, Status::Error { .. }));
        assert_eq!(span.name, "read");
        assert_eq!(
            span.span_context.trace_id(),
            TraceId::from_bytes(c.trace_id)
        );
    }

    #[test]
    fn openat_resolves_the_returned_descriptor() {
        let file = tempfile::NamedTempFile::new().unwrap();
        use std::os::fd::AsRawFd;
        let fd = file.as_file().as_raw_fd();
        let mut e = enricher(true);
        let at_fdcwd = (-100i64) as u64;
        let out = e.enrich(&event("openat", [at_fdcwd, 0, 0o2, 0, 0, 0], fd as i64));
        let c = &out.call;
        assert_eq!(
            c.attribute("sysscope.syscall.fd"),
            Some(&AttrValue::Int(fd as i64))
        );
        assert!(c.attribute("file.path").is_some());
        assert_eq!(
            c.attribute("sysscope.syscall.flags"),
            Some(&AttrValue::Int(2))
        );
    }

    /// A read of descriptor 7 by a process that no longer exists (pid `u32::MAX - 1`), with
    /// the file the kernel read.
    fn read_of_a_gone_process(file: FileIdentity) -> SlowCallEvent {
        let mut event = event("read", [7, 0, 1, 0, 0, 0], 1);
        event.call.tgid = u32::MAX - 1;
        event.call.tid = u32::MAX - 1;
        SlowCallEvent { file, ..event }
    }

    fn identity(magic: u32, kind: u8, ino: u64) -> FileIdentity {
        FileIdentity {
            ino,
            dev: (8 << 20) | 3,
            magic,
            fd: 7,
            status: file::OPEN,
            kind,
            ..FileIdentity::NONE
        }
    }

    fn named(ev: &SlowCallEvent, name: &[u8]) -> ProcContext {
        ProcContext::capture(ev, name, true, Path::new("/proc"))
    }

    #[test]
    fn the_kernel_names_pipes_sockets_and_anonymous_inodes_without_proc() {
        use sysscope_abi::fd_class::*;
        let pipe = read_of_a_gone_process(identity(PIPEFS_MAGIC, PIPE, 4242));
        assert_eq!(named(&pipe, &[]).fd_path.as_deref(), Some("pipe:[4242]"));
        let socket = read_of_a_gone_process(identity(SOCKFS_MAGIC, SOCKET, 77));
        assert_eq!(named(&socket, &[]).fd_path.as_deref(), Some("socket:[77]"));
        let mut anon = read_of_a_gone_process(identity(ANON_INODE_FS_MAGIC, ANON, 9));
        anon.file.name = file::NAME_DENTRY;
        assert_eq!(
            named(&anon, b"[eventfd]").fd_path.as_deref(),
            Some("anon_inode:[eventfd]")
        );
        // The identity goes into the span, whatever the name.
        let c = enricher(true).enrich_with(&pipe, named(&pipe, &[])).call;
        assert_eq!(
            c.attribute("file.path"),
            Some(&AttrValue::from("pipe:[4242]"))
        );
        assert_eq!(
            c.attribute("sysscope.file.inode"),
            Some(&AttrValue::Int(4242))
        );
        assert_eq!(
            c.attribute("sysscope.file.device"),
            Some(&AttrValue::from("8:3"))
        );
        assert!(c.attribute("sysscope.file.path_unavailable").is_none());
    }

    #[test]
    fn walked_paths_are_marked_deleted_or_truncated() {
        let mut ev = read_of_a_gone_process(identity(0xEF53, sysscope_abi::fd_class::FILE, 12));
        ev.file.name = file::NAME_PATH;
        assert_eq!(
            named(&ev, b"/data/train/part-7.parquet").fd_path.as_deref(),
            Some("/data/train/part-7.parquet")
        );
        ev.file.flags = file::DELETED;
        assert_eq!(
            named(&ev, b"/tmp/scratch").fd_path.as_deref(),
            Some("/tmp/scratch (deleted)")
        );
        // Truncated, and /proc cannot give the whole path (the process is gone): the
        // components nearest the file, marked.
        ev.file.flags = file::TRUNCATED;
        assert_eq!(
            named(&ev, b"/shard-0007/input.fifo").fd_path.as_deref(),
            Some(".../shard-0007/input.fifo")
        );
        // Named from /proc only: gone with the process, and said so.
        ev.file.name = file::NAME_NONE;
        ev.file.flags = 0;
        let ctx = named(&ev, &[]);
        assert_eq!((ctx.fd_path, ctx.fd_path_error), (None, Some("gone")));
        ev.file.status = file::NOT_OPEN;
        let ctx = named(&ev, &[]);
        assert_eq!((ctx.fd_path, ctx.fd_path_error), (None, Some("not_open")));
    }

    #[test]
    fn proc_names_a_descriptor_only_while_it_opens_the_file_the_kernel_saw() {
        use std::os::{fd::AsRawFd, unix::fs::MetadataExt};
        let f = tempfile::NamedTempFile::new().unwrap();
        let fd = f.as_file().as_raw_fd();
        let meta = f.as_file().metadata().unwrap();
        // What the kernel would have read: this file, but no name (a namespace file, say).
        let mut ev = event("read", [fd as u64, 0, 1, 0, 0, 0], 1);
        ev.file = FileIdentity {
            ino: meta.ino(),
            dev: fd_class::kernel_device(meta.dev()),
            magic: 0xEF53,
            fd,
            status: file::OPEN,
            ..FileIdentity::NONE
        };
        let path = f.path().canonicalize().unwrap();
        assert_eq!(named(&ev, &[]).fd_path.as_deref(), path.to_str());
        // The same number now opens another file: its path is not lent to the call.
        ev.file.ino += 1;
        let ctx = named(&ev, &[]);
        assert_eq!((ctx.fd_path, ctx.fd_path_error), (None, Some("reused")));
    }

    #[test]
    fn the_time_by_state_adds_up_to_the_duration() {
        let mut ev = event("read", [3, 0, 10, 0, 0, 0], 10);
        ev.wait_ns = 4_000_000;
        ev.blocked_ns = 25_000_000;
        let int = |c: &SlowCall, k: &str| match c.attribute(k) {
            Some(AttrValue::Int(i)) => Some(*i),
            _ => None,
        };
        // Off: none of the attributes, whatever the record holds.
        let c = enricher(false).enrich(&ev).call;
        assert_eq!(int(&c, "sysscope.syscall.on_cpu_ns"), None);
        let mut e = enricher(false).with_time_by_state(true);
        let c = e.enrich(&ev).call;
        assert_eq!(int(&c, "sysscope.syscall.on_cpu_ns"), Some(1_000_000));
        assert_eq!(int(&c, "sysscope.syscall.wait_cpu_ns"), Some(4_000_000));
        assert_eq!(int(&c, "sysscope.syscall.blocked_ns"), Some(25_000_000));
        // Unknown time only when there is some.
        assert_eq!(int(&c, "sysscope.syscall.unknown_ns"), None);
        ev.unknown_ns = 500;
        let c = e.enrich(&ev).call;
        assert_eq!(int(&c, "sysscope.syscall.unknown_ns"), Some(500));
        assert_eq!(int(&c, "sysscope.syscall.on_cpu_ns"), Some(999_500));
        let sum: i64 = [
            "sysscope.syscall.on_cpu_ns",
            "sysscope.syscall.wait_cpu_ns",
            "sysscope.syscall.blocked_ns",
            "sysscope.syscall.unknown_ns",
        ]
        .iter()
        .filter_map(|k| int(&c, k))
        .sum();
        assert_eq!(sum as u64, c.duration_ns);
    }

    #[test]
    fn json_has_ids_times_and_attributes() {
        let mut e = enricher(false);
        let c = e.enrich(&event("fsync", [1, 0, 0, 0, 0, 0], 0)).call;
        let j = c.to_json();
        assert_eq!(j["name"], "fsync");
        assert_eq!(j["trace_id"].as_str().unwrap().len(), 32);
        assert_eq!(j["span_id"].as_str().unwrap().len(), 16);
        assert_eq!(j["attributes"]["sysscope.syscall.fd"], 1);
        assert_eq!(j["start_time"], "1970-01-01T00:00:01.000005000Z");
        assert!((j["duration_seconds"].as_f64().unwrap() - 0.03).abs() < 1e-12);
    }
}
