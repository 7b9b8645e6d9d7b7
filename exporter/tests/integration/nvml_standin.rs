//! The stand-in `libnvidia-ml.so.1` (exporter/tests/support/nvml/standin.c): built here with
//! gcc once per test run, and driven through the state file it reads on every call. The
//! exporter loads it through `gpu.nvml_library`, exactly as it loads NVIDIA's library.
#![allow(dead_code)]

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use crate::common::*;

/// The environment variable the stand-in reads its state file's path from.
pub const STATE_ENV: &str = "SYSSCOPE_NVML_STANDIN_STATE";

/// The stand-in library, compiled on first use (about 0.3 s).
pub fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| build("nvml-standin", &[]))
}

/// The stand-in as a driver older than NVML 12.2 (R535) is: without
/// `nvmlDeviceGetCurrentClocksEventReasons`, only its former name
/// `nvmlDeviceGetCurrentClocksThrottleReasons`.
pub fn library_before_12_2() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| build("nvml-standin-before-12.2", &["-DSTANDIN_BEFORE_12_2"]))
}

fn build(name: &str, defines: &[&str]) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/nvml/standin.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libnvidia-ml.so.1");
    let tmp = dir.join(format!("libnvidia-ml.so.1.{}", std::process::id()));
    let out = Command::new("gcc")
        .args(defines)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fvisibility=hidden",
            "-o",
        ])
        .arg(&tmp)
        .arg(&src)
        .arg("-lpthread")
        .output()
        .expect("gcc (build-essential) must be installed: scripts/setup.sh --test");
    assert!(
        out.status.success(),
        "building the NVML stand-in failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &lib).unwrap();
    lib
}

/// A process the stand-in lists on a device.
#[derive(Debug, Clone, Default)]
pub struct Proc {
    pub pid: u32,
    /// `None`: NVML cannot tell (`-`).
    pub used: Option<u64>,
    pub sm: u32,
    pub mem: u32,
    /// (GPU instance, compute instance) on a MIG device.
    pub mig: Option<(u32, u32)>,
    /// A graphics context instead of a compute one.
    pub graphics: bool,
}

/// A MIG device of a GPU in MIG mode.
#[derive(Debug, Clone, Default)]
pub struct Mig {
    pub uuid: String,
    pub name: String,
    pub used: u64,
    pub total: u64,
    pub gi: u32,
    pub ci: u32,
}

/// One device of the stand-in's state. `None` fields are not supported by the device.
#[derive(Debug, Clone, Default)]
pub struct Gpu {
    pub uuid: String,
    pub name: Option<String>,
    pub serial: Option<String>,
    pub pci_bus_id: Option<String>,
    /// Every call on the device answers this NVML error code.
    pub error: Option<u32>,
    pub util: Option<(u32, u32)>,
    pub memory: Option<(u64, u64)>,
    pub power_mw: Option<u32>,
    pub temperature: Option<u32>,
    pub clocks: Option<(u32, u32, u32)>,
    pub energy_mj: Option<u64>,
    pub clocks_event_reasons: Option<u64>,
    /// Corrected/uncorrected volatile, then corrected/uncorrected aggregate.
    pub ecc: Option<[u64; 4]>,
    pub processes: Vec<Proc>,
    /// (current, pending) MIG mode.
    pub mig: Option<(u32, u32)>,
    pub migs: Vec<Mig>,
    /// (event id, XID code).
    pub xids: Vec<(u64, u64)>,
    /// (NVML function, error code) for this device.
    pub fails: Vec<(String, u32)>,
    /// (NVML function, calls): that many calls with a buffer find it too small.
    pub insufficient_size: Vec<(String, u32)>,
}

impl Gpu {
    /// A whole GPU with every reading, as an A100 reports them.
    pub fn full(uuid: &str) -> Self {
        Self {
            uuid: uuid.into(),
            name: Some("NVIDIA A100-SXM4-80GB".into()),
            serial: Some("1320221234567".into()),
            pci_bus_id: Some("00000000:3B:00.0".into()),
            util: Some((87, 17)),
            memory: Some((3 << 30, 80 << 30)),
            power_mw: Some(251_500),
            temperature: Some(61),
            clocks: Some((1410, 1395, 1593)),
            energy_mj: Some(123_456_789),
            clocks_event_reasons: Some(0x4),
            ecc: Some([3, 1, 40, 2]),
            ..Self::default()
        }
    }

