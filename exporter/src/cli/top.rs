//! `sysscope top`: a live view of the busiest cgroups (or processes, process names, pods,
//! containers) by syscall time over the last interval, with their top syscalls; `--pod`
//! narrows it to one pod of the node (or one container, `--container`).
//!
//! It loads the syscall probes itself and reads `SYSCALL_STATS`/`SYSCALL_ERRORS` each interval
//! through the same reader as `summary` (exited processes reclaimed), or, with `--from URL`,
//! reads a running exporter's `/metrics` (`sysscope_syscall_duration_seconds_sum`,
//! `sysscope_syscalls_total`, `sysscope_syscall_errors_total`) and needs no privileges: over
//! HTTP or HTTPS (reqwest; `--from-ca-file` or the system's roots) with basic auth when the
//! exporter's web config asks for it (`--from-user`, the password from `SYSSCOPE_FROM_PASSWORD`
//! or `--from-password-file`, never from the command line).
//! Pods and containers are named by the cgroup path's ids and, when the Kubernetes API is
//! reachable, by a watch of this node's pods (`metadata::kubernetes`), as the exporter names
//! them; with `--from`, by the exporter's `namespace`/`pod`/`container` (or `pod_uid`/
//! `container_id`) labels.
//! On a terminal it redraws in place (ANSI) and quits on `q` or Ctrl-C; otherwise it prints
//! one frame per interval.

use std::{
    collections::{HashMap, HashSet},
    io::{Read, Write},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    is_tty, parse_duration,
    pod::{self, PodRef},
    profile::ProfileReader,
    progress::thousands,
    render::units::secs,
    session::descendant_ids,
    signals, CliError,
};
use crate::{
    config::Config,
    kernel::{self, LoadOptions, Probes},
    metadata::{
        cgroups,
        kubernetes::{
            watch::{ClientSource, Watch},
            KubernetesLabels, PodStore, CONTAINER, CONTAINER_ID, NAMESPACE, POD, POD_UID,
        },
        Labeler,
    },
    openmetrics, syscall_table,
};

const EXAMPLES: &str = "\
Examples:
  sysscope top                         # busiest cgroups, refreshed every second
  sysscope top --by process -n 20      # busiest processes
  sysscope top --by pod                # busiest pods of this node
  sysscope top --pod ml/trainer-0 --by container   # one pod, by container
  sysscope top --count 3 > frames.txt  # three frames, no terminal needed
  sysscope top --from http://127.0.0.1:9812/metrics   # from a running exporter, no root
  SYSSCOPE_FROM_PASSWORD=... sysscope top --from https://node-1:9812/metrics \\
      --from-ca-file ca.pem --from-user prometheus   # an exporter with TLS and basic auth

Columns: syscall time spent in the interval (summed over threads, so it can exceed the
interval), that time as a share of the interval, calls and errors per second, and the
syscalls taking the most time. Press q or Ctrl-C to quit.";

/// What a row stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum GroupBy {
    /// One row per cgroup.
    #[default]
    Cgroup,
    /// One row per process (pid; by name with --from, where pids are not exported by default).
    Process,
    /// One row per process name, all its processes summed.
    Comm,
    /// One row per pod (namespace/name when known, else its UID); one row for everything
    /// outside pods.
    Pod,
    /// One row per container of a pod.
    Container,
}

impl GroupBy {
    fn name(self) -> &'static str {
        match self {
            Self::Cgroup => "cgroup",
            Self::Process => "process",
            Self::Comm => "comm",
            Self::Pod => "pod",
            Self::Container => "container",
        }
    }

    fn needs_pods(self) -> bool {
        matches!(self, Self::Pod | Self::Container)
    }
}

/// The row of usage outside any pod, with `--by pod` or `--by container`.
const NOT_IN_A_POD: &str = "(not in a pod)";

