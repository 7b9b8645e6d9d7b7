#!/usr/bin/env bash
# Checks deploy/prometheus/sysscope-rules.yml: `promtool check rules`, `promtool test rules` on
# sysscope-rules_test.yml, and that every alert has a severity, a summary, a description and a
# runbook_url whose anchor exists in docs/alerts.md, and is unit-tested both firing and not firing.
# Prints one result line (VERBOSE=1 also prints promtool's output); exits non-zero on failure.
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rules="$top/deploy/prometheus/sysscope-rules.yml"
tests="$top/deploy/prometheus/sysscope-rules_test.yml"
promtool=${PROMTOOL:-$(command -v promtool || true)}
if [ -z "$promtool" ]; then
  echo "prometheus-rules: FAIL (promtool not found; install the Debian package 'prometheus')"
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() {
  cat "$log" >&2
  echo "prometheus-rules: FAIL ($1)"
  exit 1
}

"$promtool" check rules "$rules" >"$log" 2>&1 || fail "promtool check rules"
rule_count=$(grep -o 'SUCCESS: [0-9]* rules' "$log" | grep -o '[0-9]*')
(cd "$(dirname "$tests")" && "$promtool" test rules "$(basename "$tests")") >>"$log" 2>&1 \
  || fail "promtool test rules"

python3 - "$rules" "$tests" "$top/docs/alerts.md" >>"$log" 2>&1 <<'PY' || fail "alert metadata"
import re, sys
try:
    import yaml
except ImportError:
    sys.exit("PyYAML is needed for the alert metadata check (pip install pyyaml, or apt-get install python3-yaml)")
rules_path, tests_path, doc_path = sys.argv[1:]
rules = yaml.safe_load(open(rules_path))
tests = yaml.safe_load(open(tests_path))
doc = open(doc_path).read()
anchors = set()
for m in re.finditer(r"^#+\s+(.+?)\s*$", doc, re.M):
    a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
    anchors.add(a)
firing, quiet = set(), set()
for t in tests["tests"]:
    for case in t.get("alert_rule_test", []) or []:
        (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
problems = []
alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
for r in alerts:
    name = r["alert"]
    if r.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
        problems.append(f"{name}: labels.severity must be critical, warning or info")
    ann = r.get("annotations", {})
    for key in ("summary", "description", "runbook_url"):
        if not ann.get(key):
            problems.append(f"{name}: missing annotation {key}")
    url = ann.get("runbook_url", "")
    m = re.search(r"docs/alerts\.md#([\w-]+)$", url)
    if not m:
        problems.append(f"{name}: runbook_url must point at docs/alerts.md#<anchor>, got {url!r}")
    elif m.group(1) not in anchors:
        problems.append(f"{name}: runbook anchor #{m.group(1)} has no heading in docs/alerts.md")
    if name not in firing:
        problems.append(f"{name}: no unit test where it fires")
    if name not in quiet:
        problems.append(f"{name}: no unit test where it does not fire")
for p in problems:
    print(p)
if problems:
    sys.exit(1)
print(f"{len(alerts)} alerts have metadata, runbooks and firing/not-firing tests")
PY

[ "${VERBOSE:-0}" = 1 ] && cat "$log"
alerts=$(grep -c '^      - alert:' "$rules")
echo "prometheus-rules: PASS ($rule_count rules incl. $alerts alerts valid; promtool unit tests pass; every alert has severity, runbook and firing/not-firing tests)"
