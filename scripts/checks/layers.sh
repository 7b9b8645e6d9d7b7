#!/usr/bin/env bash
# Checks the exporter's layering (docs/architecture.md, "Layers"): no import cycle between
# files, no layer importing a higher one, every file assigned a layer. Prints one result line
# (VERBOSE=1 also prints the problems on success); exits non-zero on failure.
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if ! python3 "$top/scripts/checks/layers.py" "$top/exporter/src" >"$log" 2>&1; then
  grep -v '^FAIL' "$log" >&2
  echo "layers: $(grep '^FAIL' "$log" || echo 'FAIL (layers.py crashed)')"
  exit 1
fi
[ "${VERBOSE:-0}" = 1 ] && grep -v '^OK' "$log"
echo "layers: PASS ($(grep '^OK' "$log" | sed 's/^OK: //'))"
