#!/usr/bin/env python3
"""Every PromQL expression of sysscope's Grafana dashboards, with template variables substituted.

    python3 scripts/checks/queries.py --list-queries --var cgroup=/system.slice/foo.service
    python3 scripts/checks/queries.py --list-queries --format json --var instance=127.0.0.1:9100

Substitution follows what Grafana sends to Prometheus:
  --var NAME=VALUE        a selected value; regex metacharacters are escaped, as Grafana does for a
                          value of a multi-value/"All" variable (repeat --var NAME=... to select
                          several values: they become (a|b)).
  --regex-var NAME=REGEX  inserted as is (what an "All" value or a custom regex would send).
  builtins                $__rate_interval (default 1m), $__interval (1m), $__range (1h); override
                          with --var __rate_interval=30s.
A variable that is not given takes its "current" value from the dashboard when that is a concrete
value, else its allValue (".*" here: it also matches series without the label, which is what makes
namespace/pod panels work on hosts without Kubernetes); constants take their value.

The text format prints one query per line: dashboard, panel id, panel title, refId and the
expression (whitespace collapsed), tab-separated. The JSON format prints a list of objects.
lint_dashboards.py imports this module for the same panel walk and substitution.
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "grafana" / "dashboards"

BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
ALL_VALUES = {"$__all", "All", "__all"}
_REGEX_SPECIAL = set("\\^$*+?.()|{}[]")
_VAR_RE = re.compile(r"\$\{(\w+)(?::[\w-]+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def regex_escape(value: str) -> str:
    """Escape a literal for use inside a PromQL regex string, as Grafana does (`.` -> `\\\\.`)."""
    out = []
    for ch in value:
        if ch in _REGEX_SPECIAL:
            out.append("\\\\" + ch)
        elif ch == '"':
            out.append('\\"')
        else:
            out.append(ch)
    return "".join(out)


def load_dashboard(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def dashboard_paths(args: list[str]) -> list[Path]:
    if args:
        return [Path(a) for a in args]
    return sorted(DASHBOARD_DIR.glob("*.json"))


def iter_panels(dashboard: dict):
    """Every panel, rows first, then the panels nested in collapsed rows, in document order."""
    for panel in dashboard.get("panels", []):
        yield panel
        for nested in panel.get("panels", []) or []:
            yield nested


def variables(dashboard: dict) -> list[dict]:
    return dashboard.get("templating", {}).get("list", [])


def variable_query(var: dict) -> str:
    query = var.get("query", "")
    if isinstance(query, dict):
        query = query.get("query", "")
    return query or var.get("definition", "")


def default_values(dashboard: dict) -> dict[str, str]:
    """What each dashboard variable expands to when the caller does not choose a value."""
    values: dict[str, str] = {}
    for var in variables(dashboard):
        name = var.get("name")
        kind = var.get("type")
        if kind == "datasource":
            continue
        if kind == "constant":
            values[name] = variable_query(var)
            continue
        current = (var.get("current") or {}).get("value")
        if isinstance(current, list):
            current = [v for v in current if v not in ALL_VALUES]
            if len(current) == 1:
                current = current[0]
            elif current:
                values[name] = "(" + "|".join(regex_escape(v) for v in current) + ")"
                continue
            else:
                current = None
        if isinstance(current, str) and current and current not in ALL_VALUES:
            values[name] = regex_escape(current) if (var.get("multi") or var.get("includeAll")) else current
        else:
            values[name] = var.get("allValue") or ".*"
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace $var, ${var}, ${var:format} and [[var]]; unknown variables raise KeyError."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in values:
            return values[name]
        if name in BUILTINS:
            return BUILTINS[name]
        raise KeyError(name)

    return _VAR_RE.sub(repl, expr)


def iter_queries(dashboard: dict):
    """(panel, target) for every target of every panel that has a PromQL expression."""
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []) or []:
            if "expr" in target:
                yield panel, target


def build_values(dashboard: dict, chosen: dict[str, list[str]], raw: dict[str, str]) -> dict[str, str]:
    values = default_values(dashboard)
    for name, vals in chosen.items():
        if name in BUILTINS:
            values[name] = vals[-1]
        elif len(vals) == 1:
            values[name] = regex_escape(vals[0])
        else:
            values[name] = "(" + "|".join(regex_escape(v) for v in vals) + ")"
    values.update(raw)
    return values


def collect(paths: list[Path], chosen: dict[str, list[str]], raw: dict[str, str], include_variables: bool) -> list[dict]:
    rows = []
    for path in paths:
        dashboard = load_dashboard(path)
        values = build_values(dashboard, chosen, raw)
        if include_variables:
            for var in variables(dashboard):
                m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", variable_query(var), re.S)
                if var.get("type") == "query" and m:
                    rows.append({
                        "dashboard": path.name, "kind": "variable", "variable": var["name"],
                        "label": m.group(2), "expr": substitute(m.group(1), values),
                    })
        for panel, target in iter_queries(dashboard):
            rows.append({
                "dashboard": path.name,
                "kind": "panel",
                "panel_id": panel.get("id"),
                "panel": panel.get("title", ""),
                "panel_type": panel.get("type"),
                "ref_id": target.get("refId", ""),
                "instant": bool(target.get("instant")) and not target.get("range", False),
                "format": target.get("format", "time_series"),
                "expr": substitute(target["expr"], values),
            })
    return rows


def parse_assignments(items: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        if "=" not in item:
            raise SystemExit(f"{flag} expects NAME=VALUE, got {item!r}")
        name, value = item.split("=", 1)
        out.append((name.strip().lstrip("$"), value))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dashboards", nargs="*", help="dashboard JSON files (default: grafana/dashboards/*.json)")
    ap.add_argument("--list-queries", action="store_true", help="print every query (the default action)")
    ap.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="select a value (escaped)")
    ap.add_argument("--regex-var", action="append", default=[], metavar="NAME=REGEX", help="insert a regex as is")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    ap.add_argument("--include-variables", action="store_true",
                    help="also print the series selectors of label_values() variable queries")
    args = ap.parse_args(argv)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`

    chosen: dict[str, list[str]] = {}
    for name, value in parse_assignments(args.var, "--var"):
        chosen.setdefault(name, []).append(value)
    raw = dict(parse_assignments(args.regex_var, "--regex-var"))
    try:
        rows = collect(dashboard_paths(args.dashboards), chosen, raw, args.include_variables)
    except KeyError as e:
        print(f"queries.py: unknown template variable ${e.args[0]}", file=sys.stderr)
        return 1
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        for r in rows:
            expr = " ".join(r["expr"].split())
            if r["kind"] == "variable":
                print(f"{r['dashboard']}\tvariable\t{r['variable']}\t{r['label']}\t{expr}")
            else:
                print(f"{r['dashboard']}\t{r['panel_id']}\t{r['panel']}\t{r['ref_id']}\t{expr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
