"""Checks the layering of the exporter crate (docs/architecture.md, "Layers").

Reads every `crate::` and `super::` path in exporter/src (use statements, brace groups included,
and paths written inline), maps each to the deepest module file it names, and fails when
  - two files import each other, directly or through others (an import cycle);
  - a file imports a file of a layer it may not use;
  - a file belongs to no layer ("assign a layer" in LAYERS below and in the docs);
  - a file names a crate only other layers may use (ONLY_IN below: maps and programs are
    reached only through the kernel layer, so no other file names an `aya` item; the helper
    binaries of bin/, which belong to no layer, neither).
Comments and `#[cfg(test)] mod tests` are left out: tests may reach anywhere.

Known breaches that cannot be moved yet are listed in EXCEPTIONS (imports) and CYCLE_EXCEPTIONS
(cycles), each with its reason; an exception that no longer matches fails the check too, so the
lists only shrink.

Usage: layers.py [SRC_DIR] (default: exporter/src beside this script's repository).
Prints one line per problem and a final "OK ..." or "FAIL ..." line; exits 1 on failure.
"""

import os
import re
import sys

# Lowest first. Each layer may use itself and every layer listed before it, except where
# `uses` says otherwise. Patterns are paths relative to exporter/src: a file, or a folder
# ending in "/".
LAYERS = [
    ("util", ["util/", "openmetrics.rs", "syscall_table.rs"]),
    ("build_info", ["build_info.rs"]),
    ("config", ["config/"]),
    (
        "kernel",
        [
            "kernel/",
            "hist.rs",
            "privileges.rs",
        ],
    ),
    # Readers of what the node exposes besides the probes (NVML, /proc/stat), shared by the
    # collectors and the CLI.
    ("sources", ["sources/"]),
    ("labels", ["metadata/", "series.rs"]),
    ("collectors", ["collector.rs", "collectors/"]),
    ("agent", ["agent.rs"]),
    ("spans", ["spans/"]),
    ("exposition", ["exposition/"]),
    ("cli", ["cli/"]),
    ("startup", ["startup.rs", "serve.rs", "reload.rs", "lib.rs", "main.rs"]),
]

# Layers whose allowed imports are not "everything below": the CLI measures with the kernel
# layer, sources and labels, never through the exporter's collectors, agent or exposition.
USES = {
    "cli": {"util", "build_info", "config", "kernel", "sources", "labels", "cli"},
}

# External crates only these layers may name (in `use` or inline paths); files of bin/ belong
# to no layer and may name none of them.
ONLY_IN = {
    "aya": {"kernel"},
}

# (importing file, imported file): why it is allowed for now. Remove an entry when the move
# that ends it lands.
EXCEPTIONS = {}

# Import cycles allowed for now, as the sorted list of their files: why. Same rule: remove the
# entry when the move that ends it lands.
CYCLE_EXCEPTIONS = {}


def layer_of(rel):
    for i, (name, patterns) in enumerate(LAYERS):
        for p in patterns:
            if (p.endswith("/") and rel.startswith(p)) or rel == p:
                return i, name
    return None, None


def allowed(src_layer, dst_layer):
    if src_layer == dst_layer:
        return True
    if src_layer in USES:
        return dst_layer in USES[src_layer]
    if dst_layer == "cli":
        return src_layer == "startup"
    order = [name for name, _ in LAYERS]
    return order.index(dst_layer) < order.index(src_layer)


def rust_files(src):
    """Every .rs file under src, relative to it."""
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith(".rs"):
                yield os.path.relpath(os.path.join(root, f), src).replace(os.sep, "/")


def modules(src):
    """Module path (tuple) -> file, relative to src. Binaries under bin/ are their own crates."""
    mods = {}
    for rel in rust_files(src):
        parts = rel[:-3].split("/")
        if parts[0] == "bin":
            continue
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        mods[tuple(parts)] = rel
    return mods


