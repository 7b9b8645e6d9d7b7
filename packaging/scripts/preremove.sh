#!/bin/sh
# Stops and disables the service before its files go, on removal only (not on upgrade: deb
# passes "remove", rpm the number of versions left, 0 on removal).
set -e
case "$1" in
  remove | 0)
    if [ -d /run/systemd/system ]; then
      systemctl disable --now sysscope.service >/dev/null 2>&1 || true
    fi
    ;;
esac
