#!/usr/bin/env python3
"""The PrometheusRule of deploy/kubernetes/components/prometheus-rule, made from the rules file.

deploy/prometheus/sysscope-rules.yml is the one copy of sysscope's recording rules and alerts
(promtool tests it); the Prometheus Operator takes rules as a PrometheusRule object, whose
`spec` is that file's content. This script writes the object from the file, comments and all,
and checks that the committed one is exactly what it writes:

    python3 scripts/checks/prometheusrule.py          # check (run by scripts/checks/kubernetes.sh)
    python3 scripts/checks/prometheusrule.py --write  # regenerate after changing the rules

The check also loads both as YAML and compares the rule groups, so an object that differs
from the file in any rule fails even if the text check were fooled. Prints one line; exits 1
when they differ.
"""
import sys
from pathlib import Path

import yaml

TOP = Path(__file__).resolve().parents[2]
RULES = TOP / "deploy/prometheus/sysscope-rules.yml"
OBJECT = TOP / "deploy/kubernetes/components/prometheus-rule/prometheusrule.yaml"

HEADER = """\
# Generated from deploy/prometheus/sysscope-rules.yml by scripts/checks/prometheusrule.py
# --write: edit the rules file, not this one (the test command fails when they differ).
# The rules file's own comments follow, indented under spec; its PromQL lines are long.
# yamllint disable rule:line-length
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: sysscope
  namespace: sysscope
  labels:
    app.kubernetes.io/name: sysscope
spec:
"""


def render(rules_text: str) -> str:
    """The object: the header, then every line of the rules file two spaces deeper."""
    body = "".join(("  " + line) if line.strip() else "\n"
                   for line in rules_text.splitlines(keepends=True))
    return HEADER + body


def main(argv):
    rules_text = RULES.read_text()
    want = render(rules_text)
    if "--write" in argv:
        OBJECT.write_text(want)
        print(f"prometheusrule: wrote {OBJECT.relative_to(TOP)}")
        return 0
    if not OBJECT.exists():
        print(f"FAIL: {OBJECT.relative_to(TOP)} is missing; run {sys.argv[0]} --write")
        return 1
    have = OBJECT.read_text()
    groups = yaml.safe_load(rules_text)["groups"]
    obj = yaml.safe_load(have)
    if have != want or obj.get("spec", {}).get("groups") != groups:
        print(f"FAIL: {OBJECT.relative_to(TOP)} differs from {RULES.relative_to(TOP)}; "
              f"run {sys.argv[0]} --write")
        return 1
    rules = sum(len(g["rules"]) for g in groups)
    print(f"OK: the PrometheusRule holds the rules file's {len(groups)} groups, {rules} rules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