/// The row label of a pod or container from its labels (the exporter's, or what the
/// labeler derived): names when known, else ids, else [`NOT_IN_A_POD`].
fn pod_row<'a>(by: GroupBy, label: impl Fn(&str) -> Option<&'a str>) -> String {
    let pod = match (label(NAMESPACE), label(POD), label(POD_UID)) {
        (Some(ns), Some(pod), _) => format!("{ns}/{pod}"),
        (_, _, Some(uid)) => format!("pod {uid}"),
        _ => return NOT_IN_A_POD.to_string(),
    };
    if by == GroupBy::Pod {
        return pod;
    }
    match (label(CONTAINER), label(CONTAINER_ID)) {
        (Some(c), _) if label(NAMESPACE).is_some() => format!("{pod}/{c}"),
        (_, Some(id)) => format!("{pod}/{}", &id[..id.len().min(12)]),
        // The pod's own cgroup: the sandbox, and processes of no container.
        _ => format!("{pod} (pod cgroup)"),
    }
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct TopArgs {
    /// Refresh interval.
    #[arg(short = 'i', long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    pub interval: Duration,

    /// What a row is: a cgroup, a process, a process name, a pod or a container.
    #[arg(long, value_enum, default_value_t = GroupBy::Cgroup)]
    pub by: GroupBy,

    /// Only this pod of the node: NAMESPACE/NAME or its UID (with --from: the exporter's
    /// namespace and pod labels, or pod_uid).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub pod: Option<String>,

    /// With --pod: only this container.
    #[arg(long, value_name = "NAME", requires = "pod")]
    pub container: Option<String>,

    /// Rows to show.
    #[arg(short = 'n', long, value_name = "N", default_value_t = 15)]
    pub limit: usize,

    /// Stop after this many frames (0: until q or Ctrl-C).
    #[arg(short = 'c', long, value_name = "N", default_value_t = 0)]
    pub count: u64,

    /// Read a running sysscope exporter's metrics (http://host:port/metrics or https://...)
    /// instead of loading probes.
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,

    /// With --from https://...: trust the CA certificates in this PEM file (instead of the
    /// system's roots).
    #[arg(long, value_name = "FILE", requires = "from")]
    pub from_ca_file: Option<PathBuf>,

    /// With --from: the basic-auth user; the password comes from the SYSSCOPE_FROM_PASSWORD
    /// environment variable or --from-password-file.
    #[arg(long, value_name = "USER", requires = "from")]
    pub from_user: Option<String>,

    /// With --from-user: read the password from this file (its first line).
    #[arg(long, value_name = "FILE", requires = "from_user")]
    pub from_password_file: Option<PathBuf>,
}

/// The environment variable `--from-user`'s password is read from.
const PASSWORD_VARIABLE: &str = "SYSSCOPE_FROM_PASSWORD";

/// Usage of one syscall by one group over an interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Usage {
    pub calls: u64,
    pub errors: u64,
    pub(crate) time_ns: u64,
}

/// A group (cgroup or process) and its usage per syscall name.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GroupUsage {
    /// Row label: the cgroup path, or "pid comm".
    pub label: String,
    /// Secondary column: the process's cgroup when grouping by process.
    pub(crate) detail: String,
    pub syscalls: HashMap<String, Usage>,
}

impl GroupUsage {
    pub(crate) fn total(&self) -> Usage {
        self.syscalls.values().fold(Usage::default(), |a, u| Usage {
            calls: a.calls + u.calls,
            errors: a.errors + u.errors,
            time_ns: a.time_ns + u.time_ns,
        })
    }
}

/// Where frames come from.
trait Source {
    /// Usage since the previous call.
    fn sample(&mut self) -> Result<Vec<GroupUsage>, CliError>;
}

/// The probes, loaded by `top` itself.
struct ProbeSource {
    reader: ProfileReader,
    labeler: Labeler,
    by: GroupBy,
    /// `--pod`: the cgroup directory and the ids of it and its descendants.
    only: Option<(PathBuf, HashSet<u64>)>,
    _pod_watch: Option<Watch>,
    _probes: Probes,
}

