#!/bin/sh
# Forgets the removed unit. The configuration in /etc/sysscope stays until a purge.
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
