#!/usr/bin/env python3
"""Side-by-side per-syscall overhead of sysscope, the empty-program floor and other tracers.

Run through bench/overhead.sh (which builds the binaries and prepares the machine). Each round
starts every configuration in turn (rotating the order from round to round), runs every workload
cell under it, and stops it; the table reports medians over rounds. Costs are CPU time per
syscall: the workload threads' CPU time plus the CPU time the tracer's own processes used in the
same window, divided by the syscalls made. Time spent waiting for a CPU that other processes hold
does not count, so the figures hold on a busy machine; wall-clock figures are kept in the JSON.

Standard library only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from benchlib import log, proc_cpu_ns

SCHEMA = "sysscope-bench-overhead/1"

# sysscope's syscall programs, as the `probes` configurations attach them.
PROBE_PROGRAMS = ["sched_process_exit", "cgroup_attach_task", "sys_exit", "sys_enter"]

# Programs that run once per syscall (raw_syscalls sys_enter / sys_exit) when attached.
SYSCALL_PROGRAMS = {"sys_enter", "sys_exit", "empty_sys_enter", "empty_sys_exit"}

BPFTRACE_SCRIPT = r"""
tracepoint:raw_syscalls:sys_enter { @start[tid] = nsecs; }
tracepoint:raw_syscalls:sys_exit /@start[tid]/ {
  @calls[pid, args->id] = count();
  @latency_ns[pid, args->id] = hist(nsecs - @start[tid]);
  delete(@start[tid]);
}
"""

SYSSCOPE_SYSCALLS_ONLY = """\
# The syscall collector alone: no slow-call sampling, no other collector.
[slow_calls]
enabled = false
[block_io]
enabled = false
[cpu]
enabled = false
[gpu]
enabled = false
[kubernetes]
pod_watch = "off"
"""

SYSSCOPE_DEFAULT = """\
# sysscope's defaults: every collector the build has, slow-call check included.
[kubernetes]
pod_watch = "off"
"""


# ---------------------------------------------------------------------------------------------
# Process and kernel accounting


def tree_pids(root: int) -> list[int]:
    """`root` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def bpf_programs() -> list[dict]:
    """Every loaded eBPF program as bpftool describes it (run_time_ns/run_cnt with stats on)."""
    try:
        out = subprocess.run(
            ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, timeout=30
        ).stdout
        return json.loads(out or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def raw_syscall_links() -> dict[int, str]:
    """prog id -> tracepoint of every raw-tracepoint link on sys_enter/sys_exit."""
    try:
        out = subprocess.run(
            ["bpftool", "-j", "link", "show"], capture_output=True, text=True, timeout=30
        ).stdout
        links = json.loads(out or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    return {
        l["prog_id"]: l.get("tp_name", "")
        for l in links
        if l.get("type") == "raw_tracepoint" and l.get("tp_name") in ("sys_enter", "sys_exit")
    }


def foreign_syscall_programs(own_pids: set[int]) -> list[dict]:
    """Programs attached to the syscall tracepoints that this benchmark did not start: they add
    their cost to every configuration, the baseline included."""
    links = raw_syscall_links()
    if not links:
        return []
    owners = program_owners()
    own = {f"[{p}]" for p in own_pids}
    out = []
    for p in bpf_programs():
        if p.get("id") not in links:
            continue
        who = owners.get(p["id"], [])
        if any(w.endswith(o) for w in who for o in own):
            continue
        out.append(
            {
                "id": p["id"],
                "name": p.get("name", ""),
                "tracepoint": links[p["id"]],
                "owners": who,
                "ns_per_run": (
                    round(p["run_time_ns"] / p["run_cnt"], 1) if p.get("run_cnt") else None
                ),
            }
        )
    return out


def prog_ids_of(pid: int) -> set[int]:
    """Ids of the eBPF programs process `pid` holds open (from its fdinfo)."""
    ids = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return ids
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.add(int(line.split()[1]))
        except (OSError, ValueError, IndexError):
            pass
    return ids


def program_owners() -> dict[int, list[str]]:
    """prog id -> "comm[pid]" of every process holding it."""
    owners: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        ids = prog_ids_of(int(entry))
        if not ids:
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            comm = "?"
        for i in ids:
            owners.setdefault(i, []).append(f"{comm}[{entry}]")
    return owners


def programs_of(pids: set[int]) -> dict[int, dict]:
    """Programs held by any of `pids`: id -> {name, run_time_ns, run_cnt}."""
    ids = set()
    for pid in pids:
        ids |= prog_ids_of(pid)
    out = {}
    if not ids:
        return out
    for p in bpf_programs():
        if p.get("id") in ids:
            out[p["id"]] = {
                "name": p.get("name", ""),
                "run_time_ns": p.get("run_time_ns", 0),
                "run_cnt": p.get("run_cnt", 0),
            }
    return out


def bpf_ns_per_syscall(before: dict[int, dict], after: dict[int, dict], calls: int) -> Optional[float]:
    """Kernel-measured run time per syscall of the per-syscall programs (those that ran at least
    as often as the workload made calls), from BPF run-time statistics."""
    total, found = 0.0, False
    for pid, a in after.items():
        b = before.get(pid)
        if not b:
            continue
        runs = a["run_cnt"] - b["run_cnt"]
        rt = a["run_time_ns"] - b["run_time_ns"]
        if runs >= 0.9 * calls and runs > 0:
            if rt <= 0:
                return None  # statistics are off
            total += rt / runs
            found = True
    return round(total, 1) if found else None


STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


def set_bpf_stats(on: bool) -> None:
    """kernel.bpf_stats_enabled: run-time statistics for every program (sysscope turns them on
    through BPF_ENABLE_STATS while it runs; other holders of that keep them on regardless)."""
    try:
        STATS_SYSCTL.write_text("1\n" if on else "0\n")
    except OSError as e:
        log(f"cannot set {STATS_SYSCTL}: {e}")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------------------------
# Configurations


class Unavailable(Exception):
    pass


@dataclass
class Running:
    """A started configuration: how to wrap a workload command, whose CPU to add, how to stop."""

    name: str
    wrap: Callable[[list[str]], list[str]] = lambda cmd: cmd
    tracer_pid: Optional[int] = None
    wrapper: bool = False
    stop: Callable[[], None] = lambda: None
    extra: dict = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.bin = Path(args.bin_dir)
        self.workload = str(self.bin / "sysscope-workload")
        self.tmp = Path(tempfile.mkdtemp(prefix="sysscope-bench-"))
        self.read_file = self.tmp / "read-heavy.dat"
        with open(self.read_file, "wb") as f:
            f.write(os.urandom(4 << 20))
        with open(self.read_file, "rb") as f:  # into the page cache
            while f.read(1 << 20):
                pass
        # The same file 8 directories deeper (a hard link): what a slow call's path walk
        # meets on a dataset's shard more than on a file at the top of /tmp.
        deep = self.tmp.joinpath("data", "team", "datasets", "imagenet", "train", "shards", "n01440764", "part")
        deep.mkdir(parents=True)
        self.deep_file = deep / "read-heavy.dat"
        os.link(self.read_file, self.deep_file)
        self.own_pids: set[int] = {os.getpid()}

    # -- configurations ------------------------------------------------------------------------

    def start(self, name: str) -> Running:
        if name == "none":
            return Running(name)
        if name in ("empty", "empty+stats"):
            return self.start_attach(name, ["empty_sys_enter", "empty_sys_exit"])
        if name in ("empty-sched", "empty-sched+stats"):
            # The floor of the time split: empty programs on the syscall tracepoints and on
            # the scheduler hooks the split stamps (per context switch, what any design pays).
            return self.start_attach(
                name, ["empty_sys_enter", "empty_sys_exit", "empty_sched_switch", "empty_sched_wakeup"]
            )
        if name in ("clock", "clock+stats"):
            # The exact-duration floor: the clock read at entry and exit, nothing else.
            return self.start_attach(name, ["clock_sys_enter", "clock_sys_exit"])
        if name.startswith("attach:"):
            # attach:PROG+PROG...[@OBJECT]: chosen programs of the object, or of another build
            # of it (compares probe variants).
            # A trailing "+stats" turns run-time statistics on, as for the other rows.
            # A trailing "+nosplit" loads the probes with syscalls.time_by_state off.
            spec, _, obj = (
                name.split(":", 1)[1].removesuffix("+stats").removesuffix("+nosplit").partition("@")
            )
            return self.start_attach(name, spec.split("+"), obj or None)
        if name in ("probes", "probes+stats"):
            return self.start_attach(name, PROBE_PROGRAMS)
        if name.removesuffix("+stats") in ("slow-reads", "slow-reads-nopath"):
            # The same programs with every read a slow call (no rate limit), its record drained
            # by a thread: what a slow call costs the probes, the file's path walked in the
            # kernel or (nopath) its identity read without the walk.
            extra = ["--slow", "read"] + (["--no-paths"] if "nopath" in name else [])
            return self.start_attach(name, PROBE_PROGRAMS, extra=extra)
        if name == "sysscope-syscalls":
            return self.start_exporter(name, SYSSCOPE_SYSCALLS_ONLY)
        if name == "sysscope":
            return self.start_exporter(name, SYSSCOPE_DEFAULT)
        if name == "sysscope-nofd":
            # The defaults with reads and writes not split by descriptor: what the split costs.
            return self.start_exporter(name, SYSSCOPE_DEFAULT + "[syscalls]\ndescriptor_kinds = false\n")
        if name == "sysscope-nosplit":
            # The defaults with the time split off: what the split costs per context switch.
            return self.start_exporter(name, SYSSCOPE_DEFAULT + "[syscalls]\ntime_by_state = false\n")
        if name == "sysscope+stats":
            return self.start_exporter(name, SYSSCOPE_DEFAULT + "[collection]\nprobe_stats = \"always\"\n")
        if name == "bpftrace":
            return self.start_bpftrace()
        if name == "perf-trace":
            if not shutil.which("perf"):
                raise Unavailable("perf is not installed")
            out = str(self.tmp / "perf-trace.txt")
            return Running(name, wrap=lambda cmd: ["perf", "trace", "-s", "-o", out, "--"] + cmd, wrapper=True)
        if name == "strace":
            if not shutil.which("strace"):
                raise Unavailable("strace is not installed")
            out = str(self.tmp / "strace.txt")
            return Running(name, wrap=lambda cmd: ["strace", "-c", "-f", "-o", out, "--"] + cmd, wrapper=True)
        raise SystemExit(f"unknown configuration {name!r}")

    def _spawn(self, cmd: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(cmd, **kw)
        self.own_pids.add(p.pid)
        return p

    def _stopper(self, p: subprocess.Popen, sig=signal.SIGTERM) -> Callable[[], None]:
        def stop() -> None:
            if p.poll() is None:
                p.send_signal(sig)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            for stream in (p.stdin, p.stdout):
                if stream:
                    stream.close()
            self.own_pids.discard(p.pid)

        return stop

    def start_attach(self, name: str, programs: list[str], obj: Optional[str] = None,
                     extra: Optional[list[str]] = None) -> Running:
        cmd = [str(self.bin / "sysscope-bench"), "attach"] + (extra or [])
        if name.removesuffix("+stats").endswith("+nosplit"):
            cmd += ["--time-by-state", "off"]
        if name.endswith("+stats"):
            cmd += ["--stats", "always"]
        if obj or self.args.object:
            cmd += ["--object", obj or self.args.object]
        p = self._spawn(cmd + programs, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline().strip()
        if line != "attached":
            self._stopper(p)()
            raise Unavailable(f"sysscope-bench attach failed ({line or 'no output'})")
        return Running(name, tracer_pid=p.pid, stop=self._stopper(p))

    def start_exporter(self, name: str, config: str) -> Running:
        cfg = self.tmp / f"{name}.toml"
        cfg.write_text(config)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = self._spawn(
            [str(self.bin / "sysscope"), f"--web.listen-address=127.0.0.1:{port}",
             f"--config.file={cfg}", "--log.level=warn"],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            if p.poll() is not None:
                raise Unavailable(f"sysscope exited during start-up ({p.returncode})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            self._stopper(p)()
            raise Unavailable("sysscope not ready after 60 s")
        # sysscope samples the kernel's run-time statistics for its first second, then for 1 s
        # every 30 s: let the first window pass so cells measure the steady state (the sampling
        # itself is measured by the +stats rows and docs/performance.md).
        time.sleep(1.5)
        return Running(name, tracer_pid=p.pid, stop=self._stopper(p), extra={"port": port})

    def start_bpftrace(self) -> Running:
        if not shutil.which("bpftrace"):
            raise Unavailable("bpftrace is not installed")
        script = self.tmp / "equivalent.bt"
        script.write_text(BPFTRACE_SCRIPT)
        p = self._spawn(["bpftrace", str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            if p.poll() is not None:
                err = p.stderr.read().strip().splitlines()
                raise Unavailable(f"bpftrace failed: {err[-1] if err else p.returncode}")
            progs = programs_of({p.pid})
            if len(progs) >= 2:
                time.sleep(0.3)  # the second attachment completes after the load
                break
            time.sleep(0.2)
        else:
            self._stopper(p, signal.SIGINT)()
            raise Unavailable("bpftrace did not attach within 60 s")
        return Running("bpftrace", tracer_pid=p.pid, stop=self._stopper(p, signal.SIGINT))

    # -- one measurement -----------------------------------------------------------------------

    def workload_cmd(self, workload: str, threads: int, secs: float) -> list[str]:
        s = f"{secs:g}"
        if workload == "getppid":
            step = ["loop-getppid", s, str(threads)]
        elif workload == "dd":
            step = ["loop-dd", s, str(threads), "512"]
        elif workload == "pingpong-procs":
            # The same between two processes (a context switch changes the address space too).
            step = ["loop-pingpong-procs", s, str(threads)]
        elif workload == "pingpong":
            # Pairs of threads: every read blocks, so every call is switched out mid-call.
            step = ["loop-pingpong", s, str(threads)]
        elif workload == "read":
            step = ["loop-read-file", str(self.read_file), s, str(threads), "4096"]
        elif workload == "read-deep":
            step = ["loop-read-file", str(self.deep_file), s, str(threads), "4096"]
        else:
            raise SystemExit(f"unknown workload {workload!r}")
        # wait-stdin: the tracer's own start-up stays outside the measured window.
        return [self.workload, "wait-stdin"] + step

    def measure(self, run: Running, workload: str, threads: int) -> dict:
        cmd = run.wrap(self.workload_cmd(workload, threads, self.args.seconds))
        tracer_pids = {run.tracer_pid} if run.tracer_pid else set()
        progs_before = programs_of(tracer_pids) if tracer_pids else {}
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        if run.wrapper:
            # The wrapper (strace, perf) is the child; the workload is its descendant. Wait until
            # the workload blocks reading stdin, so the wrapper's start-up is not counted.
            self._wait_workload_blocked(p.pid)
            tracer_pids = {p.pid}
        def tracer_cpu() -> int:
            total = 0
            for t in tracer_pids:
                for q in tree_pids(t) if run.wrapper else [t]:
                    if run.wrapper and q != t and self._is_workload(q):
                        continue
                    total += proc_cpu_ns(q)
            return total
        cpu0 = tracer_cpu()
        t0 = time.monotonic()
        p.stdin.write("go\n")
        p.stdin.flush()
        line = p.stdout.readline()
        cpu1 = tracer_cpu()
        wall = time.monotonic() - t0
        rest, err = p.communicate(timeout=120)
        m = re.search(r"calls=(\d+) ns_per_call=([\d.]+) threads=\d+ cpu_ns_per_call=([\d.]+)", line)
        if not m:
            raise RuntimeError(f"{' '.join(cmd)}: no result line (got {line!r}; stderr {err[-300:]!r})")
        calls = int(m.group(1))
        progs_after = programs_of({run.tracer_pid}) if run.tracer_pid else {}
        tracer_ns = max(cpu1 - cpu0, 0)
        cell = {
            "calls": calls,
            "wall_ns": float(m.group(2)),
            "workload_cpu_ns": float(m.group(3)),
            "tracer_cpu_ns": round(tracer_ns / calls, 1),
            "cpu_ns": round(float(m.group(3)) + tracer_ns / calls, 1),
            "window_s": round(wall, 3),
        }
        bpf = bpf_ns_per_syscall(progs_before, progs_after, calls) if progs_before else None
        if bpf is not None:
            cell["bpf_ns"] = bpf
        return cell

    def _wait_workload_blocked(self, root: int) -> None:
        deadline = time.time() + 30
        while time.time() < deadline:
            for q in tree_pids(root):
                if q != root and self._is_workload(q):
                    try:
                        with open(f"/proc/{q}/stat") as f:
                            stat = f.read()
                        state = stat[stat.rindex(")") + 2]
                    except (OSError, ValueError, IndexError):
                        continue
                    if state == "S":
                        time.sleep(0.05)
                        return
            time.sleep(0.02)
        raise RuntimeError("the traced workload did not start within 30 s")

    def _is_workload(self, pid: int) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/exe").endswith("sysscope-workload")
        except OSError:
            return False

    def exporter_probe_metrics(self, run: Running) -> dict:
        """The exporter's own probe-cost metrics: ns per run per program."""
        port = run.extra.get("port")
        if not port:
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return {}
        secs, runs = {}, {}
        for line in text.splitlines():
            m = re.match(r'sysscope_probe_run_seconds_total\{program="([^"]+)"\} (\S+)', line)
            if m:
                secs[m.group(1)] = float(m.group(2))
            m = re.match(r'sysscope_probe_runs_total\{program="([^"]+)"\} (\S+)', line)
            if m:
                runs[m.group(1)] = float(m.group(2))
        return {k: {"run_seconds": secs[k], "runs": runs.get(k, 0)} for k in secs}

    def programs_by_name(self, run: Running) -> dict:
        out = {}
        if run.tracer_pid:
            for p in programs_of({run.tracer_pid}).values():
                out[p["name"]] = {"run_seconds": p["run_time_ns"] / 1e9, "runs": p["run_cnt"]}
        return out


# ---------------------------------------------------------------------------------------------
# Summaries


def median(xs: list[float]) -> Optional[float]:
    return round(statistics.median(xs), 1) if xs else None


def quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (0.0, 0.0)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def summarize(results: dict, configs: list[str], cells: list[tuple[str, int]]) -> list[dict]:
    """One row per (workload, threads, configuration). The added cost is the median over rounds
    of the difference to the same round's baseline, so a machine whose load drifts during the
    run biases no configuration."""
    rows = []
    for workload, threads in cells:
        base = {r["round"]: r for r in results.get(("none", workload, threads), [])}
        empty_added = None
        for cfg in configs:
            rs = results.get((cfg, workload, threads), [])
            if not rs:
                continue
            diffs = [r["cpu_ns"] - base[r["round"]]["cpu_ns"] for r in rs if r["round"] in base]
            losses = [(r["cpu_ns"] - base[r["round"]]["cpu_ns"]) / base[r["round"]]["cpu_ns"]
                      for r in rs if r["round"] in base and base[r["round"]]["cpu_ns"] > 0]
            wall_diffs = [r["wall_ns"] - base[r["round"]]["wall_ns"] for r in rs if r["round"] in base]
            added = median(diffs) if cfg != "none" else None
            q1, q3 = quartiles(diffs) if cfg != "none" and diffs else (None, None)
            if cfg == "empty":
                empty_added = added
            rows.append(
                {
                    "workload": workload,
                    "threads": threads,
                    "config": cfg,
                    "rounds": len(rs),
                    "cpu_ns_per_syscall": median([r["cpu_ns"] for r in rs]),
                    "cpu_ns_added": added,
                    "cpu_ns_added_iqr": [round(q1, 1), round(q3, 1)] if q1 is not None else None,
                    # Proportional loss: added over the same round's baseline, median over rounds.
                    "loss_ratio": round(statistics.median(losses), 4) if losses and cfg != "none" else None,
                    "wall_ns_per_syscall": median([r["wall_ns"] for r in rs]),
                    "wall_ns_added": median(wall_diffs) if cfg != "none" else None,
                    "bpf_ns_per_syscall": median([r["bpf_ns"] for r in rs if "bpf_ns" in r]),
                    "samples_cpu_ns": [r["cpu_ns"] for r in rs],
                }
            )
        for row in rows:
            if row["workload"] == workload and row["threads"] == threads:
                a, e = row["cpu_ns_added"], empty_added
                row["x_empty_added"] = round(a / e, 2) if a is not None and e and e > 0 else None
    return rows


def ratio(rows: list[dict], num_cfg: str, den_cfg: str, workload: str, threads: int) -> Optional[float]:
    get = {(r["config"], r["workload"], r["threads"]): r for r in rows}
    a = get.get((num_cfg, workload, threads))
    b = get.get((den_cfg, workload, threads))
    if not a or not b or a["cpu_ns_added"] is None or not b["cpu_ns_added"] or b["cpu_ns_added"] <= 0:
        return None
    return round(a["cpu_ns_added"] / b["cpu_ns_added"], 2)


def difference_ratio(rows: list[dict], num: tuple[str, str], den: tuple[str, str], workload: str,
                     threads: int) -> Optional[float]:
    """(num[0] added - num[1] added) / (den[0] added - den[1] added): the cost of one part of a
    configuration over the cost of the hooks it runs on."""
    get = {(r["config"], r["workload"], r["threads"]): r for r in rows}
    vals = [get.get((c, workload, threads)) for c in num + den]
    if any(v is None or v["cpu_ns_added"] is None for v in vals):
        return None
    a = vals[0]["cpu_ns_added"] - vals[1]["cpu_ns_added"]
    b = vals[2]["cpu_ns_added"] - vals[3]["cpu_ns_added"]
    return round(a / b, 2) if b > 0 else None


def scaling(rows: list[dict], cfg: str, workload: str) -> Optional[float]:
    """Proportional loss with 2 threads over the proportional loss with 1 thread."""
    get = {(r["config"], r["workload"], r["threads"]): r for r in rows}
    one, two = get.get((cfg, workload, 1)), get.get((cfg, workload, 2))
    if not one or not two or not one.get("loss_ratio") or two.get("loss_ratio") is None:
        return None
    if one["loss_ratio"] <= 0:
        return None
    return round(two["loss_ratio"] / one["loss_ratio"], 2)


def targets(rows: list[dict]) -> list[dict]:
    out = []

    def add(what, value, goal, ok):
        out.append({"target": what, "value": value, "goal": goal,
                    "met": None if value is None else ok(value)})

    for wl in ("getppid", "dd", "read"):
        add(f"sysscope added / clock floor added ({wl}, 1 thread)", ratio(rows, "sysscope", "clock", wl, 1),
            "<= 1.15", lambda v: v <= 1.15)
    for wl in ("getppid", "dd", "read"):
        add(f"sysscope added / empty added ({wl}, 1 thread)", ratio(rows, "sysscope", "empty", wl, 1),
            "<= 2", lambda v: v <= 2)
    # The time split per context switch: in a ping-pong every call blocks, so each call is
    # one switch out and one in; the floor is empty programs on the same scheduler hooks.
    # What the split itself adds (sysscope with it on, less sysscope with it off) over what
    # empty scheduler programs add beside empty syscall programs.
    for wl in ("pingpong", "pingpong-procs"):
        add(f"split added / empty sched hooks added ({wl}, 1 thread)",
            difference_ratio(rows, ("sysscope", "sysscope-nosplit"), ("empty-sched", "empty"), wl, 1),
            "<= 1.5", lambda v: v <= 1.5)
        out.append({"target": f"  reference: sysscope added / empty-sched added ({wl}, 1 thread)",
                    "value": ratio(rows, "sysscope", "empty-sched", wl, 1), "goal": "(no goal)", "met": None})
    add("bpftrace added / sysscope added (getppid, 1 thread)", ratio(rows, "bpftrace", "sysscope", "getppid", 1),
        ">= 5", lambda v: v >= 5)
    add("perf trace -s added / sysscope added (getppid, 1 thread)",
        ratio(rows, "perf-trace", "sysscope", "getppid", 1), ">= 30", lambda v: v >= 30)
    add("strace -c added / sysscope added (getppid, 1 thread)", ratio(rows, "strace", "sysscope", "getppid", 1),
        ">= 200", lambda v: v >= 200)
    # A slow call's cost: every read sampled, beside the same programs without (CPU of the
    # workload and of the thread draining the records), and the path walk alone (the
    # programs' run time per call, with or without the walk, when statistics were on).
    get = {(r["config"], r["workload"], r["threads"]): r for r in rows}
    for wl in ("read", "read-deep"):
        for stats in ("", "+stats"):
            for cfg, base, what, col in (
                ("slow-reads", "probes", "slow call with its path", "cpu_ns_added"),
                ("slow-reads-nopath", "probes", "slow call, identity only", "cpu_ns_added"),
                ("slow-reads", "slow-reads-nopath", "path walk alone", "cpu_ns_added"),
                ("slow-reads", "slow-reads-nopath", "path walk alone, bpf run time", "bpf_ns_per_syscall"),
            ):
                a, b = get.get((cfg + stats, wl, 1)), get.get((base + stats, wl, 1))
                if a and b and a.get(col) is not None and b.get(col) is not None:
                    out.append({"target": f"  ns per {what} ({wl}{stats}, 1 thread)",
                                "value": round(a[col] - b[col], 1), "goal": "(no goal)", "met": None})
    for wl in ("getppid", "dd", "read"):
        add(f"sysscope 2-thread loss / 1-thread loss ({wl})", scaling(rows, "sysscope", wl),
            "<= 1 (within 10% noise)", lambda v: v <= 1.10)
        # The same for the empty programs: what the machine itself does to 2 threads.
        out.append({"target": f"  reference: empty programs, 2-thread / 1-thread loss ({wl})",
                    "value": scaling(rows, "empty", wl), "goal": "(no goal)", "met": None})
    return out


def print_table(rows: list[dict], tgts: list[dict], meta: dict) -> None:
    print()
    print(f"sysscope overhead benchmark  {meta['started_at']}  kernel {meta['host']['kernel']}  "
          f"{meta['host']['cpus']} CPUs  load {meta['host']['load_before']} -> {meta['host']['load_after']}")
    print(f"rounds {meta['settings']['rounds']} x {meta['settings']['seconds']} s per cell; "
          "cost = CPU ns per syscall (workload + tracer), median over rounds; added = median over rounds "
          "of the difference to the same round's baseline (IQR: its quartiles); bpf ns = run time of the "
          "per-syscall programs per syscall, when the kernel's run-time statistics were on")
    if meta["foreign_programs"]:
        print(f"WARNING: {len(meta['foreign_programs'])} programs of other processes are attached to "
              "raw_syscalls and add to every row, the baseline too:")
        for p in meta["foreign_programs"]:
            print(f"  prog {p['id']} {p['name']} on {p['tracepoint']} ({', '.join(p['owners'])}) "
                  f"{p['ns_per_run']} ns/run")
    if meta.get("stats_forced_on"):
        print("WARNING: BPF run-time statistics were on for every configuration (another process holds "
              "BPF_ENABLE_STATS): each program run also paid for two clock reads, the floor included")
    hdr = (f"{'workload':<8} {'thr':>3} {'config':<18} {'ns/syscall':>10} {'added':>8} {'(IQR)':>15} "
           f"{'x empty':>7} {'wall ns':>9} {'bpf ns':>7}")
    print()
    print(hdr)
    print("-" * len(hdr))
    last = None
    for r in rows:
        key = (r["workload"], r["threads"])
        if last and key != last:
            print()
        last = key
        fmt = lambda v, spec: "-" if v is None else format(v, spec)
        added = "-" if r["cpu_ns_added"] is None else f"{r['cpu_ns_added']:+.1f}"
        iqr = "" if not r.get("cpu_ns_added_iqr") else "{:+.0f}..{:+.0f}".format(*r["cpu_ns_added_iqr"])
        print(f"{r['workload']:<8} {r['threads']:>3} {r['config']:<18} {fmt(r['cpu_ns_per_syscall'], '10.1f')} "
              f"{added:>8} {iqr:>15} {fmt(r.get('x_empty_added'), '7.2f')} {fmt(r['wall_ns_per_syscall'], '9.1f')} "
              f"{fmt(r['bpf_ns_per_syscall'], '7.1f')}")
    print()
    print(f"{'target':<58} {'value':>8}  {'goal':<24} met")
    for t in tgts:
        v = "-" if t["value"] is None else f"{t['value']:.2f}"
        met = ("n/a" if t["goal"] != "(no goal)" else "") if t["met"] is None else ("yes" if t["met"] else "NO")
        print(f"{t['target']:<58} {v:>8}  {t['goal']:<24} {met}")
    print()


# ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True, help="directory with sysscope, sysscope-bench, sysscope-workload")
    ap.add_argument("--quick", action="store_true", help="3 rounds of 0.5 s cells (about 2 minutes)")
    ap.add_argument("--smoke", action="store_true", help="1 round of 0.2 s cells: checks the machinery only")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seconds", type=float, help="length of one measured cell")
    ap.add_argument("--configs", help="comma-separated configurations (default: all): none, empty, empty-sched, clock, "
                    "empty+stats, probes, probes+stats, slow-reads, slow-reads-nopath (+stats: every read a "
                    "slow call), sysscope-syscalls, sysscope, sysscope-nofd, sysscope-nosplit, sysscope+stats, bpftrace, "
                    "perf-trace, strace, or attach:PROG+PROG...[@OBJECT][+nosplit][+stats] for chosen programs of "
                    "the object (or of another build of it; +nosplit: syscalls.time_by_state off)")
    ap.add_argument("--workloads", default="getppid,dd,read",
                    help="comma-separated: getppid, dd, read, read-deep (the read file 8 directories deeper), "
                    "pingpong, pingpong-procs (the same between two processes)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--object", help="another build of the probes object (compares probe variants)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--label", default="", help="free text stored in the JSON (e.g. the variant measured)")
    args = ap.parse_args()

    default_configs = ["none", "empty", "empty-sched", "clock", "sysscope-syscalls", "sysscope", "bpftrace", "perf-trace", "strace"]
    if args.smoke:
        args.rounds = args.rounds or 1
        args.seconds = args.seconds or 0.2
    elif args.quick:
        args.rounds = args.rounds or 3
        args.seconds = args.seconds or 0.5
    else:
        args.rounds = args.rounds or 7
        args.seconds = args.seconds or 2.0
        default_configs.insert(2, "empty+stats")
        default_configs.insert(3, "probes")
        default_configs.insert(6, "sysscope+stats")
    configs = args.configs.split(",") if args.configs else default_configs
    if "none" not in configs:
        configs.insert(0, "none")
    cells = [(w, int(t)) for w in args.workloads.split(",") for t in args.threads.split(",")]

    if os.geteuid() != 0:
        print("bench/overhead: needs root (loads eBPF programs)", file=sys.stderr)
        return 2

    bench = Bench(args)
    stats_before = STATS_SYSCTL.read_text().strip() if STATS_SYSCTL.exists() else "0"
    # Statistics off machine-wide, as on a node running sysscope with its defaults: each
    # configuration turns them on itself if it does (the +stats ones, sysscope's samples).
    set_bpf_stats(False)
    try:
        return run_rounds(args, bench, configs, cells)
    finally:
        set_bpf_stats(stats_before == "1")
        shutil.rmtree(bench.tmp, ignore_errors=True)


def run_rounds(args: argparse.Namespace, bench: Bench, configs: list[str], cells: list[tuple[str, int]]) -> int:
    started = dt.datetime.now(dt.timezone.utc)
    meta = {
        "schema": SCHEMA,
        "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "label": args.label,
        "revision": os.environ.get("SYSSCOPE_REVISION", ""),
        "host": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "load_before": load_average(),
        },
        "settings": {"rounds": args.rounds, "seconds": args.seconds, "configs": configs,
                     "cells": cells, "quick": args.quick, "smoke": args.smoke,
                     "object": args.object or "embedded"},
        "foreign_programs": foreign_syscall_programs(bench.own_pids),
        "unavailable": {},
        "probe_metrics": {},
    }
    if meta["foreign_programs"]:
        log(f"warning: {len(meta['foreign_programs'])} foreign programs on raw_syscalls (see the table)")

    results: dict[tuple, list] = {}
    for rnd in range(args.rounds):
        order = configs[rnd % len(configs):] + configs[: rnd % len(configs)]
        for cfg in order:
            if cfg in meta["unavailable"]:
                continue
            try:
                run = bench.start(cfg)
            except Unavailable as e:
                log(f"{cfg}: unavailable: {e}")
                meta["unavailable"][cfg] = str(e)
                continue
            try:
                before = bench.programs_by_name(run)
                for workload, threads in cells:
                    cell = bench.measure(run, workload, threads)
                    cell["round"] = rnd
                    results.setdefault((cfg, workload, threads), []).append(cell)
                    log(f"round {rnd + 1}/{args.rounds} {cfg:<18} {workload:<8} {threads}t "
                        f"{cell['cpu_ns']:9.1f} ns/syscall (wall {cell['wall_ns']:.1f})")
                if run.extra.get("port"):
                    meta["probe_metrics"].setdefault(cfg, []).append(
                        {"exporter": bench.exporter_probe_metrics(run), "bpftool": bench.programs_by_name(run),
                         "bpftool_at_start": before})
            finally:
                run.stop()
    meta["host"]["load_after"] = load_average()
    meta["foreign_programs_after"] = foreign_syscall_programs(bench.own_pids)
    rows = summarize(results, configs, cells)
    tgts = targets(rows)
    # The empty programs run without statistics unless another process keeps them on
    # (BPF_ENABLE_STATS or the sysctl): then every row pays for them, the floor included.
    meta["stats_forced_on"] = any(r["config"] == "empty" and r["bpf_ns_per_syscall"] for r in rows)
    print_table(rows, tgts, meta)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "smoke" if args.smoke else ("quick" if args.quick else "full")
    path = out_dir / f"overhead-{started.strftime('%Y%m%dT%H%M%SZ')}-{suffix}.json"
    doc = dict(meta, results=rows, targets=tgts,
               raw=[{"config": k[0], "workload": k[1], "threads": k[2], "samples": v} for k, v in results.items()])
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