impl ProbeSource {
    fn start(args: &TopArgs, config: &Config) -> Result<Self, CliError> {
        kernel::preflight()?;
        let root = cgroups::v2_mount()?;
        let only = match &args.pod {
            Some(p) => {
                let target = pod::resolve(p, args.container.as_deref(), &root, &config.kubernetes)?;
                let ids = descendant_ids(&target.dir);
                Some((target.dir, ids))
            }
            None => None,
        };
        let mut labeler = Labeler::new(root, false);
        let mut pod_watch = None;
        if args.by.needs_pods() {
            let store = Arc::new(PodStore::new(config.kubernetes.max_pods));
            pod_watch = names_of_this_nodes_pods(config, store.clone());
            let names = pod_watch.as_ref().map(|_| store);
            labeler = labeler.with_metadata(Box::new(KubernetesLabels::new(true, names)));
        }
        let mut probes = Probes::load(
            &super::measure::tool_config(config),
            &LoadOptions::default(),
        )?;
        let reader = ProfileReader::attach(&mut probes, "top")?;
        Ok(Self {
            reader,
            labeler,
            by: args.by,
            only,
            _pod_watch: pod_watch,
            _probes: probes,
        })
    }
}

/// A watch of this node's pods for their names, as the exporter runs it, unless the
/// configuration turns it off or no API credentials are found (rows then show pod UIDs).
fn names_of_this_nodes_pods(config: &Config, store: Arc<PodStore>) -> Option<Watch> {
    if config.kubernetes.pod_watch == "off" {
        return None;
    }
    let node = pod::this_node(&config.kubernetes)?;
    Watch::start(
        ClientSource::Infer,
        node,
        store,
        kube::runtime::watcher::DefaultBackoff::default(),
    )
    .map_err(|e| {
        tracing::debug!(error = %crate::util::error::Chain(&e), "no pod names: rows show pod UIDs");
    })
    .ok()
}

impl Source for ProbeSource {
    fn sample(&mut self) -> Result<Vec<GroupUsage>, CliError> {
        if let Some((dir, ids)) = &mut self.only {
            // Containers started since the last frame.
            ids.extend(descendant_ids(dir));
        }
        let only = self.only.as_ref().map(|(_, ids)| ids);
        let d = self
            .reader
            .poll(|cgroup, _| only.is_none_or(|ids| ids.contains(&cgroup)));
        self.labeler.new_cycle();
        for (tgid, comm) in &d.exited {
            self.labeler.comms.set_exited(*tgid, comm);
        }
        let mut groups: HashMap<String, GroupUsage> = HashMap::new();
        let key_of = |labeler: &mut Labeler, cgroup_id: u64, tgid: u32| {
            let labels = labeler.cgroup(cgroup_id);
            let cg = labels.path.to_string();
            match self.by {
                GroupBy::Cgroup => (cg.clone(), cg, String::new()),
                GroupBy::Process => {
                    let comm = labeler.comms.resolve(tgid);
                    (format!("{tgid}"), format!("{tgid} {comm}"), cg)
                }
                GroupBy::Comm => {
                    let comm = labeler.comms.resolve(tgid).to_string();
                    (comm.clone(), comm, String::new())
                }
                GroupBy::Pod | GroupBy::Container => {
                    let row = pod_row(self.by, |k| {
                        labels
                            .extra
                            .iter()
                            .find(|(name, _)| *name == k)
                            .map(|(_, v)| &**v)
                    });
                    (row.clone(), row, String::new())
                }
            }
        };
        for (key, s) in &d.stats {
            let (k, label, detail) = key_of(&mut self.labeler, key.cgroup_id, key.tgid);
            let g = groups.entry(k).or_insert_with(|| GroupUsage {
                label,
                detail,
                ..GroupUsage::default()
            });
            let u = g
                .syscalls
                .entry(syscall_table::label(key.nr).into_owned())
                .or_default();
            u.calls += s.count();
            u.time_ns += s.sum_ns;
        }
        for (key, n) in &d.errors {
            let (k, label, detail) = key_of(&mut self.labeler, key.cgroup_id, key.tgid);
            let g = groups.entry(k).or_insert_with(|| GroupUsage {
                label,
                detail,
                ..GroupUsage::default()
            });
            g.syscalls
                .entry(syscall_table::label(key.nr as u32).into_owned())
                .or_default()
                .errors += n;
        }
        for (tgid, _) in &d.exited {
            self.labeler.comms.forget(*tgid);
        }
        Ok(groups.into_values().collect())
    }
}

/// A running exporter's /metrics.
struct MetricsSource {
    client: reqwest::blocking::Client,
    url: String,
    credentials: Option<(String, String)>,
    by: GroupBy,
    only: Option<PodFilter>,
    last: Option<HashMap<(String, String, String), Usage>>,
}

