#!/bin/sh
# Makes systemd see the new or upgraded unit. The service is not enabled or started: it loads
# eBPF programs into the kernel, which the administrator starts deliberately
# (`systemctl enable --now sysscope`). An upgrade restarts a running service.
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
  systemctl try-restart sysscope.service >/dev/null 2>&1 || true
fi