def expand(body):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]]."""
    body = re.sub(r"\s+as\s+\w+", "", body)
    body = re.sub(r"\s+", "", body)
    out = []

    def rec(prefix, text):
        depth, cur, items = 0, "", []
        for ch in text:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            items.append(cur)
        for it in items:
            m = re.match(r"^([\w:]*?)(?:::)?\{(.*)\}$", it)
            if m:
                rec(prefix + [p for p in m.group(1).split("::") if p], m.group(2))
            else:
                out.append(prefix + [p for p in it.split("::") if p])

    rec([], body)
    return out


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.split(r"#\[cfg\(test\)\]\s*mod\s+tests", text)[0]


def imports(src, mods):
    """file -> set of files it imports."""
    graph = {}
    for mp, f in mods.items():
        text = strip(open(os.path.join(src, f), encoding="utf-8").read())
        here = list(mp)
        # A mod.rs (or lib.rs) is its module: `super` is its parent. A plain file `a/b.rs` is
        # module a::b, whose `super` is a.
        parent = here[:-1]
        paths = []
        for m in re.finditer(r"\buse\s+(crate|super|self)::([^;]+);", text):
            base = {"crate": [], "super": parent, "self": here}[m.group(1)]
            paths += [base + p for p in expand(m.group(2))]
        for m in re.finditer(r"\b(crate|super)::((?:\w+::)*\w+)", text):
            base = [] if m.group(1) == "crate" else parent
            paths.append(base + m.group(2).split("::"))
        deps = set()
        for p in paths:
            for k in range(len(p), 0, -1):
                t = mods.get(tuple(p[:k]))
                if t:
                    if t != f:
                        deps.add(t)
                    break
        graph[f] = deps
    return graph


def cycles(graph):
    """Strongly connected groups of more than one file (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "exporter", "src")
    mods = modules(src)
    graph = imports(src, mods)
    problems = []
    used = set()
    for f in sorted(graph):
        if layer_of(f)[1] is None:
            problems.append(f"{f}: belongs to no layer: assign a layer (scripts/checks/layers.py "
                            "LAYERS and docs/architecture.md)")
    for c in cycles(graph):
        if tuple(c) in CYCLE_EXCEPTIONS:
            used.add(tuple(c))
            continue
        problems.append("import cycle: " + ", ".join(c))
    for f in rust_files(src):
        src_layer = layer_of(f)[1]
        if src_layer is None and not f.startswith("bin/"):
            continue
        text = strip(open(os.path.join(src, f), encoding="utf-8").read())
        for crate, layers in sorted(ONLY_IN.items()):
            if src_layer not in layers and re.search(rf"(?<![\w:]){crate}::", text):
                where = src_layer or "bin"
                problems.append(f"{f} ({where}) names the `{crate}` crate: only the "
                                f"{', '.join(sorted(layers))} layer may")
    for f in sorted(graph):
        src_layer = layer_of(f)[1]
        if src_layer is None:
            continue
        for d in sorted(graph[f]):
            dst_layer = layer_of(d)[1]
            if dst_layer is None or allowed(src_layer, dst_layer):
                continue
            if (f, d) in EXCEPTIONS:
                used.add((f, d))
                continue
            problems.append(f"{f} ({src_layer}) imports {d} ({dst_layer}): a lower layer may "
                            "not use a higher one")
    for stale in sorted(set(EXCEPTIONS) - used):
        problems.append(f"exception {stale[0]} -> {stale[1]} no longer matches an import: "
                        "remove it from EXCEPTIONS")
    for stale in sorted(set(CYCLE_EXCEPTIONS) - used):
        problems.append(f"cycle exception {', '.join(stale)} no longer matches a cycle: "
                        "remove it from CYCLE_EXCEPTIONS")
    for p in problems:
        print(p)
    summary = (f"{len(graph)} files, {sum(len(d) for d in graph.values())} imports, "
               f"{len(used)} listed exceptions")
    if problems:
        print(f"FAIL: {len(problems)} problems ({summary})")
        return 1
    print(f"OK: no import cycle, layers hold ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