/// `--pod` (and `--container`) with `--from`: which series are the pod's, by their labels.
#[derive(Debug, Clone)]
struct PodFilter {
    pod: PodRef,
    container: Option<String>,
}

impl PodFilter {
    fn keeps(&self, label: impl Fn(&str) -> Option<String>) -> bool {
        let pod = match &self.pod {
            PodRef::Named { namespace, name } => {
                label(NAMESPACE).as_deref() == Some(namespace)
                    && label(POD).as_deref() == Some(name)
            }
            PodRef::Uid(uid) => label(POD_UID).as_deref() == Some(uid),
        };
        pod && self
            .container
            .as_ref()
            .is_none_or(|c| label(CONTAINER).as_deref() == Some(c))
    }
}

impl MetricsSource {
    fn new(args: &TopArgs, url: &str) -> Result<Self, CliError> {
        let fail = |message: String| CliError::Fetch {
            what: format!("GET {url}"),
            message,
        };
        // A URL without a path reads the exporter's default telemetry path.
        let url = match url.split_once("://") {
            Some((_, rest)) if !rest.contains('/') => format!("{url}/metrics"),
            _ => url.to_string(),
        };
        let mut builder = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10));
        // The system's roots (reqwest's platform verifier), unless the CA file replaces them.
        if let Some(path) = &args.from_ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| CliError::io(format!("reading {}", path.display()), e))?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| fail(format!("--from-ca-file {}: {e}", path.display())))?;
            builder = builder.tls_certs_only(roots);
        }
        let client = builder.build().map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            client,
            url,
            credentials: credentials(args)?,
            by: args.by,
            only: match &args.pod {
                Some(p) => Some(PodFilter {
                    pod: PodRef::parse(p)?,
                    container: args.container.clone(),
                }),
                None => None,
            },
            last: None,
        })
    }

    /// The exposition, as Prometheus text.
    fn fetch(&self) -> Result<String, CliError> {
        let fail = |message: String| CliError::Fetch {
            what: format!("GET {}", self.url),
            message,
        };
        let mut request = self
            .client
            .get(&self.url)
            .header(reqwest::header::ACCEPT, "text/plain; version=0.0.4");
        if let Some((user, password)) = &self.credentials {
            request = request.basic_auth(user, Some(password));
        }
        let response = request
            .send()
            .map_err(|e| fail(crate::util::error::Chain(&e).to_string()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(fail(format!("HTTP status {}", status.as_u16())));
        }
        response.text().map_err(|e| fail(e.to_string()))
    }
}

/// The basic-auth user and password of `--from-user`: the password from
/// `SYSSCOPE_FROM_PASSWORD` or `--from-password-file` (its first line), never from the
/// command line, where every user of the machine could read it.
fn credentials(args: &TopArgs) -> Result<Option<(String, String)>, CliError> {
    let Some(user) = &args.from_user else {
        return Ok(None);
    };
    let password = match &args.from_password_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| CliError::io(format!("reading {}", path.display()), e))?
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
        None => std::env::var(PASSWORD_VARIABLE).map_err(|_| {
            CliError::Usage(format!(
                "--from-user {user} needs a password: set {PASSWORD_VARIABLE} or \
                 --from-password-file"
            ))
        })?,
    };
    Ok(Some((user.clone(), password)))
}

