#!/usr/bin/env python3
"""Scrape cost of sysscope with many live series, and its CPU use under a steady syscall load.

Run through bench/scrape.sh. For each series count, `sysscope-bench fill` writes synthetic
entries into the running exporter's SYSCALL_STATS map (this process's tgid, in fresh cgroups,
over every named syscall), enough for the requested number of exported series; every entry is
changed before each scrape, so each scrape does all the work a busy node causes. Measured: scrape
latency (client side, and sysscope_scrape_duration_seconds), response bytes and samples,
exporter resident memory, and how long reading the map takes with one lookup per key and in
batches (BPF_MAP_LOOKUP_BATCH). Then the exporter's CPU time over a period with a scrape every
15 s while a workload makes about 100,000 syscalls per second.

Standard library only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Exporter, log, proc_cpu_ns

SCHEMA = "sysscope-bench-scrape/1"
# Exported series per (workload, syscall) with the default log4 histogram: the counter, 13
# bucket bounds, +Inf, _sum and _count.
SERIES_PER_ENTRY = 17

CONFIG = """\
[collection]
min_interval = "0s"
[limits]
max_series = 1000000
max_syscall_entries = 65536
[kubernetes]
pod_watch = "off"
"""


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def samples_and_scrape_duration(body: bytes) -> tuple[int, float | None]:
    n, dur = 0, None
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        n += 1
        if line.startswith("sysscope_scrape_duration_seconds "):
            dur = float(line.split()[1])
    return n, dur


class Filler:
    def __init__(self, bin_dir: Path, pid: int, entries: int):
        self.proc = subprocess.Popen(
            [str(bin_dir / "sysscope-bench"), "fill", "--pid", str(pid), "--entries", str(entries)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            raise SystemExit(f"sysscope-bench fill failed: {line!r}")
        self.ready = line.strip()

    def ask(self, cmd: str) -> str:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure_series(bin_dir: Path, tmp: Path, series: int, scrapes: int) -> dict:
    exp = Exporter(bin_dir, CONFIG, tmp)
    try:
        body = exp.scrape()
        base_samples, _ = samples_and_scrape_duration(body)
        entries = math.ceil(series / SERIES_PER_ENTRY)
        filler = Filler(bin_dir, exp.proc.pid, entries)
        try:
            exp.scrape()  # first sight: labels resolved, series created
            lat, server, sizes, samples = [], [], [], 0
            for _ in range(scrapes):
                filler.ask("bump")
                t, body = exp.timed_scrape()
                lat.append(t)
                sizes.append(len(body))
                samples, _ = samples_and_scrape_duration(body)
                # The exposition reports the duration of the scrape before it.
                body2 = exp.scrape()
                server.append(samples_and_scrape_duration(body2)[1])
            reads = [json.loads(filler.ask("time-read")) for _ in range(3)]
            rss = rss_bytes(exp.proc.pid)
        finally:
            filler.stop()
    finally:
        exp.stop()
    return {
        "series_requested": series,
        "kernel_entries": entries,
        "samples_in_response": samples,
        "samples_without_fill": base_samples,
        "scrape_ms_median": round(statistics.median(lat) * 1e3, 1),
        "scrape_ms_max": round(max(lat) * 1e3, 1),
        "server_scrape_ms_median": round(statistics.median([s for s in server if s is not None]) * 1e3, 1)
        if any(s is not None for s in server) else None,
        "response_bytes": int(statistics.median(sizes)),
        "exporter_rss_mib": round(rss / 2**20, 1),
        "map_read_ms": round(statistics.median(r["read_ms"] for r in reads), 2),
        "scrapes": scrapes,
    }


def measure_cpu(bin_dir: Path, tmp: Path, seconds: float, series: int, rate: int) -> dict:
    config = CONFIG.replace('min_interval = "0s"', 'min_interval = "1s"')
    exp = Exporter(bin_dir, config, tmp)
    filler = None
    try:
        if series:
            filler = Filler(bin_dir, exp.proc.pid, math.ceil(series / SERIES_PER_ENTRY))
        load = subprocess.Popen([str(bin_dir / "sysscope-workload"), "rate-getppid", str(rate), f"{seconds:g}"],
                                stdout=subprocess.PIPE, text=True)
        c0, t0 = proc_cpu_ns(exp.proc.pid), time.monotonic()
        next_scrape = t0
        scrapes = 0
        while load.poll() is None:
            if time.monotonic() >= next_scrape:
                if filler:
                    filler.ask("bump")
                exp.scrape()
                scrapes += 1
                next_scrape += 15
            time.sleep(0.2)
        c1, t1 = proc_cpu_ns(exp.proc.pid), time.monotonic()
        out = load.stdout.read()
        calls = int(out.split("calls=")[1].split()[0]) if "calls=" in out else 0
        rss = rss_bytes(exp.proc.pid)
    finally:
        if filler:
            filler.stop()
        exp.stop()
    return {
        "seconds": round(t1 - t0, 1),
        "syscalls_per_second": round(calls / max(t1 - t0, 1e-9)),
        "synthetic_series": series,
        "scrapes": scrapes,
        "exporter_cpu_percent_of_a_core": round((c1 - c0) / 1e9 / (t1 - t0) * 100, 3),
        "exporter_rss_mib": round(rss / 2**20, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer scrapes and a 30 s CPU period")
    ap.add_argument("--smoke", action="store_true", help="small counts, checks the machinery only")
    ap.add_argument("--series", default="10000,100000")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/scrape: needs root", file=sys.stderr)
        return 2
    bin_dir = Path(args.bin_dir)
    series = [int(s) for s in args.series.split(",")]
    scrapes, cpu_seconds = 7, 60.0
    if args.quick:
        scrapes, cpu_seconds = 3, 30.0
    if args.smoke:
        series, scrapes, cpu_seconds = [1000], 1, 3.0
    tmp = Path(tempfile.mkdtemp(prefix="sysscope-scrape-"))
    started = dt.datetime.now(dt.timezone.utc)
    rows = []
    for n in series:
        log(f"{n} series ...")
        rows.append(measure_series(bin_dir, tmp, n, scrapes))
        log(json.dumps(rows[-1]))
    log(f"exporter CPU over {cpu_seconds:g} s at 100,000 syscalls/s, a scrape every 15 s ...")
    cpu = [measure_cpu(bin_dir, tmp, cpu_seconds, 0, 100_000),
           measure_cpu(bin_dir, tmp, cpu_seconds, min(series[0], 10_000), 100_000)]

    print()
    print(f"sysscope scrape benchmark  {started:%Y-%m-%dT%H:%M:%SZ}  kernel {platform.release()}  "
          f"{os.cpu_count()} CPUs  load {[round(x, 2) for x in os.getloadavg()]}")
    hdr = (f"{'series':>8} {'entries':>8} {'samples':>8} {'scrape ms':>10} {'(server)':>9} {'max ms':>7} "
           f"{'bytes':>10} {'RSS MiB':>8} {'map read ms':>12}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['series_requested']:>8} {r['kernel_entries']:>8} {r['samples_in_response']:>8} "
              f"{r['scrape_ms_median']:>10} {str(r['server_scrape_ms_median']):>9} {r['scrape_ms_max']:>7} "
              f"{r['response_bytes']:>10} {r['exporter_rss_mib']:>8} {r['map_read_ms']:>12}")
    print()
    for c in cpu:
        print(f"exporter CPU: {c['exporter_cpu_percent_of_a_core']:.3f}% of a core over {c['seconds']} s at "
              f"{c['syscalls_per_second']} syscalls/s, {c['scrapes']} scrapes (15 s apart), "
              f"{c['synthetic_series']} synthetic series, RSS {c['exporter_rss_mib']} MiB")

    targets = []
    by = {r["series_requested"]: r for r in rows}
    if 10_000 in by:
        targets.append({"target": "scrape of 10,000 series", "value": by[10_000]["scrape_ms_median"], "goal": "< 50 ms",
                        "met": by[10_000]["scrape_ms_median"] < 50})
        targets.append({"target": "RSS with 10,000 series", "value": by[10_000]["exporter_rss_mib"], "goal": "< 64 MiB",
                        "met": by[10_000]["exporter_rss_mib"] < 64})
    if 100_000 in by:
        targets.append({"target": "scrape of 100,000 series", "value": by[100_000]["scrape_ms_median"],
                        "goal": "< 500 ms", "met": by[100_000]["scrape_ms_median"] < 500})
    worst_cpu = max(c["exporter_cpu_percent_of_a_core"] for c in cpu)
    targets.append({"target": "exporter CPU at 100k syscalls/s, 15 s scrapes", "value": worst_cpu,
                    "goal": "< 1% of a core", "met": worst_cpu < 1})
    print()
    for t in targets:
        print(f"{t['target']:<48} {t['value']:>8}  {t['goal']:<16} {'yes' if t['met'] else 'NO'}")
    print()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "smoke" if args.smoke else ("quick" if args.quick else "full")
    path = out / f"scrape-{started:%Y%m%dT%H%M%SZ}-{suffix}.json"
    path.write_text(json.dumps({
        "schema": SCHEMA, "started_at": f"{started:%Y-%m-%dT%H:%M:%SZ}",
        "revision": os.environ.get("SYSSCOPE_REVISION", ""),
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(), "load": list(os.getloadavg())},
        "series": rows, "cpu": cpu, "targets": targets,
    }, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
