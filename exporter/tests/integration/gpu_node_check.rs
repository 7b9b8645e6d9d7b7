//! `scripts/checks/gpu-node.sh`, the comparison to run on GPU hardware, checked without a GPU:
//! it must skip cleanly where there is no NVIDIA driver (as in CI), fail where NVIDIA GPUs have
//! no working driver, and, against the NVML stand-in on one side and a FAKE `nvidia-smi` that
//! prints the stand-in's state on the other (exporter/tests/support/nvml/fake-nvidia-smi: it
//! tests the script's parsing and comparisons, nothing about a GPU), pass when both agree and
//! fail naming the row when they do not. The load is a shell script in a fresh cgroup that
//! puts its own pid into the stand-in's state, so the cgroup join is checked for real.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::{
    common::*,
    nvml_standin::{library, Gpu, Proc, StandIn, State},
    prometheus_e2e::repo_root,
};

fn script() -> PathBuf {
    repo_root().join("scripts/checks/gpu-node.sh")
}

fn fake_smi() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/nvml/fake-nvidia-smi")
}

/// Runs the script as on a machine whose PCI bus is `pci`, with no NVIDIA driver (no
/// /proc/driver/nvidia/version, unless the test writes `pci/no-driver-version`, and no
/// nvidia-smi), whatever this machine has: the test runs, never skips, on a GPU machine too.
fn run_without_driver(pci: &Path) -> Output {
    Command::new("bash")
        .arg(script())
        .env("GPU_NODE_PCI", pci)
        .env("GPU_NODE_DRIVER", pci.join("no-driver-version"))
        .env("GPU_NODE_NVIDIA_SMI", pci.join("no-nvidia-smi"))
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn gpu_node_check_skips_without_a_driver_and_fails_with_gpus_but_no_driver() {
    let pci = tempfile::tempdir().unwrap();
    let add = |name: &str, vendor: &str, class: &str| {
        let d = pci.path().join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
    };
    // A machine without NVIDIA GPUs (an Intel host bridge, the GPU's HDMI audio alone).
    add("0000:00:00.0", "0x8086", "0x060000");
    add("0000:3b:00.1", "0x10de", "0x040300");
    let out = run_without_driver(pci.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("gpu-node: SKIPPED: no NVIDIA driver"), "{t}");
    // A driver loaded (its /proc file there) without its utilities: a failure too.
    std::fs::write(
        pci.path().join("no-driver-version"),
        "NVRM version: 550.54.15\n",
    )
    .unwrap();
    let out = run_without_driver(pci.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    std::fs::remove_file(pci.path().join("no-driver-version")).unwrap();

    // An H100 on the bus but no driver utilities: a failure, never a skip.
    add("0000:3b:00.0", "0x10de", "0x030200");
    let out = run_without_driver(pci.path());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("gpu-node: FAIL") && t.contains("1 NVIDIA GPU(s) on the PCI bus"),
        "{t}"
    );
}

/// The stand-in's state with the load process (its pid written by the load itself).
fn node(util: u32, load_pid: &str) -> String {
    let mut gpu = Gpu::full("GPU-aaaa");
    gpu.name = Some("NVIDIA H100 80GB HBM3".into());
    gpu.util = Some((util, 30));
    gpu.power_mw = Some(312_000);
    let mut other = Gpu::full("GPU-bbbb");
    other.util = Some((3, 1));
    if !load_pid.is_empty() {
        gpu.processes.push(Proc {
            pid: 0,
            used: Some(1 << 30),
            sm: util - 1,
            mem: 20,
            ..Proc::default()
        });
    }
    let state = State {
        devices: vec![gpu, other],
        ..State::default()
    };
    // The process line carries the pid the load will know: `process 0 ...` becomes its own.
    state
        .render(Path::new("/dev/null"))
        .replace("process 0 ", &format!("process {load_pid} "))
}

/// Runs the script against the stand-in with nvidia-smi reporting `offset` more utilisation;
/// without `own_cgroup`, as a user who cannot make a cgroup for the load.
fn run_against_standin(util: u32, offset: u32, own_cgroup: bool) -> Output {
    let standin = StandIn::new(&State::default());
    std::fs::write(&standin.state, node(util, "")).unwrap();
    let template = standin.dir.path().join("with-load");
    std::fs::write(&template, node(util, "LOADPID")).unwrap();
    let load = standin.dir.path().join("load.sh");
    let tmp = standin.dir.path().join("state.tmp");
    std::fs::write(
        &load,
        format!(
            // It makes syscalls while it runs (fork, wait), as a CUDA load does (ioctl).
            "#!/bin/sh\nsed \"s/LOADPID/$$/\" {t} > {tmp} && mv {tmp} {s}\necho ready\nwhile :; do sleep 0.1; done\n",
            t = template.display(),
            tmp = tmp.display(),
            s = standin.state.display()
        ),
    )
    .unwrap();
    let _node = share_node();
    Command::new("bash")
        .arg(script())
        .env(standin.env().0, standin.env().1)
        .env("GPU_NODE_NVIDIA_SMI", fake_smi())
        .env("GPU_NODE_NVML_LIBRARY", library())
        .env("GPU_NODE_LOAD", format!("sh {}", load.display()))
        .env("SYSSCOPE_BIN", sysscope_bin())
        .env("GPU_NODE_ROUNDS", "3")
        .env("GPU_NODE_INTERVAL", "0.5")
        .env("GPU_NODE_WARMUP", "1.5")
        .env("FAKE_NVIDIA_SMI_UTIL_OFFSET", offset.to_string())
        .env("GPU_NODE_OWN_CGROUP", if own_cgroup { "1" } else { "0" })
        .output()
        .unwrap()
}

#[test]
fn gpu_node_check_compares_sysscope_with_nvidia_smi_and_fails_on_a_disagreement() {
    if !require_root("gpu_node_check_compares_sysscope_with_nvidia_smi_and_fails_on_a_disagreement")
    {
        return;
    }
    let out = run_against_standin(60, 0, true);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    for row in [
        "device utilisation",
        "device memory used",
        "device power",
        "process memory",
        "process SM utilisation",
        "process cgroup",
        "gpu collector up",
    ] {
        let line = t
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no row {row}:\n{t}"));
        assert!(line.ends_with("PASS"), "{line}\n{t}");
    }
    // The load's cgroup is the one the script made, as sysscope labels it.
    let cgroup = t.lines().find(|l| l.starts_with("process cgroup")).unwrap();
    assert!(cgroup.contains("/sysscope-gpu-node-"), "{cgroup}");
    assert!(t.contains("gpu-node: PASS (7 comparisons agree)"), "{t}");

    // nvidia-smi says 40 points more: beyond NVML's window, so a failure naming the row. And
    // without a cgroup of its own, the load's GPU series are checked against the cgroup of its
    // syscall series, which the probes name from the kernel's cgroup id.
    let out = run_against_standin(50, 40, false);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let cgroup = t.lines().find(|l| l.starts_with("process cgroup")).unwrap();
    assert!(
        cgroup.contains("= its syscalls'") && cgroup.ends_with("PASS"),
        "{cgroup}\n{t}"
    );
    let util = t
        .lines()
        .find(|l| l.starts_with("device utilisation"))
        .unwrap();
    assert!(
        util.contains("50.0 %") && util.contains("90.0 %") && util.ends_with("FAIL"),
        "{util}"
    );
    assert!(
        t.contains("gpu-node: FAIL (sysscope and nvidia-smi disagree: device utilisation)"),
        "{t}"
    );
}