/// Cumulative usage per (group key, detail, syscall) from an exposition, of the series
/// `only` keeps.
fn cumulative(
    text: &str,
    by: GroupBy,
    only: Option<&PodFilter>,
) -> HashMap<(String, String, String), Usage> {
    let mut out: HashMap<(String, String, String), Usage> = HashMap::new();
    for sample in openmetrics::sample_lines(text).filter_map(|(_, s)| s) {
        if only.is_some_and(|f| !f.keeps(|k| sample.label(k).map(|v| v.to_string()))) {
            continue;
        }
        let get = |k: &str| sample.label(k).unwrap_or_default().to_string();
        let (group, detail) = match by {
            GroupBy::Cgroup => (get("cgroup"), String::new()),
            GroupBy::Process => match sample.label("pid") {
                Some(pid) => (format!("{pid} {}", get("comm")), get("cgroup")),
                None => (get("comm"), get("cgroup")),
            },
            GroupBy::Comm => (get("comm"), String::new()),
            GroupBy::Pod | GroupBy::Container => {
                let labels: Vec<(String, String)> =
                    [NAMESPACE, POD, CONTAINER, POD_UID, CONTAINER_ID]
                        .iter()
                        .filter_map(|k| Some((k.to_string(), sample.label(k)?.to_string())))
                        .collect();
                let row = pod_row(by, |k| {
                    labels
                        .iter()
                        .find(|(name, _)| name == k)
                        .map(|(_, v)| v.as_str())
                });
                (row, String::new())
            }
        };
        let key = (group, detail, get("syscall"));
        let value = sample.value;
        match sample.name.as_str() {
            "sysscope_syscalls_total" => out.entry(key).or_default().calls += value as u64,
            "sysscope_syscall_errors_total" => out.entry(key).or_default().errors += value as u64,
            "sysscope_syscall_duration_seconds_sum" => {
                out.entry(key).or_default().time_ns += (value * 1e9) as u64
            }
            _ => {}
        }
    }
    out
}

/// What changed between two cumulative readings, grouped.
fn usage_delta(
    prev: &HashMap<(String, String, String), Usage>,
    cur: &HashMap<(String, String, String), Usage>,
) -> Vec<GroupUsage> {
    let mut groups: HashMap<(String, String), GroupUsage> = HashMap::new();
    for (key, u) in cur {
        let p = prev.get(key).cloned().unwrap_or_default();
        let d = Usage {
            calls: u.calls.saturating_sub(p.calls),
            errors: u.errors.saturating_sub(p.errors),
            time_ns: u.time_ns.saturating_sub(p.time_ns),
        };
        if d == Usage::default() {
            continue;
        }
        let g = groups
            .entry((key.0.clone(), key.1.clone()))
            .or_insert_with(|| GroupUsage {
                label: key.0.clone(),
                detail: key.1.clone(),
                ..GroupUsage::default()
            });
        g.syscalls.insert(key.2.clone(), d);
    }
    groups.into_values().collect()
}

impl Source for MetricsSource {
    fn sample(&mut self) -> Result<Vec<GroupUsage>, CliError> {
        let text = self.fetch()?;
        let cur = cumulative(&text, self.by, self.only.as_ref());
        let out = match &self.last {
            Some(prev) => usage_delta(prev, &cur),
            None => Vec::new(),
        };
        self.last = Some(cur);
        Ok(out)
    }
}

