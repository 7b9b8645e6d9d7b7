#!/usr/bin/env python3
"""Fleet sizing: series and scrape bytes per node for N pods of M processes, measured.

Run through bench/fleet.sh. For each size, N Kubernetes-like pods (a container cgroup each under
kubepods/besteffort, named by a fake API server's pod list through the pod watch) each run M
processes with distinct names, and every process makes the same mix of calls: reads and writes
of a file, a pipe and a socket (so the read/write families split by fd_kind and fs), opens,
stats, mmaps, epoll waits, small file writes, a sleep and getppid calls, besides what any
process does to start. Several exporters run side by side during the whole run (each label
control setting needs its own configuration), and each is scraped twice: as Prometheus text
(classic histograms) and as the protobuf exposition (native histograms). Counted are only the
series of the benchmark's pods (their cgroups, or their namespace where the cgroup label is
dropped, and the catch-all "other" series the budget folds them into); the rest of the node is
reported beside them. Bytes are the uncompressed size of those series in each format: their
sample lines in the text, their Metric messages in the protobuf body.

Configurations: the defaults (their budgets: limits.max_series = 30,000 classic series,
limits.max_syscall_entries = 16,384 kernel entries); the same with the limits raised to hold the
node ("sized"), which shows the demand itself; and each label-control setting, sized.

Standard library only (the protobuf body is walked with a minimal wire-format reader: a length-
delimited stream of MetricFamily messages, and their Metric fields).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import http.server
import json
import os
import platform
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import benchlib
from benchlib import Exporter

SCHEMA = "sysscope-bench-fleet/1"
NAMESPACE = "sysscope-fleet"
PROTOBUF = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"
SIZES = [(10, 5), (50, 10), (110, 20)]
# Calls the marker makes per process: the run waits until every process made them.
MARKER_CALLS = 7

BASE = '[collection]\nmin_interval = "0s"\n[kubernetes]\npod_watch = "on"\nnode_name = "sysscope-fleet-node"\n'
SIZED = "[limits]\nmax_series = 10000000\nmax_syscall_entries = 262144\n"
CONFIGS = {
    "defaults": BASE,
    "sized": BASE + SIZED,
    "cgroup unless pod known": BASE + SIZED + '[labels]\ncgroup = "unless_pod_known"\n',
    "comm off": BASE + SIZED + "[labels]\ncomm = false\n",
    "families read,write,sync,net": BASE + SIZED + '[labels]\nsyscall_families = ["read", "write", "sync", "net"]\n',
    "all three": BASE + SIZED + '[labels]\ncgroup = "unless_pod_known"\ncomm = false\nsyscall_families = ["read", "write", "sync", "net"]\n',
}


def log(msg: str) -> None:
    benchlib.log(msg, "fleet")


# ---------------------------------------------------------------------------------------------
# The pods, as a fake API server lists them.

class Pods:
    def __init__(self) -> None:
        self.items: list[dict] = []
        self.lock = threading.Lock()

    def add(self, name: str, uid: str, cid: str) -> None:
        with self.lock:
            self.items.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid, "resourceVersion": "1"},
                "spec": {"nodeName": "sysscope-fleet-node", "containers": [{"name": "app"}]},
                "status": {"containerStatuses": [{
                    "name": "app", "containerID": f"containerd://{cid}", "image": "img",
                    "imageID": "", "ready": True, "restartCount": 0}]},
            })

    def body(self) -> bytes:
        with self.lock:
            return json.dumps({"apiVersion": "v1", "kind": "PodList",
                               "metadata": {"resourceVersion": "1"}, "items": self.items}).encode()


def fake_api(pods: Pods) -> tuple[socketserver.ThreadingMixIn, int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if "watch=true" in self.path:
                # Open without events until the exporter goes: the pods are listed before
                # the exporters start.
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                self.rfile.read(1)
                return
            body = pods.body()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


# ---------------------------------------------------------------------------------------------
# Cgroups and processes.

def cgroup2_root() -> Path:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            if parts[sep + 1] == "cgroup2":
                return Path(parts[4])
    raise SystemExit("no cgroup v2 mount")


class Node:
    """N pods of M processes under kubepods/besteffort (below a unique parent if this machine
    has a kubepods cgroup of its own)."""

    def __init__(self, root: Path, workload: Path, pods: Pods, data: Path, scratch: Path) -> None:
        self.root, self.workload, self.pods = root, workload, pods
        self.data, self.scratch = data, scratch
        top = "kubepods"
        if (root / top).exists():
            top = f"sysscope-fleet-{os.getpid()}/kubepods"
        self.base = root / top / "besteffort"
        self.base.mkdir(parents=True, exist_ok=True)
        self.rel_prefix = "/" + str(self.base.relative_to(root)).split("/besteffort")[0]
        self.dirs: list[Path] = []
        self.containers: list[Path] = []
        self.procs: list[subprocess.Popen] = []
        # Every process waits on one pipe: closing its write end lets them all go.
        self.hold_r, self.hold_w = os.pipe()

    def make_pods(self, n_pods: int) -> None:
        """The pods' cgroups, listed by the API before any exporter starts."""
        for p in range(n_pods):
            uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
            pod_dir = self.base / f"pod{uid}"
            cdir = pod_dir / cid
            cdir.mkdir(parents=True)
            self.dirs += [cdir, pod_dir]
            self.containers.append(cdir)
            self.pods.add(f"app-{p}", uid, cid)

    def start(self, n_procs: int) -> None:
        mix = ["fd-kinds", str(self.data), "3", "3", "3",
               "open-close", str(self.data), "3", "stat", str(self.data), "3",
               "mmap", "2", "4", "epoll-wait", "2", "1",
               "small-writes", str(self.scratch), "3", "64", "sleep", "1", "1",
               "getppid", str(MARKER_CALLS), "wait-stdin"]
        for cdir in self.containers:
            for j in range(n_procs):
                self.procs.append(subprocess.Popen(
                    [str(self.workload), "join-cgroup", str(cdir), "set-name", f"worker-{j}"] + mix,
                    stdin=self.hold_r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        os.close(self.hold_w)
        os.close(self.hold_r)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        self.dirs.clear()
        for d in (self.base, self.base.parent):
            try:
                d.rmdir()
            except OSError:
                pass
        if "sysscope-fleet-" in str(self.base):
            try:
                self.base.parent.parent.rmdir()
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# Exporters and scrapes.

def text_labels(line: str) -> dict[str, str]:
    """The labels of a sample line of the text format (values unescaped enough to match)."""
    out: dict[str, str] = {}
    start = line.find("{")
    if start < 0:
        return out
    i = start + 1
    while i < len(line) and line[i] != "}":
        eq = line.index("=", i)
        key = line[i:eq].strip(", ")
        j = eq + 2
        value = []
        while line[j] != '"':
            if line[j] == "\\":
                j += 1
            value.append(line[j])
            j += 1
        out[key] = "".join(value)
        i = j + 1
        if i < len(line) and line[i] == ",":
            i += 1
    return out


class Scope:
    """Which series are the benchmark's: its cgroups, its namespace, and the folded ones."""

    def __init__(self, rel_prefix: str) -> None:
        self.rel_prefix = rel_prefix

    def mine_line(self, raw: bytes) -> bool:
        """[`mine`] on a sample line of the text, by its bytes (fast on millions of lines)."""
        if b'cgroup="' in raw:
            return (b'cgroup="' + self.rel_prefix.encode() + b"/") in raw or b'cgroup="other"' in raw
        return f'namespace="{NAMESPACE}"'.encode() in raw

    def mine(self, labels: dict[str, str]) -> bool:
        cg = labels.get("cgroup")
        if cg is not None:
            return cg.startswith(self.rel_prefix + "/") or cg == "other"
        return labels.get("namespace") == NAMESPACE


def text_series(body: bytes, scope: Scope) -> dict:
    mine = rest = mine_bytes = 0
    lines = []
    families: dict[str, int] = {}
    for raw in body.splitlines():
        if not raw or raw.startswith(b"#"):
            continue
        if scope.mine_line(raw):
            mine += 1
            mine_bytes += len(raw) + 1
            lines.append(raw)
            name = raw.split(b"{", 1)[0].split(b" ", 1)[0].decode()
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith("_seconds" + suffix):
                    name = name[: -len(suffix)]
            families[name] = families.get(name, 0) + 1
        else:
            rest += 1
    return {"series": mine, "bytes": mine_bytes,
            "gzip_bytes": len(gzip.compress(b"\n".join(lines), 6)), "rest_of_node": rest,
            "by_family": families}


def varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def fields(buf: bytes):
    """(field number, wire type, value or bytes, start, end) of each field of a message."""
    i = 0
    while i < len(buf):
        start = i
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield num, wire, v, start, i


def protobuf_series(body: bytes, scope: Scope) -> dict:
    """Metric messages (one series each) of a MetricFamily stream, and their encoded bytes."""
    mine = rest = mine_bytes = 0
    families: dict[str, int] = {}
    i = 0
    while i < len(body):
        n, i = varint(body, i)
        family, i = body[i:i + n], i + n
        name = ""
        for num, _, metric, start, end in fields(family):
            if num == 1:
                name = metric.decode()
            if num != 4:
                continue
            labels = {}
            for lnum, _, pair, _, _ in fields(metric):
                if lnum == 1:
                    kv = {f: v.decode() for f, _, v, _, _ in fields(pair)}
                    labels[kv.get(1, "")] = kv.get(2, "")
            if scope.mine(labels):
                mine += 1
                mine_bytes += end - start
                families[name] = families.get(name, 0) + 1
            else:
                rest += 1
    return {"series": mine, "bytes": mine_bytes, "rest_of_node": rest, "by_family": families}


def marker_calls(body: bytes, scope: Scope) -> float:
    total = 0.0
    for raw in body.splitlines():
        if raw.startswith(b"sysscope_syscalls_total{"):
            line = raw.decode()
            labels = text_labels(line)
            if labels.get("syscall") == "getppid" and scope.mine(labels):
                total += float(line.rsplit(" ", 1)[1])
    return total


# ---------------------------------------------------------------------------------------------

def measure(bin_dir: Path, tmp: Path, n_pods: int, n_procs: int, configs: dict[str, str],
            settle: float) -> list[dict]:
    pods = Pods()
    server, port = fake_api(pods)
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fleet\n  cluster:\n"
        f"    server: http://127.0.0.1:{port}\ncontexts:\n- name: fleet\n  context:\n"
        "    cluster: fleet\n    user: fleet\ncurrent-context: fleet\nusers:\n- name: fleet\n"
        "  user:\n    token: fleet\n")
    data = tmp / "data"
    data.write_bytes(b"x" * 64)
    node = Node(cgroup2_root(), bin_dir / "sysscope-workload", pods, data, tmp / "scratch")
    scope = Scope(node.rel_prefix)
    exporters = []
    try:
        node.make_pods(n_pods)
        for name, config in configs.items():
            exporters.append(Exporter(bin_dir, config, tmp, name=name, env={"KUBECONFIG": str(kubeconfig)},
                                      log_level="error", ready_s=120))
        log(f"{n_pods} pods x {n_procs} processes: {len(exporters)} exporters ready, starting the processes")
        node.start(n_procs)
        want = n_pods * n_procs * MARKER_CALLS
        sized = next(e for e in exporters if e.name == "sized")
        deadline = time.time() + 600
        while marker_calls(sized.scrape("text/plain"), scope) < want:
            if time.time() > deadline:
                raise SystemExit("the processes did not all make their calls in 10 minutes")
            time.sleep(2)
        # The rest of the node's processes make their calls meanwhile.
        time.sleep(settle)
        rows = []
        for e in exporters:
            text = e.scrape("text/plain")
            pb = e.scrape(PROTOBUF)
            classic = text_series(text, scope)
            native = protobuf_series(pb, scope)
            folded = sum(1 for raw in text.splitlines()
                         if raw.startswith(b"sysscope_dropped_series_total") and not raw.endswith(b" 0"))
            rows.append({"pods": n_pods, "processes_per_pod": n_procs, "config": e.name,
                         "classic": classic, "native": native,
                         "native_fewer_series": round(classic["series"] / max(native["series"], 1), 2),
                         "budget_folded_families": folded,
                         "node_text_bytes": len(text), "node_protobuf_bytes": len(pb)})
            log(f"  {e.name}: classic {classic['series']} series {classic['bytes']} B, "
                f"native {native['series']} series {native['bytes']} B")
        return rows
    finally:
        node.stop()
        for e in exporters:
            e.stop()
        server.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--sizes", default=",".join(f"{n}x{m}" for n, m in SIZES),
                    help="pods x processes, comma-separated (default: 10x5,50x10,110x20; 0x0 measures "
                         "this node as it is)")
    ap.add_argument("--smoke", action="store_true", help="2 pods of 2 processes, two configurations")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds to wait before scraping, for the rest of the node's calls (0x0: 60)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/fleet: needs root", file=sys.stderr)
        return 2
    bin_dir = Path(args.bin_dir)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    configs = CONFIGS
    if args.smoke:
        sizes = [(2, 2)]
        configs = {k: CONFIGS[k] for k in ("sized", "comm off")}
    tmp = Path(tempfile.mkdtemp(prefix="sysscope-fleet-"))
    started = dt.datetime.now(dt.timezone.utc)
    rows = []
    for n, m in sizes:
        settle = args.settle or (60.0 if n == 0 else 0.0)
        rows += measure(bin_dir, tmp, n, m, configs, settle)

    print()
    print(f"sysscope fleet sizing  {started:%Y-%m-%dT%H:%M:%SZ}  kernel {platform.release()}  "
          f"{os.cpu_count()} CPUs")
    hdr = (f"{'pods x procs':>12}  {'configuration':<30} {'classic series':>14} {'native series':>13} "
           f"{'ratio':>6} {'text bytes':>11} {'protobuf bytes':>14} {'x 1,000 nodes (native)':>23}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['pods']:>5} x {r['processes_per_pod']:<4}  {r['config']:<30} {r['classic']['series']:>14,} "
              f"{r['native']['series']:>13,} {r['native_fewer_series']:>6} {r['classic']['bytes']:>11,} "
              f"{r['native']['bytes']:>14,} {r['native']['series'] * 1000:>23,}")
    print()
    print("the rest of the node (its own processes, sysscope's self-metrics and CPU series), "
          "measured beside each size with the defaults:")
    for r in rows:
        if r["config"] == "defaults":
            c, n = r["classic"]["rest_of_node"], r["native"]["rest_of_node"]
            print(f"  {r['pods']:>5} x {r['processes_per_pod']:<4}  classic {c:,} series, native {n:,} "
                  f"series ({c / max(n, 1):.2f}x); whole body {r['node_text_bytes']:,} B text, "
                  f"{r['node_protobuf_bytes']:,} B protobuf")
    print()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fleet-{started:%Y%m%dT%H%M%SZ}{'-smoke' if args.smoke else ''}.json"
    path.write_text(json.dumps({
        "schema": SCHEMA, "started_at": f"{started:%Y-%m-%dT%H:%M:%SZ}",
        "revision": os.environ.get("SYSSCOPE_REVISION", ""),
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(), "load": list(os.getloadavg())},
        "rows": rows,
    }, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
