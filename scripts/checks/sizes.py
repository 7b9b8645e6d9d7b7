"""Holds the exporter's library code to sizes a reader can keep in mind: no function over
MAX_FN lines and no file over MAX_FILE code lines in exporter/src, outside bin/ and test
modules (`#[cfg(test)] mod tests { ... }` and anything after a `#[cfg(test)]` line at the top
level). A function's length runs from its `fn` line to its closing brace.

Entries in DEBT are known offenders being split up: each is reported, may not grow, and must
leave the list once it is within the limit (a stale entry fails too), so the list only shrinks.

Usage: sizes.py [SRC]  (default: exporter/src). Prints every offender; exits 1 on any that is
not in DEBT, grew past its DEBT figure, or a stale DEBT entry.
"""

import os
import re
import sys

MAX_FN = 120
MAX_FILE = 800

# (path relative to SRC, function name or None for the file) -> lines allowed for now.
DEBT = {
    ("cli/session.rs", None): 854,
    ("cli/top.rs", None): 819,
    ("kernel/btf.rs", "parse"): 152,
    ("cli/trace.rs", "run"): 136,
    ("config/otlp/mod.rs", "variables"): 123,
    ("spans/event.rs", "enrich_with"): 124,
}

FN = re.compile(
    r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+([A-Za-z0-9_]+)'
)
TEST_MOD = re.compile(r"^(\s*)(pub(\(crate\))?\s+)?mod tests\s*\{\s*$")
STRING = re.compile(r'"(\\.|[^"\\])*"' r"|'(\\.|[^'\\])'")


def code_lines(lines):
    """The lines outside test modules, as (line number, text)."""
    out = []
    i = 0
    while i < len(lines):
        m = TEST_MOD.match(lines[i])
        if m and i > 0 and lines[i - 1].strip() == "#[cfg(test)]":
            out.pop()  # the attribute belongs to the module
            j = i + 1
            while j < len(lines) and lines[j] != m.group(1) + "}":
                j += 1
            i = j + 1
            continue
        out.append((i + 1, lines[i]))
        i += 1
    return out


def functions(code):
    """(name, first line, length) of every function in `code`."""
    found = []
    i = 0
    while i < len(code):
        m = FN.match(code[i][1])
        if not m:
            i += 1
            continue
        depth, started, j = 0, False, i
        while j < len(code):
            s = STRING.sub('""', code[j][1].split("//")[0])
            depth += s.count("{") - s.count("}")
            started = started or "{" in s
            if started and depth <= 0:
                break
            if not started and s.rstrip().endswith(";"):
                break
            j += 1
        if started:
            found.append((m.group(7), code[i][0], j - i + 1))
            # Nested functions count inside their parent, and on their own.
        i += 1
    return found


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "exporter/src"
    offenders = {}
    for dirpath, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if os.path.relpath(os.path.join(dirpath, d), src) != "bin")
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            with open(path, encoding="utf-8") as fh:
                code = code_lines(fh.read().splitlines())
            if len(code) > MAX_FILE:
                offenders[(rel, None)] = (len(code), f"{rel}: {len(code)} code lines (limit {MAX_FILE})")
            for name, line, n in functions(code):
                if n > MAX_FN:
                    offenders[(rel, name)] = (n, f"{rel}:{line} fn {name}: {n} lines (limit {MAX_FN})")
    failures = []
    for key, (n, what) in sorted(offenders.items(), key=lambda kv: -kv[1][0]):
        allowed = DEBT.get(key)
        if allowed is None:
            failures.append(what)
        elif n > allowed:
            failures.append(f"{what}, grew past its listed {allowed}")
        else:
            print(f"known: {what}")
    for key, allowed in sorted(DEBT.items(), key=str):
        if key not in offenders:
            failures.append(f"stale DEBT entry {key} ({allowed}): within the limit now, remove it")
    for f in failures:
        print(f"over: {f}")
    if failures:
        print(f"FAIL: {len(failures)} over the limits (functions {MAX_FN} lines, files {MAX_FILE} code lines)")
        return 1
    print(f"OK: nothing new over {MAX_FN} lines a function or {MAX_FILE} code lines a file; {len(DEBT)} known offenders, none grew")
    return 0


if __name__ == "__main__":
    sys.exit(main())
