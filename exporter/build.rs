//! Builds the eBPF object (`ebpf/probes`, nightly, bpfel target) that the exporter embeds.
//! Set `AYA_BUILD_SKIP=1` to build user space alone (e.g. for `cargo doc`); the binary then
//! refuses to load probes.
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let probes_dir = manifest_dir.join("../ebpf/probes").canonicalize()?;
    let abi_dir = manifest_dir.join("../ebpf/abi").canonicalize()?;
    println!("cargo:rerun-if-changed={}", abi_dir.display());
    let probes_dir = probes_dir.to_str().expect("utf-8 path");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "sysscope-probes",
            root_dir: probes_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
