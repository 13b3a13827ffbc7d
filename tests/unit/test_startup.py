"""The real bootstrap/startup.sh, in a throwaway root with a stand-in apt-get (tests/startupscript.py):
apt's lock on a first boot, a mirror's hiccup, a failing step's record, uv pinned by hash."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from bootstrap.jobs import environment
from bootstrap.jobs.spec import EnvironmentSpec, VmSpec
from bootstrap.paths import REPO
from bootstrap.remote import facts
from bootstrap.vm import startup
from tests.startupscript import SCRIPT, StartupRoot


@pytest.fixture
def vm(tmp_path) -> StartupRoot:
    root = StartupRoot(tmp_path)
    root.with_uv(environment.UV_MIN)  # the install step keeps it: no download in these tests
    return root


def record(vm: StartupRoot) -> startup.Startup:
    """The failure record as fab reads it (the line remote/facts.py answers for it)."""
    return startup.parse(facts.startup_line(str(vm.marker), str(vm.failed)))


def test_a_lock_held_for_a_while_is_waited_out(vm: StartupRoot):
    """unattended-upgrades holds dpkg's lock for 2 s after boot: every apt call waits for it (the timeout
    passed to apt), and the script finishes without a failure."""
    (vm.root / "lock").write_text(str(time.time() + 2))
    began = time.monotonic()
    result = vm.run(TPU_RL_APT_LOCK_SECONDS="60", STANDIN_LOCK_UNTIL=str(vm.root / "lock"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.monotonic() - began >= 2  # it did wait: the lock was held that long
    assert vm.marker.exists() and not vm.failed.exists()
    assert [call.split()[:3] for call in vm.calls] == [
        ["-o", "DPkg::Lock::Timeout=60", c] for c in ("update", "upgrade", "install")
    ]


def test_a_lock_held_past_the_bound_leaves_the_failure_record(vm: StartupRoot):
    (vm.root / "lock").write_text(str(time.time() + 3600))
    result = vm.run(TPU_RL_APT_LOCK_SECONDS="1", TPU_RL_APT_TRIES="2", STANDIN_LOCK_UNTIL=str(vm.root / "lock"))
    assert result.returncode == 100
    assert not vm.marker.exists()
    found = record(vm)
    assert (found.state, found.step, found.exit_code) == (startup.StartupState.FAILED, "apt update", 100)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", found.at)
    assert len(vm.calls) == 2  # tried twice, then given up: bounded
    assert "It is held by process 4242 (unattended-upgr)" in vm.log.read_text()


def test_a_failing_install_leaves_its_step_in_the_record(vm: StartupRoot):
    result = vm.run(STANDIN_FAIL="install", TPU_RL_APT_TRIES="3")
    assert result.returncode == 100 and not vm.marker.exists()
    assert record(vm).step.startswith("system packages") and not vm.marker.exists()  # fab reads failed, not done
    assert [c.split()[2] for c in vm.calls] == ["update", "upgrade", "install", "install", "install"]


def test_a_mirror_hiccup_is_tried_again(vm: StartupRoot):
    result = vm.run(STANDIN_FAIL_ONCE="update")
    assert result.returncode == 0, result.stdout + result.stderr
    assert vm.marker.exists() and not vm.failed.exists()
    assert [c.split()[2] for c in vm.calls] == ["update", "update", "upgrade", "install"]
    assert "apt-get update exited 100 (try 1 of 3); trying again" in vm.log.read_text()


def test_a_run_after_a_failure_clears_the_record_and_a_run_after_success_does_nothing(vm: StartupRoot):
    assert vm.run(STANDIN_FAIL="update", TPU_RL_APT_TRIES="1").returncode == 100
    assert vm.failed.exists()
    assert vm.run().returncode == 0
    assert vm.marker.exists() and not vm.failed.exists()
    calls, marker = vm.calls, vm.marker.read_text()
    again = vm.run(STANDIN_FAIL="update")  # would fail, if it did anything
    assert again.returncode == 0 and vm.calls == calls and vm.marker.read_text() == marker
    assert "nothing to do" in again.stdout


def test_an_older_uv_is_replaced_by_the_pinned_one_verified_by_its_hash(tmp_path):
    """The real pip, from the package index, in hash-checking mode: the pinned hashes are the release's."""
    vm = StartupRoot(tmp_path)
    vm.with_uv("0.9.0")
    result = vm.run()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert f"uv {environment.UV_MIN} (" in vm.log.read_text()
    assert (vm.root / "bin" / "uv").stat().st_size > 10_000_000  # the real binary, not the stand-in


