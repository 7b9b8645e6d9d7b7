#!/usr/bin/env python3
"""sysscope against nvidia-smi on a GPU machine: the comparison behind gpu-node.sh.

  gpu_node.py --sysscope BIN --nvidia-smi CMD     compare (what gpu-node.sh runs)
  gpu_node.py --load DEVICE MIB SECONDS           the GPU load itself (run by the above)

The load uses only the CUDA driver API, from libcuda.so.1 (which the driver installs; no CUDA
toolkit): it allocates MIB MiB of device memory, writes it once, and launches a PTX kernel that
spins on the SM clock for SPIN_MS at a time, back to back, for SECONDS. One kernel always
running makes NVML's utilisation ~100% on that GPU and for that process.

What is compared, as the medians of a few samples of both sides taken at the same moments,
and why the tolerances are what they are: both sides read NVML, but at different instants, and
NVML's utilisation and power are themselves averages over the driver's sample period (1/6 s
to 1 s depending on the product; power over 1 s on recent drivers):
  device utilisation     sysscope_gpu_utilization_ratio   --query-gpu utilization.gpu   +-10 points
  device memory used     sysscope_gpu_memory_used_bytes   --query-gpu memory.used       +-max(4 MiB, 1%)
  device power           sysscope_gpu_power_watts         --query-gpu power.draw        +-max(10 W, 10%)
  process memory         sysscope_gpu_process_memory_used_bytes{pid}  --query-compute-apps used_memory  +-2 MiB
  process SM             sysscope_gpu_process_sm_utilization_ratio{pid}  pmon sm          +-15 points
  process cgroup         the cgroup label of the load's GPU series   exact, against the cgroup the load was
                         started in, or where this user cannot make one, the cgroup label of the
                         load's own syscall series (sysscope runs with labels.pid = true for that);
                         never against /proc/<pid>/cgroup, the file sysscope itself reads
Memory needs no window (an allocation is a number), but nvidia-smi prints MiB, rounded.
Power a board does not report to either side is "n/a"; anything else missing on one side
fails. Run it on a GPU that is not in MIG mode (GPU_NODE_DEVICE): NVML reports no utilisation
in MIG mode, so the utilisation rows would fail. GPU_NODE_DEVICE numbers GPUs as nvidia-smi does
(the load runs with CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's own default order is fastest first).
"""

import argparse
import ctypes
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

PTX = b"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry spin(.param .u64 cycles)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [cycles];
    mov.u64 %rd2, %clock64;
