"""The token under observation, and a VM still running its startup script."""

from __future__ import annotations

import os
import subprocess
import threading
import time

from bootstrap.jobs import environment
from bootstrap.vm import startup
from tests.loopback import Fab
from tests.startupscript import StartupRoot

SLOW_TRAIN = ("--arg", "vars.num_batches=6", "--arg", "train.env.STANDIN_SECONDS=1")


def test_token_never_in_ps_logs_or_outputs(fab: Fab):
    first = fab.start("train", *SLOW_TRAIN)
    seen_running = False
    while first.poll() is None:
        ps = subprocess.run(["ps", "-ewwo", "pid,args"], capture_output=True, text=True).stdout
        assert fab.token not in ps
        seen_running |= "train_rl" in ps
        time.sleep(0.3)
    output = first.stdout.read()
    assert first.returncode == 0, output
    assert seen_running, "ps never saw the job: the check above proved nothing"
    assert fab.token not in output
    secret = fab.tmp / "state" / "secrets" / "HF_TOKEN"
    assert secret.read_text() == fab.token
    assert secret.stat().st_mode & 0o777 == 0o600
    assert (secret.parent.stat().st_mode & 0o777) == 0o700
    for path in fab.tmp.rglob("*"):
        if path.is_file() and path != secret:
            assert fab.token.encode() not in path.read_bytes(), f"token found in {path}"


def test_setup_waits_for_the_startup_script_and_shows_its_log(fab: Fab):
    marker = fab.tmp / "startup.done"
    marker.unlink()
    (fab.tmp / "startup.log").write_text("[tpu-rl startup] apt update and upgrade\n")
    started = fab.start("setup")
    seen = []
    for line in started.stdout:  # wait for fab to say it waits; the job cannot start before the marker
        seen.append(line)
        if "waiting for the startup script" in line:
            break
    assert not (fab.tmp / "venv").exists(), "setup must wait for the marker"
    marker.write_text("ok\n")
    rest: list[str] = []  # read through the same buffered file: communicate() would skip what it holds
    reader = threading.Thread(target=lambda: rest.append(started.stdout.read()))
    reader.start()
    reader.join(timeout=120)
    assert started.wait(timeout=30) == 0 and rest, seen
    output = "".join(seen + rest)
    assert "waiting for the startup script" in output
    assert "startup | [tpu-rl startup] apt update and upgrade" in output
    assert os.path.exists(fab.tmp / "venv" / "bin" / "python")


def test_a_failed_startup_script_stops_fab_at_once_in_one_line_and_status_shows_it(fab: Fab):
    """The real startup.sh failed at its install step on the "VM" (its record beside the marker): fab
    stops in seconds, not after its 30 minutes of waiting, with the step, the code, the log's last
    lines and the fix; nothing started. Once the script has run again and worked, fab goes on."""
    vm = StartupRoot(fab.tmp)
    vm.marker.unlink()
    vm.with_uv(environment.UV_MIN)
    assert vm.run(STANDIN_FAIL="install", TPU_RL_APT_TRIES="1").returncode == 100
    status = fab("status")
    assert status.returncode == 0, status.stderr
    assert "startup script: failed at step 'system packages" in status.stdout
    result = fab("train", timeout=120)  # waiting for the marker would outlast this
    errors = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(errors) == 1, result.stdout + result.stderr
    assert "the startup script failed at step 'system packages" in errors[0] and "(exit 100," in errors[0]
    assert "E: the stand-in's install fails" in errors[0]  # the log's last lines
    assert startup.RERUN in errors[0]
    assert not (fab.tmp / "venv").exists() and not (fab.tmp / "state" / "pipeline").exists()  # nothing started
    assert vm.run().returncode == 0  # the fix: the script once more
    status = fab("status")
    assert f"startup script: done at {vm.marker.read_text().strip()}" in status.stdout
    assert fab("setup").returncode == 0