def test_the_pinned_uv_is_the_one_the_tests_use_and_the_setup_job_asks_for():
    pinned = re.search(r"^UV_VERSION=(\S+)$", SCRIPT.read_text(), re.M).group(1)
    locked = re.search(r"^uv==(\S+)$", (REPO / "requirements-dev.lock").read_text(), re.M).group(1)
    assert pinned == locked == environment.UV_MIN


def test_the_script_paths_are_the_jobs_defaults():
    text, defaults = SCRIPT.read_text(), VmSpec()
    assert f"TPU_RL_STARTUP_MARKER:-{defaults.startup_marker}}}" in text
    assert f"TPU_RL_STARTUP_LOG:-{defaults.startup_log}}}" in text


def test_fab_reads_each_state_of_the_script():
    assert startup.parse("x\nstartup done 2026-12-02T08:00:00Z\n").describe() == "done at 2026-12-02T08:00:00Z"
    assert startup.parse("startup running").state is startup.StartupState.RUNNING
    failed = startup.parse('startup failed {"step": "apt update", "exit_code": 100, "at": "T"}')
    assert failed.describe() == "failed at step 'apt update' (exit 100, T)"
    assert startup.parse("startup failed {not json").state is startup.StartupState.FAILED
    message = str(startup.failed("vm", failed, "/var/log/x.log", ["E: Could not get lock", ""]))
    assert "\n" not in message and "E: Could not get lock" in message and startup.RERUN in message


@pytest.mark.parametrize(
    ("version", "refused"), [("0.9.0", True), ("0.13.8", True), ("0.13.9", False), ("0.14.0", False)]
)
def test_the_setup_job_refuses_an_older_uv_in_one_line(tmp_path, version, refused):
    """The setup job's own script with a uv of `version` first on PATH (a stand-in that only answers
    --version, and fails anything else, so that a uv it accepts stops at the next step)."""
    (tmp_path / "bin").mkdir()
    uv = tmp_path / "bin" / "uv"
    uv.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "uv {version}" && exit 0\nexit 9\n')
    uv.chmod(0o755)
    env_spec = EnvironmentSpec(packages=["maxtext==0.2.3"], venv=str(tmp_path / "venv"))
    script = environment.setup_script(env_spec, str(tmp_path / "ready"))
    result = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and not (tmp_path / "ready").exists()
    message = f"the VM has uv {version}; the jobs need uv {environment.UV_MIN} or newer"
    assert (message in result.stderr) is refused, result.stderr
    if refused:
        assert result.stderr.strip().count("\n") == 0 and startup.RERUN in result.stderr


def test_a_vm_prepared_with_another_uv_runs_the_script_again(tmp_path):
    """The marker of an older script, whose uv is not the pinned one: re-running it (the setup job's advice)
    does the steps again instead of saying "nothing to do"."""
    vm = StartupRoot(tmp_path)
    vm.with_uv("0.9.0")
    vm.marker.write_text("2026-01-01T00:00:00Z\n")
    result = vm.run(STANDIN_FAIL="install", TPU_RL_APT_TRIES="1")  # stops before the download: no network
    assert result.returncode == 100 and "nothing to do" not in result.stdout
    assert record(vm).step.startswith("system packages") and not vm.marker.exists()  # fab reads failed, not done
