"""Interruptions: a killed fab, two fabs at once, and the token under observation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.loopback import Fab

SLOW_TRAIN = ("--arg", "vars.num_batches=6", "--arg", "train.env.STANDIN_SECONDS=1")


def wait_for(condition, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def train_runner(fab: Fab) -> Path | None:
    found = list((fab.tmp / "state" / "runs").glob("*/train/runner.json"))
    return found[0] if found else None


def test_killed_fab_leaves_the_job_running_and_the_next_fab_completes(fab: Fab):
    first = fab.start("train", *SLOW_TRAIN)
    wait_for(lambda: train_runner(fab) is not None, what="train to start")
    first.send_signal(signal.SIGKILL)  # the laptop closes: no cleanup at all
    first.wait()
    job_pid = json.loads(train_runner(fab).read_text())["pid"]
    assert Path(f"/proc/{job_pid}").exists(), "the job must outlive the fab that started it"

    second = fab("train", *SLOW_TRAIN)
    assert second.returncode == 0, second.stderr
    assert "train: already running since" in second.stdout or "train: done already" in second.stdout
    assert "export: starting" in second.stdout
    train_dir = train_runner(fab).parent
    assert (train_dir / "done").exists()
    assert list(train_dir.glob("log.*")) == []  # never started a second copy
    assert (train_dir / "log").read_text().count("[tpu-rl] starting train") == 1


def test_second_fab_refuses_while_the_first_holds_the_vm(fab: Fab):
    first = fab.start("train", *SLOW_TRAIN)
    try:
        wait_for(lambda: train_runner(fab) is not None, what="train to start")
        second = fab("train", *SLOW_TRAIN)
        assert second.returncode == 2
        assert "another fab command holds the VM" in second.stderr
        assert f"pid {first.pid} " in second.stderr  # names the holder
    finally:
        first.wait(timeout=180)
    assert first.returncode == 0


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
