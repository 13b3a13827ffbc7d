#!/bin/bash
# First-boot preparation of the TPU VM (runs as root from the instance's
# "startup-script" metadata on every boot). It installs what the workload needs
# from the OS, logs to /var/log/tpu-rl-startup.log and leaves a marker that
# `fab setup` waits for. It is idempotent and holds no secret.
#
# A step that fails leaves a record beside the marker (startup.failed: the step,
# its exit code, when), because the guest agent only logs "startup-script exit
# status N" and its unit still reports success: fab reads the record and stops
# waiting at once instead of after 30 minutes of a TPU billed by the hour. A run
# removes the record when it begins (a re-run is running, not failed) and writes
# the marker only when every step worked.
#
# The paths and bounds below can be set from the environment for the tests
# (tests/unit/test_startup.py); the VM runs the script with none of them set.
set -euo pipefail

LOG=${TPU_RL_STARTUP_LOG:-/var/log/tpu-rl-startup.log}
MARKER=${TPU_RL_STARTUP_MARKER:-/var/lib/tpu-rl/startup.done}
FAILED="$(dirname "$MARKER")/startup.failed"
UV_DIR=${TPU_RL_UV_DIR:-/usr/local/bin}
# Stock Ubuntu images run apt-daily and unattended-upgrades as soon as a new VM boots, and they hold
# dpkg's lock for minutes: without a timeout apt-get fails at once ("Could not get lock"). Each apt
# call waits up to APT_LOCK_SECONDS for it, and is tried APT_TRIES times in all (a mirror's transient
# failure, a lists lock), APT_RETRY_SECONDS x the try number apart: at most about 16 minutes, within
# the 30 that fab waits.
APT_LOCK_SECONDS=${TPU_RL_APT_LOCK_SECONDS:-300}
APT_TRIES=${TPU_RL_APT_TRIES:-3}
APT_RETRY_SECONDS=${TPU_RL_APT_RETRY_SECONDS:-15}
# uv is the version the project tests (requirements-dev.lock), from PyPI through pip's hash-checking
# mode: the x86_64 and aarch64 manylinux wheels of that release, nothing else installs.
UV_VERSION=0.13.9
UV_HASHES="--hash=sha256:d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
--hash=sha256:5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe"

mkdir -p "$(dirname "$LOG")" "$(dirname "$MARKER")"
exec > >(tee -a "$LOG") 2>&1
log() { echo "[tpu-rl startup $(date -u +%H:%M:%S)] $*"; }

# Prepared, with the pinned uv: nothing to do. A VM prepared by an older script (another uv) runs again.
if [ -f "$MARKER" ] && [ "$("$UV_DIR/uv" --version 2>/dev/null | cut -d' ' -f2)" = "$UV_VERSION" ]; then
  log "already prepared ($(cat "$MARKER")); nothing to do"
  exit 0
fi

STEP="start"
step() { STEP="$1"; log "$1"; }
record_failure() {
  local code=$?
  if [ "$code" -ne 0 ]; then
    printf '{"step": "%s", "exit_code": %d, "at": "%s"}\n' "$STEP" "$code" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$FAILED"
    log "FAILED at step '$STEP' (exit $code): $FAILED"
  fi
}
trap record_failure EXIT
rm -f "$FAILED" "$MARKER"  # running again: neither done nor failed until it ends

apt_get() {
  local try=1 code
  while true; do
    apt-get -o DPkg::Lock::Timeout="$APT_LOCK_SECONDS" "$@" && return 0 || code=$?
    if [ "$try" -ge "$APT_TRIES" ]; then
      return "$code"
    fi
    log "apt-get $1 exited $code (try $try of $APT_TRIES); trying again in $((try * APT_RETRY_SECONDS)) s"
    sleep $((try * APT_RETRY_SECONDS))
    try=$((try + 1))
  done
}

export DEBIAN_FRONTEND=noninteractive
step "apt update"
apt_get update -q
step "apt upgrade"
apt_get upgrade -y -q --fix-missing

step "system packages: build tools for vLLM, git for the extra deps, pip for uv, cron to revive a dead driver"
apt_get install -y -q build-essential cmake ninja-build git curl python3-pip cron

step "uv $UV_VERSION, system-wide so that every user finds it"
if [ "$("$UV_DIR/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  wheel=$(mktemp -d)
  echo "uv==$UV_VERSION $UV_HASHES" > "$wheel/requirements.txt"
  python3 -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes \
    --target "$wheel/uv" -r "$wheel/requirements.txt"
  install -m 755 "$wheel/uv/bin/uv" "$UV_DIR/uv"
  rm -rf "$wheel"
fi
"$UV_DIR/uv" --version

step "marker"
date -u +%Y-%m-%dT%H:%M:%SZ > "$MARKER"
log "done: $MARKER"
