#!/usr/bin/env bash
# Lints the Grafana dashboards (no Grafana server needed): datasource variable on every panel, a
# unit on every panel, $__rate_interval in every rate/irate/increase, heatmaps with
# calculate: false, and every query valid PromQL (checked with promtool after substituting the
# template variables). Prints one result line (VERBOSE=1 also prints what was checked); exits
# non-zero on failure.
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if ! python3 "$top/scripts/checks/lint_dashboards.py" "$@" >"$log" 2>&1; then
  grep -v '^FAIL' "$log" >&2
  echo "dashboards: $(grep '^FAIL' "$log" || echo 'FAIL (lint_dashboards.py crashed)')"
  exit 1
fi
[ "${VERBOSE:-0}" = 1 ] && grep -v '^OK' "$log"
echo "dashboards: PASS ($(grep '^OK' "$log" | sed 's/^OK: //'))"
