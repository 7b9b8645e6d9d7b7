//! The TOML configuration file (`--config.file`): parsed with serde, validated once at load.
//!
//! Every section rejects unknown keys, and every error names the key and the problem, so a
//! typo never silently falls back to a default. `sysscope --print-default-config` shows the
//! whole file with its defaults.

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{syscall_table, util::duration as humantime_serde_compat};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config file {path}: key `{key}`: {problem}")]
    Invalid {
        path: String,
        key: String,
        problem: String,
    },
}

/// The whole configuration. Missing sections and keys take their defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub collection: CollectionConfig,
    pub(crate) labels: LabelsConfig,
    pub(crate) limits: LimitsConfig,
    pub(crate) syscalls: SyscallsConfig,
    pub(crate) block_io: BlockIoConfig,
    pub(crate) cpu: CpuConfig,
    pub(crate) gpu: GpuConfig,
    pub(crate) slow_calls: SlowCallsConfig,
    pub kubernetes: KubernetesConfig,
    pub(crate) exposition: ExpositionConfig,
    /// OTLP export (spans and metrics push); `OTEL_*` environment variables win when set.
    pub otlp: otlp::OtlpConfig,
}

mod block_io;
mod collection;
mod cpu;
mod exposition;
mod flags;
mod gpu;
mod kubernetes;
mod labels;
mod limits;
pub mod otlp;
pub mod pem;
mod reference;
mod slow_calls;
mod syscalls;
pub mod web;

pub(crate) use self::{
    block_io::*, cpu::*, exposition::*, gpu::*, labels::*, limits::*, slow_calls::*, syscalls::*,
};
// What the binaries and the integration tests name.
pub use self::{
    collection::{CollectionConfig, ProbeStatsMode},
    flags::{CollectorFlags, COLLECTORS},
    kubernetes::KubernetesConfig,
    syscalls::HistogramResolution,
};

/// Where a configuration came from, to name it in the errors of [`Config::validate`].
struct Rules<'a> {
    origin: &'a str,
}

