#!/usr/bin/env bash
# Errors state their cause once (scripts/checks/error-causes.py).
cd "$(dirname "$0")/../.." && exec python3 scripts/checks/error-causes.py exporter/src
