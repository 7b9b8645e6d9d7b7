#!/usr/bin/env bash
# Fleet sizing: series and scrape bytes per node for N pods x M processes, classic and native
# histograms, at the defaults and with each label-control setting (see docs/metrics.md, "Fleet
# sizing"). Needs root. Series counts and bytes do not depend on the machine's load.
#
#   bench/fleet.sh                     10x5, 50x10 and 110x20 (a few minutes)
#   bench/fleet.sh --sizes 10x5        one size
#   bench/fleet.sh --smoke             checks the machinery only (debug build, 2 pods of 2)
#
# Prints the table; writes JSON to bench/results/.
# SYSSCOPE_BENCH_BIN_DIR=DIR uses already-built binaries instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_setup "$@"
python3 bench/fleet.py --bin-dir "$bin_dir" "$@"