impl Rules<'_> {
    fn invalid(&self, key: &str, problem: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.origin.to_string(),
            key: key.to_string(),
            problem,
        }
    }

    fn ranged(&self, key: &str, v: u64, lo: u64, hi: u64) -> Result<(), ConfigError> {
        if v < lo || v > hi {
            Err(self.invalid(key, format!("{v} is out of range {lo}..={hi}")))
        } else {
            Ok(())
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: display.clone(),
            source,
        })?;
        Self::parse(&text, &display)
    }

    /// Parses and validates config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: describe_toml_error(text, &e),
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Checks every rule the types do not: bounds, names, and rules between keys. The first
    /// broken rule is the error, naming its key.
    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let r = Rules { origin };
        self.validate_collection(&r)?;
        self.validate_sizes(&r)?;
        self.validate_slow_calls(&r)?;
        self.validate_labels(&r)?;
        Ok(())
    }

    /// The collection intervals.
    fn validate_collection(&self, r: &Rules<'_>) -> Result<(), ConfigError> {
        let c = &self.collection;
        if c.min_interval > Duration::from_secs(60) {
            return Err(r.invalid("collection.min_interval", "must be at most 60s".into()));
        }
        if c.background_interval < Duration::from_millis(100)
            || c.background_interval > Duration::from_secs(3600)
        {
            return Err(r.invalid(
                "collection.background_interval",
                "must be between 100ms and 1h".into(),
            ));
        }
        if c.series_retention < c.background_interval {
            return Err(r.invalid(
                "collection.series_retention",
                "must be at least collection.background_interval".into(),
            ));
        }
        Ok(())
    }

    /// Map and table sizes, and what the collectors need named.
    fn validate_sizes(&self, r: &Rules<'_>) -> Result<(), ConfigError> {
        let l = &self.limits;
        r.ranged("limits.max_series", l.max_series as u64, 100, 10_000_000)?;
        r.ranged("limits.max_threads", l.max_threads as u64, 64, 4_194_304)?;
        r.ranged(
            "limits.max_syscall_entries",
            l.max_syscall_entries as u64,
            64,
            1_048_576,
        )?;
        r.ranged(
            "limits.max_syscall_entries_per_cgroup",
            l.max_syscall_entries_per_cgroup as u64,
            0,
            1_048_576,
        )?;
        r.ranged(
            "limits.max_error_entries",
            l.max_error_entries as u64,
            16,
            1_048_576,
        )?;
        r.ranged(
            "limits.max_error_entries_per_cgroup",
            l.max_error_entries_per_cgroup as u64,
            0,
            1_048_576,
        )?;
        r.ranged(
            "limits.max_exited_processes",
            l.max_exited_processes as u64,
            16,
            1_048_576,
        )?;
        r.ranged(
            "block_io.max_inflight",
            self.block_io.max_inflight as u64,
            64,
            1_048_576,
        )?;
        r.ranged(
            "block_io.max_entries",
            self.block_io.max_entries as u64,
            16,
            1_048_576,
        )?;
        r.ranged("cpu.max_cgroups", self.cpu.max_cgroups as u64, 1, 1_000_000)?;
        if self.gpu.nvml_library.trim().is_empty() {
            return Err(r.invalid(
                "gpu.nvml_library",
                "must name a library (set gpu.enabled = false to turn the GPU collector off)"
                    .into(),
            ));
        }
        if self.block_io.tracepoints.len() != 2 {
            return Err(r.invalid(
                "block_io.tracepoints",
                format!(
                    "must name two tracepoints, the issue and the completion one (got {})",
                    self.block_io.tracepoints.len()
                ),
            ));
        }
        Ok(())
    }

    /// Slow-call sampling: rates, sizes, thresholds and syscall names.
    fn validate_slow_calls(&self, r: &Rules<'_>) -> Result<(), ConfigError> {
        let s = &self.slow_calls;
        r.ranged(
            "slow_calls.max_events_per_second",
            s.max_events_per_second as u64,
            0,
            1_000_000,
        )?;
        r.ranged(
            "slow_calls.recent_capacity",
            s.recent_capacity as u64,
            0,
            100_000,
        )?;
        r.ranged(
            "slow_calls.export_queue",
            s.export_queue as u64,
            1,
            1_000_000,
        )?;
        if !s.ring_buffer_bytes.is_power_of_two() || s.ring_buffer_bytes < 4096 {
            return Err(r.invalid(
                "slow_calls.ring_buffer_bytes",
                format!(
                    "{} must be a power of two and at least 4096",
                    s.ring_buffer_bytes
                ),
            ));
        }
        if s.threshold.is_zero() {
            return Err(r.invalid(
                "slow_calls.threshold",
                "must be greater than 0 (set slow_calls.enabled = false to turn sampling off)"
                    .into(),
            ));
        }
        for name in &s.exclude {
            if !syscall_table::is_known_anywhere(name) {
                return Err(r.invalid("slow_calls.exclude", format!("unknown syscall `{name}`")));
            }
        }
        for (name, value) in &s.thresholds {
            let key = format!("slow_calls.thresholds.{name}");
            if !syscall_table::is_known_anywhere(name) {
                return Err(r.invalid(&key, format!("unknown syscall `{name}`")));
            }
            parse_threshold(value).map_err(|problem| r.invalid(&key, problem))?;
        }
        Ok(())
    }

    /// Pod watch, histogram forms, label syscall names and the OTLP section.
    fn validate_labels(&self, r: &Rules<'_>) -> Result<(), ConfigError> {
        match self.kubernetes.pod_watch.as_str() {
            "auto" | "on" | "off" => {}
            other => {
                return Err(r.invalid(
                    "kubernetes.pod_watch",
                    format!("`{other}` is not one of auto, on, off"),
                ))
            }
        }
        r.ranged(
            "kubernetes.max_pods",
            self.kubernetes.max_pods as u64,
            1,
            1_000_000,
        )?;
        let e = &self.exposition;
        if !e.native_histograms && !e.classic_histograms {
            return Err(r.invalid(
                "exposition.native_histograms",
                "with exposition.classic_histograms also false, the protobuf exposition would carry no histogram; set one of them".into(),
            ));
        }
        for name in &self.labels.syscalls {
            if !syscall_table::is_known_anywhere(name) {
                return Err(r.invalid("labels.syscalls", format!("unknown syscall `{name}`")));
            }
        }
        for name in &self.labels.syscall_families {
            if syscall_table::family(name).is_none() {
                return Err(r.invalid(
                    "labels.syscall_families",
                    format!(
                        "unknown family `{name}` (one of {})",
                        syscall_table::FAMILIES
                            .iter()
                            .map(|(f, _)| *f)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        self.otlp
            .validate()
            .map_err(|(key, problem)| r.invalid(&key, problem))?;
        Ok(())
    }

    /// Sets the key of every collector switched on the command line (`--collector.<name>`,
    /// `--no-collector.<name>`): the flags win over the file.
    pub fn apply_collector_flags(&mut self, flags: &CollectorFlags) {
        for (name, on) in flags.switches() {
            match name {
                "syscalls" => self.syscalls.enabled = on,
                "block_io" => self.block_io.enabled = on,
                "cpu" => self.cpu.enabled = on,
                "gpu" => self.gpu.enabled = on,
                "kubernetes" => self.kubernetes.pod_watch = if on { "on" } else { "off" }.into(),
                other => unreachable!("collector {other} has no key"),
            }
        }
    }

    /// The slow-call threshold for every syscall number, in ns (0: never sampled).
    pub(crate) fn slow_thresholds_ns(&self) -> Vec<u64> {
        let s = &self.slow_calls;
        let mut out = vec![0u64; sysscope_abi::MAX_SYSCALL_NR as usize];
        if !s.enabled {
            return out;
        }
        let default_ns = s.threshold.as_nanos().min(u64::MAX as u128) as u64;
        for (nr, slot) in out.iter_mut().enumerate() {
            if syscall_table::name(nr as u32).is_some() {
                *slot = default_ns;
            }
        }
        for name in &s.exclude {
            if let Some(nr) = syscall_table::number(name) {
                out[nr as usize] = 0;
            }
        }
        for (name, value) in &s.thresholds {
            if let (Some(nr), Ok(t)) = (syscall_table::number(name), parse_threshold(value)) {
                out[nr as usize] = t.map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64);
            }
        }
        out
    }
}

/// Keys a reload may change while sysscope runs (a key, or every key under it); every other key
/// is baked into the loaded probes, the maps' sizes or the running pipelines and needs a
/// restart.
pub(crate) const LIVE_KEYS: &[&str] = &[
    "slow_calls.threshold",
    "slow_calls.thresholds",
    "slow_calls.exclude",
    "limits.max_series",
    "collection.series_retention",
];

/// Whether `key` (a dotted path from [`changed_keys`]) may change without a restart.
pub(crate) fn is_live(key: &str) -> bool {
    LIVE_KEYS
        .iter()
        .any(|live| key == *live || key.strip_prefix(live).is_some_and(|r| r.starts_with('.')))
}

/// The keys (dotted paths, e.g. `slow_calls.thresholds.read`) whose values differ between two
/// configurations.
pub(crate) fn changed_keys(old: &Config, new: &Config) -> Vec<String> {
    fn diff(prefix: &str, a: Option<&toml::Value>, b: Option<&toml::Value>, out: &mut Vec<String>) {
        match (a, b) {
            (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) => {
                let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for k in keys {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    diff(&path, a.get(k), b.get(k), out);
                }
            }
            (a, b) if a != b => out.push(prefix.to_string()),
            _ => {}
        }
    }
    let as_value = |c: &Config| toml::Value::try_from(c).ok();
    let mut out = Vec::new();
    diff("", as_value(old).as_ref(), as_value(new).as_ref(), &mut out);
    out
}

/// "off" or a duration; `None` means never sample.
fn parse_threshold(value: &str) -> Result<Option<Duration>, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let d = humantime_serde_compat::parse(value)?;
    Ok(if d.is_zero() { None } else { Some(d) })
}

fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    // toml names unknown keys in its message ("unknown field `x`, expected one of ..."), but
    // not mistyped ones: quote the offending line, which does.
    let msg = e.message().trim_end().to_string();
    match e.span() {
        Some(span) => {
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!("line {line_no} `{line}`: {msg}")
        }
        None => msg,
    }
}

/// The default configuration as TOML: every key with its default, its meaning, type, allowed
/// values and whether a reload changes it (the reference of docs/configuration.md, as
/// comments). The `[otlp]` keys have no default of their own (unset, they come from `OTEL_*`
/// variables or the OTLP defaults), so they are listed commented out, with example values.
pub fn default_config_toml() -> String {
    let mut text = String::from(
        "# sysscope configuration (TOML): every key with its default. Keys marked \"reload: live\"\n\
         # change on SIGHUP or POST /-/reload; the others need a restart. The same reference is\n\
         # docs/configuration.md.\n",
    );
    text.push_str(&reference::commented_sections());
    text
}

#[cfg(test)]
mod tests {

    #[test]
    fn changed_keys_name_each_difference_and_which_are_live() {
        let old = Config::default();
        let mut new = Config::default();
        assert!(changed_keys(&old, &new).is_empty());
        new.slow_calls.threshold = Duration::from_millis(5);
        new.slow_calls
            .thresholds
            .insert("read".into(), "1ms".into());
        new.limits.max_series = 1234;
        new.limits.max_syscall_entries = 4096;
        let keys = changed_keys(&old, &new);
        assert_eq!(
            keys,
            [
                "limits.max_series",
                "limits.max_syscall_entries",
                "slow_calls.threshold",
                "slow_calls.thresholds.read"
            ]
        );
        let live: Vec<bool> = keys.iter().map(|k| is_live(k)).collect();
        assert_eq!(live, [true, false, true, true]);
        assert!(!is_live("slow_calls.threshold_other"));
        assert!(!is_live("slow_calls.enabled"));
    }

    use super::*;

    /// What `--print-default-config` prints loads back as the default configuration, and
    /// its commented `[otlp]` example keys, uncommented, are valid keys.
    #[test]
    fn printed_default_config_round_trips_and_its_otlp_examples_are_valid() {
        let text = default_config_toml();
        let parsed: Config = toml::from_str(&text).expect("printed defaults parse");
        parsed
            .validate("printed defaults")
            .expect("printed defaults are valid");
        assert_eq!(parsed, Config::default());
        // Every documented key is there, set or (unset by default) commented out.
        for section in reference::sections() {
            for key in section.keys {
                let set = format!("\n{} = ", key.name);
                let unset = format!("\n# {} = ", key.name);
                assert!(
                    text.contains(&set) || text.contains(&unset),
                    "{} missing from the printed defaults",
                    key.path
                );
            }
        }
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                // `# key = value`, not a sentence of a key's description.
                Some(rest)
                    if rest.split_once(" = ").is_some_and(|(k, _)| {
                        k.starts_with('"')
                            || k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    }) || rest.starts_with("[otlp.") =>
                {
                    rest.split(" # ").next().unwrap().trim_end().to_string()
                }
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        let parsed: Config = toml::from_str(&uncommented)
            .unwrap_or_else(|e| panic!("example keys:\n{uncommented}\n{e}"));
        assert_eq!(
            parsed.otlp.endpoint.as_deref(),
            Some("http://otel-collector:4318")
        );
        assert_eq!(parsed.otlp.span_batch_size, Some(512));
        assert_eq!(parsed.otlp.headers["authorization"], "Bearer ...");
    }

    fn err(text: &str) -> String {
        Config::parse(text, "test.toml").unwrap_err().to_string()
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(Config::parse("", "x").unwrap(), Config::default());
    }

    #[test]
    fn defaults_round_trip_through_toml() {
        let text = toml::to_string(&Config::default()).unwrap();
        assert_eq!(Config::parse(&text, "x").unwrap(), Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let e = err("[limits]\nmax_seriess = 5\n");
        assert!(e.contains("max_seriess"), "{e}");
        let e = err("[nonsense]\n");
        assert!(e.contains("nonsense"), "{e}");
    }

    #[test]
    fn wrong_type_is_named() {
        let e = err("[limits]\nmax_series = \"many\"\n");
        assert!(e.contains("max_series") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn out_of_range_names_key_and_value() {
        let e = err("[limits]\nmax_series = 5\n");
        assert!(e.contains("limits.max_series") && e.contains('5'), "{e}");
    }

    #[test]
    fn bad_duration_is_explained() {
        let e = err("[collection]\nmin_interval = \"soon\"\n");
        assert!(e.contains("soon"), "{e}");
        let e = err("[collection]\nmin_interval = \"10\"\n");
        assert!(e.contains("unit"), "{e}");
    }

    #[test]
    fn unknown_syscall_in_thresholds_is_named() {
        let e = err("[slow_calls.thresholds]\nreadd = \"5ms\"\n");
        assert!(e.contains("slow_calls.thresholds.readd"), "{e}");
    }

    #[test]
    fn thresholds_apply_overrides_and_exclusions() {
        let c = Config::parse(
            "[slow_calls]\nthreshold = \"20ms\"\n[slow_calls.thresholds]\nfsync = \"1ms\"\nread = \"off\"\n",
            "x",
        )
        .unwrap();
        let t = c.slow_thresholds_ns();
        let nr = |n| syscall_table::number(n).unwrap() as usize;
        assert_eq!(t[nr("fsync")], 1_000_000);
        assert_eq!(t[nr("read")], 0);
        assert_eq!(t[nr("write")], 20_000_000);
        assert_eq!(t[nr("epoll_wait")], 0, "excluded by default");
    }

    #[test]
    fn cpu_and_gpu_keys_are_validated() {
        let e = err("[cpu]\nmax_cgroups = 0\n");
        assert!(e.contains("cpu.max_cgroups"), "{e}");
        let e = err("[gpu]\nnvml_library = \" \"\n");
        assert!(e.contains("gpu.nvml_library"), "{e}");
        let c = Config::parse("[cpu]\nmax_cgroups = 10\n", "x").unwrap();
        assert_eq!(c.cpu.max_cgroups, 10);
    }

    #[test]
    fn block_tracepoints_are_an_issue_completion_pair() {
        let e = err("[block_io]\ntracepoints = [\"block_rq_issue\"]\n");
        assert!(
            e.contains("block_io.tracepoints") && e.contains("got 1"),
            "{e}"
        );
        let c = Config::parse(
            "[block_io]\ntracepoints = [\"block_rq_issue\", \"block_rq_complete\"]\n",
            "x",
        )
        .unwrap();
        assert_eq!(c.block_io, BlockIoConfig::default());
    }

    #[test]
    fn otlp_section_is_validated_with_the_key_named() {
        let e = err("[otlp]\nprotocol = \"udp\"\n");
        assert!(
            e.contains("test.toml") && e.contains("key `otlp.protocol`") && e.contains("udp"),
            "{e}"
        );
        let e = err("[otlp]\nendpiont = \"http://a:4318\"\n");
        assert!(e.contains("endpiont"), "{e}");
        let e = err("[otlp.headers]\n\"a b\" = \"1\"\n");
        assert!(e.contains("otlp.headers.a b"), "{e}");
        let c = Config::parse(
            "[otlp]\nendpoint = \"https://collector:4318\"\ntraces = false\n[otlp.resource_attributes]\nteam = \"infra\"\n",
            "x",
        )
        .unwrap();
        assert_eq!(c.otlp.endpoint.as_deref(), Some("https://collector:4318"));
        assert_eq!(c.otlp.traces, Some(false));
        assert_eq!(c.otlp.resource_attributes["team"], "infra");
    }

    #[test]
    fn label_control_and_exposition_keys_are_validated() {
        let e = err("[labels]\nsyscalls = [\"read\", \"raed\"]\n");
        assert!(e.contains("labels.syscalls") && e.contains("raed"), "{e}");
        let e = err("[labels]\nsyscall_families = [\"reads\"]\n");
        assert!(
            e.contains("labels.syscall_families") && e.contains("reads") && e.contains("metadata"),
            "{e}"
        );
        let e = err("[labels]\ncgroup = \"never\"\n");
        assert!(e.contains("never") && e.contains("unless_pod_known"), "{e}");
        let e = err("[exposition]\nnative_histograms = false\nclassic_histograms = false\n");
        assert!(e.contains("exposition.native_histograms"), "{e}");
        let c = Config::parse(
            "[labels]\ncgroup = \"unless_pod_known\"\ncomm = false\nsyscalls = [\"getppid\"]\nsyscall_families = [\"sync\"]\n[exposition]\nclassic_histograms = true\n",
            "x",
        )
        .unwrap();
        assert_eq!(c.labels.cgroup, CgroupLabel::UnlessPodKnown);
        assert!(
            !c.labels.comm && c.exposition.native_histograms && c.exposition.classic_histograms
        );
    }

    #[test]
    fn a_missing_file_names_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.toml");
        let e = Config::load(&path).unwrap_err();
        // As `main` prints it: the message, then the chain of causes.
        let shown = format!("{:#}", anyhow::Error::new(e));
        let cause = std::io::Error::from_raw_os_error(libc::ENOENT).to_string();
        assert_eq!(shown.matches(&cause).count(), 1, "{shown}");
        assert!(shown.starts_with("cannot read config file "), "{shown}");
        assert!(shown.contains("absent.toml"), "{shown}");
    }

    #[test]
    fn durations_parse() {
        use humantime_serde_compat::parse;
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("5m").unwrap(), Duration::from_secs(300));
        assert!(parse("-1s").is_err());
        assert!(parse("1d").is_err());
    }
}
