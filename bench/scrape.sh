#!/usr/bin/env bash
# Scrape latency, response size and exporter memory with 10,000 and 100,000 live series, and
# exporter CPU at 100,000 syscalls/s with a scrape every 15 s (see docs/performance.md).
# Needs root.
#
#   bench/scrape.sh --quick          about 2 minutes
#   bench/scrape.sh                  more scrapes, 60 s CPU periods
#   bench/scrape.sh --smoke          checks the machinery only (debug build)
#
# Other options go to bench/scrape.py (--series, --out). Writes JSON to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_setup "$@"
python3 bench/scrape.py --bin-dir "$bin_dir" "$@"