$L_spin:
    mov.u64 %rd3, %clock64;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $L_spin;
    ret;
}
\0"""

SPIN_MS = 100
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz


def load(device, mib, seconds):
    """The GPU load: prints "ready" once its memory is allocated and its first kernel ran."""
    # CUDA numbers devices fastest first unless told otherwise; nvidia-smi (and NVML) by PCI
    # bus id. Read by cuInit.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        sys.exit(f"gpu load: cannot load libcuda.so.1, the CUDA driver library the NVIDIA driver installs: {e}")

    def check(r, what):
        if r != 0:
            name = ctypes.c_char_p()
            cuda.cuGetErrorName(r, ctypes.byref(name))
            sys.exit(f"gpu load: {what}: CUDA error {r} ({(name.value or b'?').decode()})")

    c_void_pp = ctypes.POINTER(ctypes.c_void_p)
    cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, c_void_pp, c_void_pp]
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
    cuda.cuCtxCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
    cuda.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    cuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]

    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev.value), "cuCtxCreate")
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), mib << 20), f"cuMemAlloc of {mib} MiB")
    check(cuda.cuMemsetD8_v2(ptr.value, 0x5A, mib << 20), "cuMemsetD8")
    module = ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), PTX), "cuModuleLoadData (PTX)")
    fn = ctypes.c_void_p()
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), module, b"spin"), "cuModuleGetFunction")
    khz = ctypes.c_int()
    check(cuda.cuDeviceGetAttribute(ctypes.byref(khz), CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev.value),
          "cuDeviceGetAttribute(CLOCK_RATE)")
    cycles = ctypes.c_uint64(khz.value * SPIN_MS)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(cycles), ctypes.c_void_p))
    end = time.monotonic() + seconds
    first = True
    while time.monotonic() < end:
        check(cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None), "cuLaunchKernel")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        if first:
            print("ready", flush=True)
            first = False


def cgroup2_root():
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup2":
            return fields[4]
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.status, r.read().decode()


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABEL.findall(m.group(3) or "")}
            out.append((m.group(1), labels, float(m.group(4))))
    return out


def pick(samples, name, **want):
    return [v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in want.items())]


def labels_of(samples, name, **want):
    return [l for n, l, v in samples if n == name and all(l.get(k) == w for k, w in want.items())]


def smi_csv(smi, query, fields):
    out = subprocess.run(shlex.split(smi) + [f"--query-{query}={','.join(fields)}",
                                              "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"nvidia-smi --query-{query}: {out.stderr.strip()}")
    return [dict(zip(fields, (c.strip() for c in line.split(",")))) for line in out.stdout.splitlines() if line.strip()]


def smi_pmon(smi):
    """Rows of `nvidia-smi pmon -c 1 -s um`, by the header's column names."""
    out = subprocess.run(shlex.split(smi) + ["pmon", "-c", "1", "-s", "um"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"nvidia-smi pmon: {out.stderr.strip()}")
    header, rows = None, []
    for line in out.stdout.splitlines():
        if line.startswith("#"):
            if header is None:
                header = line.lstrip("#").split()
            continue
        if header and line.strip():
            rows.append(dict(zip(header, line.split())))
    return rows


def number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def start_sysscope(binary, nvml_library, probes_off, workdir):
    port = free_port()
    args = [binary, f"--web.listen-address=127.0.0.1:{port}"]
    # A pid label on the syscall series: the load's own cgroup, as sysscope's probes see it.
    config = "[labels]\npid = true\n"
    if nvml_library:
        config += f'[gpu]\nnvml_library = "{nvml_library}"\n'
    if probes_off:
        config += "[syscalls]\nenabled = false\n[block_io]\nenabled = false\n[slow_calls]\nenabled = false\n"
    path = os.path.join(workdir, f"sysscope-{port}.toml")
    with open(path, "w") as f:
        f.write(config)
    args.append(f"--config.file={path}")
    log = open(os.path.join(workdir, f"sysscope-{port}.log"), "w+")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            return None, port, log.read()
        try:
            if http_get(port, "/-/ready")[0] == 200:
                return proc, port, ""
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    log.seek(0)
    return None, port, "not ready after 60 s\n" + log.read()


def compare(args):
    env = os.environ
    seconds = int(env.get("GPU_NODE_SECONDS", "60"))
    mib = int(env.get("GPU_NODE_MIB", "1024"))
    device = int(env.get("GPU_NODE_DEVICE", "0"))
    rounds = int(env.get("GPU_NODE_ROUNDS", "5"))
    interval = float(env.get("GPU_NODE_INTERVAL", "2"))
    warmup = float(env.get("GPU_NODE_WARMUP", "5"))
    nvml_library = env.get("GPU_NODE_NVML_LIBRARY", "")
    smi = args.nvidia_smi
    work = tempfile.mkdtemp(prefix="gpu-node-")
    notes = []

    # The load, in a cgroup of its own when this user may make one (GPU_NODE_OWN_CGROUP=0, a
    # seam for the test suite, acts as if it may not).
    root = cgroup2_root()
    cg_rel = None
    if root and env.get("GPU_NODE_OWN_CGROUP", "1") != "0":
        cg_rel = f"/sysscope-gpu-node-{os.getpid()}"
        try:
            os.mkdir(root + cg_rel)
        except OSError as e:
            notes.append(f"no cgroup of its own for the load ({e.strerror}): "
                         "its GPU series' cgroup is checked against its syscall series'")
            cg_rel = None
    elif root:
        notes.append("no cgroup of its own for the load: its GPU series' cgroup is checked against its syscall series'")
    procs_file = root + cg_rel + "/cgroup.procs" if cg_rel else None

    def join():
        if procs_file:
            with open(procs_file, "w") as f:
                f.write("0\n")

    load_cmd = shlex.split(env["GPU_NODE_LOAD"]) if env.get("GPU_NODE_LOAD") else \
        [sys.executable, os.path.abspath(__file__), "--load", str(device), str(mib), str(seconds)]
    loader = subprocess.Popen(load_cmd, stdout=subprocess.PIPE, text=True, preexec_fn=join)
    sysscope = None
    try:
        line = loader.stdout.readline()
        if line.strip() != "ready":
            loader.wait(timeout=30)
            return fail(f"the GPU load did not start (exit {loader.returncode}): {line.strip()}")

        sysscope, port, why = start_sysscope(args.sysscope, nvml_library, False, work)
        if sysscope is None:
            if re.search(r"BPF|capabilit|Operation not permitted|permission", why, re.I):
                notes.append("the probes could not load here (BPF refused): sysscope runs with them off")
                sysscope, port, why = start_sysscope(args.sysscope, nvml_library, True, work)
            if sysscope is None:
                return fail(f"sysscope did not start:\n{why}")

        time.sleep(warmup)
        taken = []
        for i in range(rounds):
            if i:
                time.sleep(interval)
            status, text = http_get(port, "/metrics")
            taken.append({
                "sysscope": parse_metrics(text),
                "gpus": smi_csv(smi, "gpu", ["index", "uuid", "name", "driver_version", "utilization.gpu",
                                             "memory.used", "power.draw"]),
                "apps": smi_csv(smi, "compute-apps", ["gpu_uuid", "pid", "used_memory"]),
                "pmon": smi_pmon(smi),
            })
        if loader.poll() is not None:
            return fail(f"the GPU load ended (exit {loader.returncode}) before the samples were taken; "
                        "raise GPU_NODE_SECONDS")
    finally:
        for p in (sysscope, loader):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        if cg_rel:
            try:
                os.rmdir(root + cg_rel)
            except OSError:
                pass

    pid = str(loader.pid)
    uuids = {a["gpu_uuid"] for t in taken for a in t["apps"] if a["pid"] == pid}
    if len(uuids) != 1:
        return fail(f"nvidia-smi --query-compute-apps does not list the load (pid {pid}) on one GPU: {sorted(uuids)}")
    uuid = uuids.pop()
    gpu = next(g for g in taken[-1]["gpus"] if g["uuid"] == uuid)
    s_up = [pick(t["sysscope"], "sysscope_collector_up", collector="gpu") for t in taken]

    def side(values):
        return median([v[0] if v else None for v in values])

    rows = []

    def row(what, ours, theirs, tolerance, unit, optional=False):
        if ours is None and theirs is None and optional:
            # Not reported by this board, to either side (e.g. power on some products).
            rows.append((what, "-", "-", "-", "n/a"))
            return
        ok = ours is not None and theirs is not None and abs(ours - theirs) <= tolerance
        rows.append((what, fmt(ours, unit), fmt(theirs, unit), f"+-{tolerance:.3g} {unit}",
                     "PASS" if ok else "FAIL"))

    dev_util = side([pick(t["sysscope"], "sysscope_gpu_utilization_ratio", uuid=uuid) for t in taken])
    smi_util = median([number(g["utilization.gpu"]) for t in taken for g in t["gpus"] if g["uuid"] == uuid])
    row("device utilisation", dev_util * 100 if dev_util is not None else None, smi_util, 10, "%")
    dev_mem = side([pick(t["sysscope"], "sysscope_gpu_memory_used_bytes", uuid=uuid) for t in taken])
    smi_mem = median([number(g["memory.used"]) for t in taken for g in t["gpus"] if g["uuid"] == uuid])
    row("device memory used", dev_mem / 2**20 if dev_mem is not None else None, smi_mem,
        max(4, 0.01 * (smi_mem or 0)), "MiB")
    dev_pwr = side([pick(t["sysscope"], "sysscope_gpu_power_watts", uuid=uuid) for t in taken])
    smi_pwr = median([number(g["power.draw"]) for t in taken for g in t["gpus"] if g["uuid"] == uuid])
    row("device power", dev_pwr, smi_pwr, max(10, 0.1 * (smi_pwr or 0)), "W", optional=True)
    p_mem = side([pick(t["sysscope"], "sysscope_gpu_process_memory_used_bytes", uuid=uuid, pid=pid) for t in taken])
    smi_p_mem = median([number(a["used_memory"]) for t in taken for a in t["apps"] if a["pid"] == pid])
    row("process memory", p_mem / 2**20 if p_mem is not None else None, smi_p_mem, 2, "MiB")
    p_sm = side([pick(t["sysscope"], "sysscope_gpu_process_sm_utilization_ratio", uuid=uuid, pid=pid) for t in taken])
    pmon_sm = median([number(r.get("sm")) for t in taken for r in t["pmon"] if r.get("pid") == pid])
    row("process SM utilisation", p_sm * 100 if p_sm is not None else None, pmon_sm, 15, "%")
    def cgroups_of(name):
        found = {l.get("cgroup") for t in taken for l in labels_of(t["sysscope"], name, pid=pid)}
        return ",".join(sorted(c for c in found if c)) or None

    got = cgroups_of("sysscope_gpu_process_memory_used_bytes")
    # Ground truth the check controls, else what sysscope's probes saw the load's syscalls in
    # (they name the cgroup by its kernel id, not from /proc/<pid>/cgroup).
    expected, source = cg_rel, "its cgroup"
    if not cg_rel:
        expected, source = cgroups_of("sysscope_syscalls_total"), "its syscalls'"
    if expected is None:
        notes.append("the load's cgroup cannot be checked: no cgroup of its own and no syscall series")
        rows.append(("process cgroup", got or "-", "-", "-", "n/a"))
    else:
        rows.append(("process cgroup", got or "-", expected, f"= {source}",
                     "PASS" if got == expected else "FAIL"))
    if not env.get("GPU_NODE_LOAD"):
        rows.append(("load's own memory", fmt(p_mem / 2**20 if p_mem else None, "MiB"), f">= {mib} MiB", "-",
                     "PASS" if p_mem and p_mem >= mib * 2**20 else "FAIL"))
    rows.append(("gpu collector up", fmt(side(s_up), ""), "1", "exact", "PASS" if side(s_up) == 1 else "FAIL"))

    build = labels_of(taken[-1]["sysscope"], "sysscope_build_info")
    print(f"GPU {gpu['index']}: {gpu['name']} ({uuid}), driver {gpu['driver_version']}; "
          f"sysscope {build[0].get('version', '?') if build else '?'}; load pid {pid}, "
          f"{rounds} samples {interval:g} s apart")
    for n in notes:
        print(f"note: {n}")
    widths = [max(len(str(r[i])) for r in rows + [HEADER]) for i in range(5)]
    for r in [HEADER] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    failed = [r[0] for r in rows if r[4] == "FAIL"]
    if failed:
        print(f"gpu-node: FAIL (sysscope and nvidia-smi disagree: {', '.join(failed)})")
        return 1
    agreed = sum(r[4] == "PASS" for r in rows)
    print(f"gpu-node: PASS ({agreed} comparisons agree)")
    return 0


HEADER = ("what", "sysscope", "nvidia-smi", "tolerance", "verdict")


def fmt(v, unit):
    if v is None:
        return "-"
    return f"{v:.1f} {unit}".strip() if isinstance(v, float) else f"{v} {unit}".strip()


def fail(why):
    print(f"gpu-node: FAIL ({why})")
    return 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sysscope")
    ap.add_argument("--nvidia-smi", default="nvidia-smi")
    ap.add_argument("--load", nargs=3, type=int, metavar=("DEVICE", "MIB", "SECONDS"))
    args = ap.parse_args()
    if args.load:
        load(*args.load)
        return 0
    if not args.sysscope:
        ap.error("--sysscope is required")
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
