"""What the bench drivers share: their log line, a process's CPU time, and an exporter that runs
for the length of one measurement.

Standard library only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def log(msg: str, tag: str = "bench") -> None:
    print(f"[{tag}] {msg}", file=sys.stderr, flush=True)


def proc_cpu_ns(pid: int) -> int:
    """CPU time (ns) all threads of `pid` have used, from schedstat (ns resolution)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


class Exporter:
    """sysscope with `config` on a free loopback port, ready when constructed; `stop()` ends it.
    `name` names its config file (in `tmp`) and its failures."""

    def __init__(self, bin_dir: Path, config: str, tmp: Path, name: str = "sysscope",
                 env: dict[str, str] | None = None, log_level: str = "warn",
                 ready_s: float = 60) -> None:
        self.name = name
        cfg = tmp / f"{name.replace(' ', '-').replace(',', '-')}.toml"
        cfg.write_text(config)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [str(bin_dir / "sysscope"), f"--web.listen-address=127.0.0.1:{self.port}",
             f"--config.file={cfg}", f"--log.level={log_level}"],
            stdout=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
        deadline = time.time() + ready_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited during start-up ({self.proc.returncode})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"{name} not ready after {ready_s:g} s")

    def scrape(self, accept: str | None = None, timeout: float = 600) -> bytes:
        headers = {"Accept": accept} if accept else {}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/metrics", headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()

    def timed_scrape(self) -> tuple[float, bytes]:
        """The scrape's latency as its client sees it, and its body."""
        t = time.monotonic()
        body = self.scrape()
        return time.monotonic() - t, body

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
