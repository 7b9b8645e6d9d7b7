#!/usr/bin/env bash
# Checks sysscope against NVIDIA's own tools on a Linux machine with an NVIDIA GPU and driver
# (no CUDA toolkit needed): makes a GPU load of its own through the CUDA driver API
# (libcuda.so.1, loaded at run time by Python's ctypes: a PTX kernel that spins, and device
# memory allocated) in a fresh cgroup, runs the sysscope release binary with its defaults (with
# the probes off if the machine refuses BPF), and prints a table comparing sysscope's device
# and per-process utilisation, memory and power with `nvidia-smi --query-gpu`,
# `--query-compute-apps` and `nvidia-smi pmon`, and the load process's cgroup as sysscope
# labels it. Exits non-zero on a disagreement beyond NVML's own sampling window (the
# tolerances are in gpu_node.py). Run it as root from the repository:
#
#   scripts/checks/gpu-node.sh
#
# scripts/test.sh runs every check, and CI has no GPU: on a machine with neither an NVIDIA
# driver nor an NVIDIA GPU on the PCI bus this prints "SKIPPED: no NVIDIA driver" and exits 0.
# A machine with NVIDIA GPUs but no working driver fails: it never passes without comparing.
#
# Environment (defaults in brackets):
#   SYSSCOPE_BIN        the binary [target/release/sysscope, built if missing]
#   GPU_NODE_SECONDS    how long the load runs [60]; GPU_NODE_MIB its device memory [1024]
#   GPU_NODE_DEVICE     the GPU the load runs on, numbered as nvidia-smi does [0]
#   GPU_NODE_ROUNDS, GPU_NODE_INTERVAL, GPU_NODE_WARMUP
#                       samples compared [5], seconds between them [2], before the first [5]
# Seams for the test suite, which checks this script without a GPU against the NVML stand-in
# and a fake nvidia-smi (exporter/tests/integration/gpu_node_check.rs); never set them on a GPU
# machine: GPU_NODE_PCI (/sys/bus/pci/devices), GPU_NODE_DRIVER (/proc/driver/nvidia/version),
# GPU_NODE_NVIDIA_SMI (nvidia-smi), GPU_NODE_NVML_LIBRARY (gpu.nvml_library), GPU_NODE_LOAD (a
# command replacing the CUDA load), GPU_NODE_OWN_CGROUP=0 (act as a user who cannot make a
# cgroup for the load).
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
pci=${GPU_NODE_PCI:-/sys/bus/pci/devices}
driver=${GPU_NODE_DRIVER:-/proc/driver/nvidia/version}
smi=${GPU_NODE_NVIDIA_SMI:-nvidia-smi}

# NVIDIA display controllers (vendor 0x10de, class 0x03xxxx) on the PCI bus.
gpus_on_pci=0
for d in "$pci"/*; do
  [ -r "$d/vendor" ] && [ -r "$d/class" ] || continue
  if [ "$(cat "$d/vendor")" = 0x10de ] && [[ "$(cat "$d/class")" == 0x03* ]]; then
    gpus_on_pci=$((gpus_on_pci + 1))
  fi
done

if ! command -v "$smi" >/dev/null 2>&1; then
  if [ "$gpus_on_pci" -eq 0 ] && [ ! -e "$driver" ]; then
    echo "gpu-node: SKIPPED: no NVIDIA driver (no nvidia-smi, no NVIDIA GPU on the PCI bus)"
    exit 0
  fi
  echo "gpu-node: FAIL ($gpus_on_pci NVIDIA GPU(s) on the PCI bus, but no nvidia-smi: install the driver's utilities)"
  exit 1
fi
if ! out=$("$smi" -L 2>&1); then
  echo "$out" >&2
  echo "gpu-node: FAIL (nvidia-smi -L failed: the driver does not answer)"
  exit 1
fi
command -v python3 >/dev/null || { echo "gpu-node: FAIL (python3 is needed)"; exit 1; }

bin=${SYSSCOPE_BIN:-$top/target/release/sysscope}
if [ ! -x "$bin" ]; then
  echo "gpu-node: building $bin (cargo build --release)" >&2
  (cd "$top" && cargo build --release --locked -p sysscope --bin sysscope >&2) \
    || { echo "gpu-node: FAIL (cannot build the release binary)"; exit 1; }
fi
exec python3 "$top/scripts/checks/gpu_node.py" --sysscope "$bin" --nvidia-smi "$smi"
