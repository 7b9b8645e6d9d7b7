#!/usr/bin/env python3
"""Errors state their cause once: a thiserror variant that returns its cause from `source()`
(a `#[source]` or `#[from]` field, or a field named `source`) must not also print it in its
message, or every line that prints the chain (`Chain`, `{:#}`) repeats the cause.

    scripts/checks/error-causes.py [DIR]     (default: exporter/src)
"""
import re
import sys
from pathlib import Path

ERROR = re.compile(
    r'#\[error\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)[^\]]*\)\]\s*'  # the message
    r'(?:#\[[^\]]*\]\s*)*'                                    # other attributes
    r'(\w+)\s*(\{[^}]*\}|\([^)]*\))?',                         # variant and fields
    re.S,
)
FIELD = re.compile(r'(#\[(source|from)\][\s]*)?(?:pub(?:\([^)]*\))?\s+)?(\w+)\s*:')


def causes(fields: str) -> set[str]:
    if fields.startswith('{'):
        return {m.group(3) for m in FIELD.finditer(fields) if m.group(2) or m.group(3) == 'source'}
    if '#[source]' in fields or '#[from]' in fields:
        return {'0'}
    return set()


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else 'exporter/src')
    bad = []
    for path in sorted(root.rglob('*.rs')):
        text = path.read_text()
        for m in ERROR.finditer(text):
            message, variant, fields = m.group(1), m.group(2), m.group(3) or ''
            for name in causes(fields):
                if re.search(r'\{' + re.escape(name) + r'[}:]', message):
                    line = text.count('\n', 0, m.start()) + 1
                    bad.append(f'{path}:{line}: {variant} prints `{{{name}}}` and also returns it as its source')
    for b in bad:
        print(b)
    print(f"error-causes: {'FAIL' if bad else 'PASS'} ({len(bad)} variants print their cause twice)")
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
