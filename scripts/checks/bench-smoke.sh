#!/usr/bin/env bash
# Smoke check of the benchmarks in bench/: runs the overhead benchmark's --quick --smoke mode
# (1 round of 0.2 s cells over every configuration and workload), the scrape benchmark's and the
# fleet sizing's --smoke modes on the debug build, then checks that each printed a well-formed
# table and wrote well-formed JSON. Timing is never checked here: costs are measured, not asserted.
# Needs root (the benchmarks load eBPF programs); skipped without it unless CI=true.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" -ne 0 ]; then
  if [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
    echo "bench-smoke: needs root, and CI=true forbids skipping" >&2
    exit 1
  fi
  echo "SKIPPED bench-smoke: needs root"
  exit 0
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Build first (debug, as the tests do), so the time limits below cover the benchmarks only.
export PATH="$HOME/.cargo/bin:$PATH"
. bench/common.sh
bench_bins "$out" 1 2>"$out/build.err" || {
  echo "bench-smoke: build failed:" >&2
  tail -n 20 "$out/build.err" >&2
  exit 1
}
export SYSSCOPE_BENCH_BIN_DIR=$bin_dir

timeout 60 bench/overhead.sh --quick --smoke --out "$out" >"$out/overhead.txt" 2>"$out/overhead.err" || {
  echo "bench-smoke: bench/overhead.sh failed:" >&2
  tail -n 20 "$out/overhead.err" "$out/overhead.txt" >&2
  exit 1
}
timeout 60 bench/scrape.sh --smoke --out "$out" >"$out/scrape.txt" 2>"$out/scrape.err" || {
  echo "bench-smoke: bench/scrape.sh failed:" >&2
  tail -n 20 "$out/scrape.err" "$out/scrape.txt" >&2
  exit 1
}

timeout 60 bench/fleet.sh --smoke --out "$out" >"$out/fleet.txt" 2>"$out/fleet.err" || {
  echo "bench-smoke: bench/fleet.sh failed:" >&2
  tail -n 20 "$out/fleet.err" "$out/fleet.txt" >&2
  exit 1
}

python3 - "$out" <<'PY'
import glob, json, re, sys
out = sys.argv[1]
problems = []

def one(pattern):
    files = glob.glob(f"{out}/{pattern}")
    if len(files) != 1:
        problems.append(f"expected one {pattern}, found {files}")
        return None
    return json.load(open(files[0]))

text = open(f"{out}/overhead.txt").read()
for needle in ("ns/syscall", "target", "results:"):
    if needle not in text:
        problems.append(f"overhead table lacks {needle!r}")
doc = one("overhead-*-smoke.json")
if doc:
    if doc.get("schema") != "sysscope-bench-overhead/1":
        problems.append(f"overhead schema {doc.get('schema')!r}")
    rows = doc.get("results", [])
    configs = {r["config"] for r in rows}
    for cfg in ("none", "empty", "empty-sched", "sysscope"):
        if cfg not in configs:
            problems.append(f"overhead results lack configuration {cfg}")
    for r in rows:
        v = r.get("cpu_ns_per_syscall")
        if not isinstance(v, (int, float)) or v <= 0:
            problems.append(f"bad cost in {r}")
        # The table prints every row.
        if not re.search(rf"^{r['workload']}\s+{r['threads']}\s+{re.escape(r['config'])}\s", text, re.M):
            problems.append(f"row {r['workload']}/{r['threads']}/{r['config']} missing from the table")
    if not all({"target", "value", "goal", "met"} <= set(t) for t in doc.get("targets", [])):
        problems.append("overhead targets malformed")

text = open(f"{out}/scrape.txt").read()
for needle in ("scrape ms", "exporter CPU", "results:"):
    if needle not in text:
        problems.append(f"scrape table lacks {needle!r}")
doc = one("scrape-*-smoke.json")
if doc:
    if doc.get("schema") != "sysscope-bench-scrape/1":
        problems.append(f"scrape schema {doc.get('schema')!r}")
    for r in doc.get("series", []):
        if r.get("samples_in_response", 0) < r.get("series_requested", 0):
            problems.append(f"fewer samples than series: {r}")
    if not doc.get("cpu"):
        problems.append("scrape results lack the CPU measurement")

text = open(f"{out}/fleet.txt").read()
for needle in ("classic series", "native series", "results:"):
    if needle not in text:
        problems.append(f"fleet table lacks {needle!r}")
doc = one("fleet-*-smoke.json")
if doc:
    if doc.get("schema") != "sysscope-bench-fleet/1":
        problems.append(f"fleet schema {doc.get('schema')!r}")
    for r in doc.get("rows", []):
        # Every process makes calls: its series are there, fewer in the native form.
        if not 0 < r["native"]["series"] < r["classic"]["series"]:
            problems.append(f"fleet series: {r}")

if problems:
    print("bench-smoke: " + "\n  ".join(problems), file=sys.stderr)
    sys.exit(1)
print("bench-smoke: tables and JSON well-formed")
PY