/// Terminal width, 120 when unknown.
fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize; failure leaves it zeroed.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: fd 1 and a valid winsize to fill; on failure nothing is read from it.
    let ok = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col > 0 {
        ws.ws_col as usize
    } else {
        120
    }
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// One frame of text: a header and the busiest groups.
pub(crate) fn render_frame(
    groups: &[GroupUsage],
    interval: Duration,
    by: GroupBy,
    limit: usize,
    width: usize,
    note: &str,
) -> String {
    let secs_f = interval.as_secs_f64().max(1e-9);
    let mut sorted: Vec<(&GroupUsage, Usage)> = groups.iter().map(|g| (g, g.total())).collect();
    sorted.sort_by(|a, b| {
        b.1.time_ns
            .cmp(&a.1.time_ns)
            .then_with(|| b.1.calls.cmp(&a.1.calls))
            .then_with(|| a.0.label.cmp(&b.0.label))
    });
    let all: Usage = sorted.iter().fold(Usage::default(), |a, (_, u)| Usage {
        calls: a.calls + u.calls,
        errors: a.errors + u.errors,
        time_ns: a.time_ns + u.time_ns,
    });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut out = String::new();
    out.push_str(&truncate(
        &format!(
            "sysscope top - {:02}:{:02}:{:02} UTC - every {} - by {} - {} syscalls/s, {} in syscalls{}",
            now / 3600 % 24,
            now / 60 % 60,
            now % 60,
            secs(interval.as_nanos() as f64),
            by.name(),
            thousands((all.calls as f64 / secs_f) as u64),
            secs(all.time_ns as f64),
            note
        ),
        width,
    ));
    out.push('\n');
    let (label_head, detail_head) = match by {
        GroupBy::Cgroup => ("CGROUP", ""),
        GroupBy::Process => ("PROCESS", "CGROUP"),
        GroupBy::Comm => ("COMM", ""),
        GroupBy::Pod => ("POD", ""),
        GroupBy::Container => ("CONTAINER", ""),
    };
    // Columns as wide as the longest label shown (cgroup paths can be long), within limits.
    let shown = sorted.iter().take(limit);
    let label_w = shown
        .clone()
        .map(|(g, _)| g.label.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(label_head.len(), 64);
    let detail_w = if by == GroupBy::Process {
        shown
            .map(|(g, _)| g.detail.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(detail_head.len(), 48)
    } else {
        0
    };
    let mut header = format!(
        "{:>12} {:>7} {:>10} {:>8}  {:<label_w$}",
        "SYSCALL-TIME", "%TIME", "CALLS/S", "ERRS/S", label_head
    );
    if detail_w > 0 {
        header.push_str(&format!(" {detail_head:<detail_w$}"));
    }
    header.push_str(" TOP SYSCALLS");
    out.push_str(&truncate(&header, width));
    out.push('\n');
    if sorted.is_empty() {
        out.push_str("(no syscalls in this interval)\n");
    }
    for (g, total) in sorted.iter().take(limit) {
        let mut top: Vec<(&String, &Usage)> = g.syscalls.iter().collect();
        top.sort_by(|a, b| b.1.time_ns.cmp(&a.1.time_ns).then_with(|| a.0.cmp(b.0)));
        let tops = top
            .iter()
            .take(3)
            .map(|(name, u)| {
                let share = if total.time_ns > 0 {
                    u.time_ns as f64 * 100.0 / total.time_ns as f64
                } else {
                    0.0
                };
                format!("{name} {share:.0}%")
            })
            .collect::<Vec<_>>()
            .join(", ");
        let mut line = format!(
            "{:>12} {:>6.1}% {:>10} {:>8}  {:<label_w$}",
            secs(total.time_ns as f64),
            total.time_ns as f64 * 100.0 / (secs_f * 1e9),
            thousands((total.calls as f64 / secs_f).round() as u64),
            thousands((total.errors as f64 / secs_f).round() as u64),
            truncate(&g.label, label_w),
        );
        if detail_w > 0 {
            line.push_str(&format!(" {:<detail_w$}", truncate(&g.detail, detail_w)));
        }
        line.push(' ');
        line.push_str(&tops);
        out.push_str(&truncate(&line, width));
        out.push('\n');
    }
    out
}

/// Puts a terminal's stdin in non-canonical, no-echo mode; restores it on drop.
struct RawStdin {
    saved: libc::termios,
}

impl RawStdin {
    fn enable() -> Option<Self> {
        if !is_tty(0) {
            return None;
        }
        // SAFETY: tcgetattr/tcsetattr on stdin with a termios we own.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return None;
            }
            let saved = t;
            // ISIG stays on: Ctrl-C still raises SIGINT, which the loop handles.
            t.c_lflag &= !(libc::ICANON | libc::ECHO);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            libc::tcsetattr(0, libc::TCSANOW, &t);
            Some(Self { saved })
        }
    }
}

impl Drop for RawStdin {
    fn drop(&mut self) {
        // SAFETY: restoring the settings read in enable().
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &self.saved) };
    }
}

