#!/usr/bin/env python3
"""Lints sysscope's Grafana dashboards without a Grafana server.

For every dashboard (default: grafana/dashboards/*.json) it checks that
  * the dashboard has a uid and a title, a `datasource` template variable of type datasource
    (prometheus), and the cluster/instance/node/namespace/pod/cgroup/comm variables as label_values()
    queries on that datasource;
  * the `cluster` variable is multi-value with an All option sending `.*` (which also matches
    series without a cluster label, so single-cluster setups need no label) selected by default,
    and every series selector of every query and variable filters on cluster=~"$cluster";
  * every panel, including the panels nested in collapsed rows, uses the datasource variable
    (text panels excepted), and so does every query;
  * every panel except text and row panels has a unit (fieldConfig.defaults.unit);
  * every rate(), irate() and increase() uses [$__rate_interval];
  * heatmap panels use calculate: false and queries of format "heatmap";
  * every query expression, and the series selector of every label_values() variable, is valid
    PromQL: template variables are substituted with concrete values and the expressions are run
    through `promtool check rules` as recording rules of a temporary rule file.
It prints what it checked and exits non-zero with a message naming the dashboard and panel of every
problem. `--list-queries` (and the other options of queries.py) prints the queries instead.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import queries  # noqa: E402  (the shared panel walk and variable substitution)

REQUIRED_VARIABLES = ("cluster", "instance", "node", "namespace", "pod", "cgroup", "comm")
CLUSTER_MATCHER = 'cluster=~"$cluster"'
# Metric names as they would appear bare, without a {...} selector that could filter them.
BARE_METRIC = re.compile(r'(?<![\w:"])(sysscope_\w+|up|DCGM_\w+|[a-z_]+:[\w:]+)(?![\w:]*\s*[{(])')
DATASOURCE_REFS = {"${datasource}", "$datasource", "[[datasource]]"}
NO_QUERY_PANELS = {"text", "row"}
RATE_FUNCS = re.compile(r"\b(rate|irate|increase)\s*\(")

# Concrete values used to expand template variables before validation: realistic ones, so that
# escaping of regex metacharacters (cgroup paths contain dots) is exercised too.
SAMPLE_VALUES = {
    "cluster": ["eu-west-1"],
    "job": ["sysscope"],
    "node": ["node-1"],
    "instance": ["10.0.0.1:9812"],
    "namespace": ["ml"],
    "pod": ["train-0"],
    "cgroup": ["/kubepods.slice/kubepods-pod1.slice/cri-containerd-0123abcd.scope", "/"],
    "comm": ["python3"],
    "syscall": ["read", "pread64"],
    "device": ["nvme0n1"],
    "__rate_interval": ["1m"],
}


def ds_ref_ok(ds) -> bool:
    if isinstance(ds, str):
        return ds in DATASOURCE_REFS
    if isinstance(ds, dict):
        return ds.get("uid") in DATASOURCE_REFS
    return False


def rate_ranges(expr: str):
    """For each rate/irate/increase call: (function, [range strings found at the call's own depth])."""
    out = []
    for m in RATE_FUNCS.finditer(expr):
        i = m.end()
        depth = 1
        ranges = []
        quote = None
        while i < len(expr) and depth:
            ch = expr[i]
            if quote:
                if ch == "\\":
                    i += 1
                elif ch == quote:
                    quote = None
            elif ch in "\"'`":
                quote = ch
            elif ch in "({":
                depth += 1
            elif ch in ")}":
                depth -= 1
            elif ch == "[" and depth == 1:
                j = expr.index("]", i)
                ranges.append(expr[i + 1:j].strip())
                i = j
            i += 1
        out.append((m.group(1), ranges))
    return out


def without_strings(expr: str) -> str:
    """The expression with the contents of its string literals blanked out."""
    return re.sub(r'"(?:[^"\\]|\\.)*"|'"'(?:[^'\\\\]|\\\\.)*'", '""', expr)


def unfiltered_selectors(expr: str) -> list[str]:
    """The series selectors of a PromQL expression that do not filter on the cluster variable:
    every {...} block without cluster=~"$cluster", and every metric name used bare."""
    out = []
    for m in re.finditer(r'([\w:]*)\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}', expr):
        if CLUSTER_MATCHER not in m.group(2):
            out.append(m.group(0))
    bare = without_strings(re.sub(r'\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}', "{}", expr))
    # Label lists of by/without/on/ignoring/group_* are not selectors.
    bare = re.sub(r'\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)', "", bare)
    out.extend(m.group(1) for m in BARE_METRIC.finditer(bare))
    return out


class Linter:
    def __init__(self):
        self.errors: list[str] = []
        self.promql: list[tuple[str, str]] = []  # (where, expression)

    def error(self, where: str, msg: str):
        self.errors.append(f"{where}: {msg}")

    def lint(self, path: Path) -> dict:
        name = path.name
        try:
            dash = queries.load_dashboard(path)
        except (OSError, ValueError) as e:
            self.error(name, f"cannot be read as JSON: {e}")
            return {"panels": 0, "queries": 0, "heatmaps": 0, "variables": 0}
        for key in ("uid", "title"):
            if not dash.get(key):
                self.error(name, f"has no {key}")
        if "__inputs" in dash:
            self.error(name, "has __inputs (export for sharing): use the ${datasource} variable instead")

        variables = {v.get("name"): v for v in queries.variables(dash)}
        ds = variables.get("datasource")
        if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
            self.error(name, 'needs a template variable "datasource" of type datasource with query "prometheus"')
        for req in REQUIRED_VARIABLES:
            if req not in variables:
                self.error(name, f'has no template variable "{req}"')
        cluster = variables.get("cluster") or {}
        current = (cluster.get("current") or {}).get("value")
        if cluster and not (cluster.get("includeAll") and cluster.get("multi")
                            and cluster.get("allValue") == ".*" and current in (["$__all"], "$__all")):
            self.error(name, 'variable "cluster" must be multi-value with All (allValue ".*", which also '
                             'matches series without the label) selected by default')
        values = queries.build_values(dash, SAMPLE_VALUES, {})
        for var in variables.values():
            if var.get("type") != "query":
                continue
            where = f'{name}: variable "{var.get("name")}"'
            if not ds_ref_ok(var.get("datasource")):
                self.error(where, "does not use the ${datasource} variable")
            q = queries.variable_query(var)
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q, re.S)
            if not m:
                self.error(where, f"is not a label_values(selector, label) query: {q!r}")
                continue
            if var.get("name") != "cluster":
                for sel in unfiltered_selectors(m.group(1)):
                    self.error(where, f'selector {sel} does not filter on {CLUSTER_MATCHER}')
            self.add_promql(where, m.group(1), values)

        counts = {"panels": 0, "queries": 0, "heatmaps": 0, "variables": len(variables)}
        ids = set()
        for panel in queries.iter_panels(dash):
            counts["panels"] += 1
            ptype = panel.get("type", "?")
            where = f'{name}: panel {panel.get("id")} "{panel.get("title", "")}" ({ptype})'
            pid = panel.get("id")
            if pid in ids:
                self.error(where, "duplicate panel id")
            ids.add(pid)
            if ptype != "text":
                if ptype != "row" or "datasource" in panel:
                    if not ds_ref_ok(panel.get("datasource")):
                        self.error(where, f"datasource {panel.get('datasource')!r} is not the ${{datasource}} variable")
            if ptype not in NO_QUERY_PANELS:
                unit = ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit")
                if not unit:
                    self.error(where, "has no unit (fieldConfig.defaults.unit)")
                if not panel.get("targets"):
                    self.error(where, "has no queries")
            if ptype == "heatmap":
                counts["heatmaps"] += 1
                if (panel.get("options") or {}).get("calculate") is not False:
                    self.error(where, "heatmap must use options.calculate: false (buckets come from Prometheus)")
            for target in panel.get("targets", []) or []:
                twhere = f'{where} query {target.get("refId", "?")}'
                if "datasource" in target and not ds_ref_ok(target["datasource"]):
                    self.error(twhere, f"datasource {target['datasource']!r} is not the ${{datasource}} variable")
                expr = target.get("expr")
                if not expr:
                    self.error(twhere, "has no PromQL expression")
                    continue
                counts["queries"] += 1
                if ptype == "heatmap" and target.get("format") != "heatmap":
                    self.error(twhere, 'heatmap query must have format "heatmap"')
                for sel in unfiltered_selectors(expr):
                    self.error(twhere, f'selector {sel} does not filter on {CLUSTER_MATCHER}')
                for func, ranges in rate_ranges(expr):
                    if ranges != ["$__rate_interval"]:
                        shown = ", ".join(f"[{r}]" for r in ranges) or "no range"
                        self.error(twhere, f"{func}() must use [$__rate_interval], found {shown}")
                self.add_promql(twhere, expr, values)
        return counts

    def add_promql(self, where: str, expr: str, values: dict):
        try:
            self.promql.append((where, queries.substitute(expr, values)))
        except KeyError as e:
            self.error(where, f"uses unknown template variable ${e.args[0]}")

    def check_promql(self, promtool: str) -> int:
        """Validates the collected expressions with promtool; returns how many were checked."""
        if not self.promql:
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            rules = Path(tmp) / "dashboard-queries.yml"
            lines = ["groups:", "  - name: dashboard-queries", "    rules:"]
            for i, (_, expr) in enumerate(self.promql):
                lines.append(f"      - record: dashboard_query_{i}")
                lines.append("        expr: |-")
                lines.extend("          " + ln for ln in expr.splitlines())
            rules.write_text("\n".join(lines) + "\n")
            res = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
            if res.returncode == 0:
                return len(self.promql)
            output = res.stdout + res.stderr
            found = False
            for m in re.finditer(r'"dashboard_query_(\d+)": (.*)', output):
                found = True
                where, expr = self.promql[int(m.group(1))]
                self.error(where, f"invalid PromQL ({m.group(2).strip()}): {' '.join(expr.split())}")
            if not found:
                self.errors.append(f"promtool check rules failed:\n{output}")
        return len(self.promql)


def main(argv: list[str]) -> int:
    if "--list-queries" in argv or "--help" in argv or "-h" in argv:
        return queries.main(argv)
    paths = queries.dashboard_paths(argv)
    if not paths:
        print("lint_dashboards: no dashboards found", file=sys.stderr)
        return 1
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not promtool:
        print("lint_dashboards: promtool not found (Debian package prometheus)", file=sys.stderr)
        return 1
    linter = Linter()
    totals = {"panels": 0, "queries": 0, "heatmaps": 0}
    for path in paths:
        c = linter.lint(path)
        for k in totals:
            totals[k] += c[k]
        print(f"checked {path.name}: {c['panels']} panels, {c['queries']} queries, {c['heatmaps']} heatmaps, "
              f"{c['variables']} variables (datasource variable, units, $__rate_interval, heatmap calculate: false)")
    checked = linter.check_promql(promtool)
    print(f"checked {checked} PromQL expressions (queries and variable selectors) with promtool after substituting "
          f"template variables")
    if linter.errors:
        for e in linter.errors:
            print(f"ERROR {e}", file=sys.stderr)
        print(f"FAIL: {len(linter.errors)} problem(s) in {len(paths)} dashboard(s)")
        return 1
    print(f"OK: {len(paths)} dashboards, {totals['panels']} panels, {totals['queries']} queries, "
          f"{checked} PromQL expressions valid")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
