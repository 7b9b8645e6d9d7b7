"""Counts code lines of Rust files: lines outside `#[cfg(test)] mod tests { ... }`.

A test module is the `#[cfg(test)]` line, the `mod tests {` line after it and every line up to
the `}` that closes it at the same indentation. Everything else counts as code, blank lines and
comments included, so the figure is what a reader of the non-test code has to scroll through.

Usage: code-lines.py PATH... (files or folders; folders are searched for *.rs)
Prints one line per file (code, tests, path) and a total per argument.
"""

import os
import re
import sys

TEST_MOD = re.compile(r"^(\s*)(pub(\(crate\))?\s+)?mod tests\s*\{\s*$")


def count(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    code = tests = 0
    i = 0
    while i < len(lines):
        m = TEST_MOD.match(lines[i])
        if m and i > 0 and lines[i - 1].strip() == "#[cfg(test)]":
            indent = m.group(1)
            code -= 1  # the attribute line belongs to the test module
            tests += 1
            j = i + 1
            while j < len(lines) and lines[j] != indent + "}":
                j += 1
            tests += j - i + 1
            i = j + 1
            continue
        code += 1
        i += 1
    return code, tests


def files(arg):
    if os.path.isfile(arg):
        yield arg
        return
    for root, _, names in os.walk(arg):
        for name in sorted(names):
            if name.endswith(".rs"):
                yield os.path.join(root, name)


def main(args):
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for arg in args:
        total_code = total_tests = 0
        for path in sorted(files(arg)):
            code, tests = count(path)
            total_code += code
            total_tests += tests
            print(f"{code:6} {tests:6}  {path}")
        print(f"{total_code:6} {total_tests:6}  total {arg}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
