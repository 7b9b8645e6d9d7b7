#!/usr/bin/env bash
# Checks that no function in the exporter's library code (exporter/src outside bin/ and test
# modules) is over 120 lines and no file over 800 code lines; known offenders are listed in
# sizes.py and may only shrink. Prints one result line (VERBOSE=1 also lists the known ones);
# exits non-zero on failure.
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if ! python3 "$top/scripts/checks/sizes.py" "$top/exporter/src" >"$log" 2>&1; then
  grep -v '^FAIL' "$log" >&2
  echo "sizes: $(grep '^FAIL' "$log" || echo 'FAIL (sizes.py crashed)')"
  exit 1
fi
[ "${VERBOSE:-0}" = 1 ] && grep -v '^OK' "$log"
echo "sizes: PASS ($(grep '^OK' "$log" | sed 's/^OK: //'))"
