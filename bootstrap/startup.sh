#!/bin/bash
# First-boot preparation of the TPU VM (runs as root from the instance's
# "startup-script" metadata on every boot). It installs what the workload needs
# from the OS, logs to /var/log/tpu-rl-startup.log and leaves a marker that
# `fab setup` waits for. It is idempotent and holds no secret.
set -euo pipefail

LOG=/var/log/tpu-rl-startup.log
MARKER=/var/lib/tpu-rl/startup.done
exec > >(tee -a "$LOG") 2>&1
log() { echo "[tpu-rl startup $(date -u +%H:%M:%S)] $*"; }

if [ -f "$MARKER" ]; then
  log "already prepared ($(cat "$MARKER")); nothing to do"
  exit 0
fi

log "apt update and upgrade"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get upgrade -y -q --fix-missing

log "system packages: build tools for vLLM, git for the extra deps"
apt-get install -y -q build-essential cmake ninja-build git curl

log "uv, system-wide so that every user finds it"
if ! command -v uv >/dev/null 2>&1; then
  curl -LsSf https://astral.sh/uv/install.sh | env UV_INSTALL_DIR=/usr/local/bin INSTALLER_NO_MODIFY_PATH=1 sh
fi

mkdir -p "$(dirname "$MARKER")"
date -u +%Y-%m-%dT%H:%M:%SZ > "$MARKER"
log "done: $MARKER"