/// Waits `d`, returning early (true) when the user asked to quit.
fn wait_or_quit(d: Duration, keys: bool, signals_at_start: usize) -> bool {
    let until = Instant::now() + d;
    loop {
        if signals::count() > signals_at_start {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let step = left.min(Duration::from_millis(100));
        if keys {
            let mut fds = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd on stdin.
            let r = unsafe { libc::poll(&mut fds, 1, step.as_millis() as i32) };
            if r > 0 {
                let mut buf = [0u8; 16];
                let n = std::io::stdin().read(&mut buf).unwrap_or(0);
                if buf[..n].iter().any(|b| matches!(b, b'q' | b'Q' | 3)) {
                    return true;
                }
            }
        } else {
            std::thread::sleep(step);
        }
    }
}

pub fn run(args: &TopArgs, config: &Config) -> Result<u8, CliError> {
    if args.interval < Duration::from_millis(100) {
        return Err(CliError::Usage("--interval must be at least 100ms".into()));
    }
    let mut source: Box<dyn Source> = match &args.from {
        Some(url) => {
            let mut s = MetricsSource::new(args, url)?;
            // The first reading is the baseline (and checks the URL now).
            s.sample()?;
            Box::new(s)
        }
        None => Box::new(ProbeSource::start(args, config)?),
    };
    signals::install();
    let signals_at_start = signals::count();
    let interactive = is_tty(1);
    let raw = if interactive {
        RawStdin::enable()
    } else {
        None
    };
    let keys = raw.is_some();
    let mut stdout = std::io::stdout();
    if interactive {
        // Alternate screen, hidden cursor.
        let _ = write!(stdout, "\x1b[?1049h\x1b[?25l");
    }
    let note = if keys { " - q to quit" } else { "" };
    let mut frames = 0u64;
    let mut last = Instant::now();
    let result = loop {
        if wait_or_quit(args.interval, keys, signals_at_start) {
            break Ok(0);
        }
        let groups = match source.sample() {
            Ok(g) => g,
            Err(e) => break Err(e),
        };
        let elapsed = last.elapsed();
        last = Instant::now();
        let width = if interactive { terminal_width() } else { 200 };
        let frame = render_frame(&groups, elapsed, args.by, args.limit, width, note);
        let written = if interactive {
            write!(stdout, "\x1b[H\x1b[2J{frame}")
        } else {
            writeln!(stdout, "{frame}")
        };
        if written.and_then(|_| stdout.flush()).is_err() {
            // stdout closed (e.g. piped into head): a normal way to stop.
            break Ok(0);
        }
        frames += 1;
        if args.count > 0 && frames >= args.count {
            break Ok(0);
        }
    };
    if interactive {
        let _ = write!(stdout, "\x1b[?25h\x1b[?1049l");
        let _ = stdout.flush();
    }
    drop(raw);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(label: &str, rows: &[(&str, u64, u64, u64)]) -> GroupUsage {
        GroupUsage {
            label: label.into(),
            detail: String::new(),
            syscalls: rows
                .iter()
                .map(|(n, c, e, t)| {
                    (
                        n.to_string(),
                        Usage {
                            calls: *c,
                            errors: *e,
                            time_ns: *t,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn frames_sort_by_time_and_show_top_syscalls() {
        let groups = vec![
            group("/small", &[("read", 10, 0, 1_000)]),
            group(
                "/big",
                &[("futex", 5, 0, 600_000_000), ("read", 100, 2, 200_000_000)],
            ),
        ];
        let f = render_frame(
            &groups,
            Duration::from_secs(1),
            GroupBy::Cgroup,
            10,
            200,
            "",
        );
        let lines: Vec<&str> = f.lines().collect();
        assert!(lines[1].contains("SYSCALL-TIME") && lines[1].contains("CGROUP"));
        assert!(lines[2].contains("/big"), "{f}");
        assert!(lines[2].contains("80.0%"), "{f}");
        assert!(lines[2].contains("futex 75%, read 25%"), "{f}");
        assert!(lines[3].contains("/small"));
        let f = render_frame(&groups, Duration::from_secs(1), GroupBy::Cgroup, 1, 200, "");
        assert!(!f.contains("/small"));
    }

    #[test]
    fn exposition_deltas() {
        let a = "# HELP x\nsysscope_syscalls_total{cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 10\n\
                 sysscope_syscall_duration_seconds_sum{cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 0.5\n";
        let b = "sysscope_syscalls_total{cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 25\n\
                 sysscope_syscall_duration_seconds_sum{cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 0.75\n\
                 sysscope_syscall_errors_total{cgroup=\"/a\",comm=\"x\",syscall=\"read\",errno=\"EAGAIN\"} 3\n";
        let pa = cumulative(a, GroupBy::Cgroup, None);
        let pb = cumulative(b, GroupBy::Cgroup, None);
        let d = usage_delta(&pa, &pb);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].label, "/a");
        assert_eq!(
            d[0].syscalls["read"],
            Usage {
                calls: 15,
                errors: 3,
                time_ns: 250_000_000
            }
        );
        let by_proc = cumulative(b, GroupBy::Process, None);
        assert!(by_proc.keys().any(|k| k.0 == "x" && k.1 == "/a"));
    }

    #[test]
    fn label_escapes() {
        let text = "sysscope_syscalls_total{cgroup=\"/x\\\"y\",comm=\"1\\n2\",syscall=\"read\"} 4 1700000000\n";
        let by_proc = cumulative(text, GroupBy::Process, None);
        assert_eq!(
            by_proc[&("1\n2".into(), "/x\"y".into(), "read".into())].calls,
            4
        );
    }

    #[test]
    fn rows_by_pod_container_and_comm_from_an_exposition() {
        let text = "\
sysscope_syscalls_total{cgroup=\"/k/a\",namespace=\"ml\",pod=\"t-0\",container=\"torch\",pod_uid=\"u1\",container_id=\"c1c1c1c1c1c1c1c1\",comm=\"python3\",syscall=\"read\"} 5
sysscope_syscalls_total{cgroup=\"/k/b\",namespace=\"ml\",pod=\"t-0\",container=\"side\",pod_uid=\"u1\",container_id=\"c2\",comm=\"envoy\",syscall=\"read\"} 7
sysscope_syscalls_total{cgroup=\"/k\",namespace=\"ml\",pod=\"t-0\",pod_uid=\"u1\",comm=\"pause\",syscall=\"read\"} 1
sysscope_syscalls_total{cgroup=\"/k2/x\",pod_uid=\"u2\",container_id=\"d4d4d4d4d4d4d4d4d4\",comm=\"python3\",syscall=\"read\"} 11
sysscope_syscalls_total{cgroup=\"/system.slice/cron.service\",comm=\"cron\",syscall=\"read\"} 13
";
        let calls = |by, only: Option<&PodFilter>| {
            let mut rows: Vec<(String, u64)> = cumulative(text, by, only)
                .into_iter()
                .map(|(k, u)| (k.0, u.calls))
                .collect();
            rows.sort();
            rows
        };
        let own = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        // Pods: the pod cgroup's and every container's calls under one row.
        let mut pods: HashMap<String, u64> = HashMap::new();
        for (k, n) in calls(GroupBy::Pod, None) {
            *pods.entry(k).or_default() += n;
        }
        assert_eq!(pods["ml/t-0"], 13);
        assert_eq!(pods["pod u2"], 11);
        assert_eq!(pods[NOT_IN_A_POD], 13);
        assert_eq!(
            calls(GroupBy::Container, None),
            own(&[
                (NOT_IN_A_POD, 13),
                ("ml/t-0 (pod cgroup)", 1),
                ("ml/t-0/side", 7),
                ("ml/t-0/torch", 5),
                ("pod u2/d4d4d4d4d4d4", 11),
            ])
        );
        let mut comms: Vec<(String, u64)> = Vec::new();
        for (k, n) in calls(GroupBy::Comm, None) {
            match comms.iter_mut().find(|(c, _)| *c == k) {
                Some((_, m)) => *m += n,
                None => comms.push((k, n)),
            }
        }
        comms.sort();
        assert_eq!(
            comms,
            own(&[("cron", 13), ("envoy", 7), ("pause", 1), ("python3", 16)])
        );
        // --pod: by names, by UID, with a container.
        let named = PodFilter {
            pod: PodRef::parse("ml/t-0").unwrap(),
            container: None,
        };
        assert_eq!(
            calls(GroupBy::Container, Some(&named)).len(),
            3,
            "the pod's rows only"
        );
        let torch = PodFilter {
            container: Some("torch".into()),
            ..named
        };
        assert_eq!(calls(GroupBy::Cgroup, Some(&torch)), own(&[("/k/a", 5)]));
        let uid = "0d1e5f3a-8b2c-4d6e-9f10-1a2b3c4d5e6f";
        let by_uid = PodFilter {
            pod: PodRef::parse(uid).unwrap(),
            container: None,
        };
        assert!(calls(GroupBy::Cgroup, Some(&by_uid)).is_empty());
        let f = render_frame(&[], Duration::from_secs(1), GroupBy::Pod, 5, 200, "");
        assert!(f.contains("by pod") && f.contains("POD"), "{f}");
    }
}