    fn render(&self, out: &mut String) {
        let w = |out: &mut String, line: String| {
            out.push_str(&line);
            out.push('\n');
        };
        w(out, "device".into());
        w(out, format!("uuid {}", self.uuid));
        for (key, v) in [
            ("name", &self.name),
            ("serial", &self.serial),
            ("pci_bus_id", &self.pci_bus_id),
        ] {
            if let Some(v) = v {
                w(out, format!("{key} {v}"));
            }
        }
        if let Some(e) = self.error {
            w(out, format!("error {e}"));
        }
        if let Some((g, m)) = self.util {
            w(out, format!("utilization {g} {m}"));
        }
        if let Some((u, t)) = self.memory {
            w(out, format!("memory {u} {t}"));
        }
        if let Some(p) = self.power_mw {
            w(out, format!("power_mw {p}"));
        }
        if let Some(t) = self.temperature {
            w(out, format!("temperature {t}"));
        }
        if let Some((g, s, m)) = self.clocks {
            w(out, format!("clocks {g} {s} {m}"));
        }
        if let Some(e) = self.energy_mj {
            w(out, format!("energy_mj {e}"));
        }
        if let Some(r) = self.clocks_event_reasons {
            w(out, format!("clocks_event_reasons {r:#x}"));
        }
        if let Some([a, b, c, d]) = self.ecc {
            w(out, format!("ecc {a} {b} {c} {d}"));
        }
        for p in &self.processes {
            let used = p.used.map_or("-".to_string(), |u| u.to_string());
            if p.graphics {
                w(out, format!("graphics_process {} {used}", p.pid));
            } else {
                let mig = p.mig.map_or(String::new(), |(g, c)| format!(" {g} {c}"));
                w(
                    out,
                    format!("process {} {used} {} {}{mig}", p.pid, p.sm, p.mem),
                );
            }
        }
        if let Some((c, p)) = self.mig {
            w(out, format!("mig {c} {p}"));
        }
        for m in &self.migs {
            w(out, "mig_device".into());
            w(out, format!("uuid {}", m.uuid));
            w(out, format!("name {}", m.name));
            w(out, format!("memory {} {}", m.used, m.total));
            w(out, format!("gpu_instance {}", m.gi));
            w(out, format!("compute_instance {}", m.ci));
        }
        for (id, code) in &self.xids {
            w(out, format!("xid {id} {code}"));
        }
        for (f, code) in &self.fails {
            w(out, format!("fail {f} {code}"));
        }
        for (f, n) in &self.insufficient_size {
            w(out, format!("insufficient_size {f} {n}"));
        }
    }
}

/// The whole state: driver, devices in NVML order, and failures of NVML itself.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub driver_version: Option<String>,
    pub cuda_version: Option<u32>,
    pub devices: Vec<Gpu>,
    /// (NVML function, error code), e.g. ("nvmlInit_v2", 9).
    pub fails: Vec<(String, u32)>,
    /// The caller lacks NVML's admin privileges (process lists of GPUs in MIG mode refused).
    pub unprivileged: bool,
}

impl State {
    pub fn render(&self, call_log: &Path) -> String {
        let mut out = String::new();
        writeln!(out, "call_log {}", call_log.display()).unwrap();
        if let Some(v) = &self.driver_version {
            writeln!(out, "driver_version {v}").unwrap();
        }
        if let Some(v) = self.cuda_version {
            writeln!(out, "cuda_version {v}").unwrap();
        }
        for (f, code) in &self.fails {
            writeln!(out, "fail {f} {code}").unwrap();
        }
        if self.unprivileged {
            writeln!(out, "unprivileged").unwrap();
        }
        for d in &self.devices {
            d.render(&mut out);
        }
        out
    }
}

/// A state file and call log in a directory of their own.
pub struct StandIn {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub call_log: PathBuf,
}

impl StandIn {
    pub fn new(state: &State) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let s = Self {
            state: dir.path().join("state"),
            call_log: dir.path().join("calls"),
            dir,
        };
        s.set(state);
        s
    }

    /// Replaces the state, atomically (the library may read it at any moment).
    pub fn set(&self, state: &State) {
        let tmp = self.dir.path().join("state.tmp");
        std::fs::write(&tmp, state.render(&self.call_log)).unwrap();
        std::fs::rename(&tmp, &self.state).unwrap();
    }

    /// The environment the exporter needs to find the state.
    pub fn env(&self) -> (&'static str, &str) {
        (STATE_ENV, self.state.to_str().unwrap())
    }

    /// The `[gpu]` section that loads the stand-in.
    pub fn config(&self) -> String {
        format!("[gpu]\nnvml_library = \"{}\"\n", library().display())
    }

    /// The calls logged so far.
    pub fn calls(&self) -> String {
        std::fs::read_to_string(&self.call_log).unwrap_or_default()
    }

    /// Waits until a logged call contains `needle`.
    pub fn wait_for_call(&self, needle: &str) {
        let seen = eventually(Duration::from_secs(20), || {
            self.calls().contains(needle).then_some(())
        });
        assert!(
            seen.is_some(),
            "the stand-in never saw `{needle}`; calls:\n{}",
            self.calls()
        );
    }
}
