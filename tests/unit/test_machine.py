"""The narrow VM interface over a channel that misbehaves (no SSH server needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bootstrap.jobs.plan import PlannedJob, runner_spec
from bootstrap.remote.jobrunner import Layout
from bootstrap.vm import machine


class ClosedChannel:
    """A channel whose connection went during the round trip: no output, no exit status (paramiko's -1)."""

    def sendall(self, data):
        pass

    def shutdown_write(self):
        pass

    def makefile(self, mode):
        return SimpleNamespace(read=lambda: b"")

    makefile_stderr = makefile

    def recv_exit_status(self):
        return -1

    def close(self):
        pass


def test_a_connection_that_drops_during_launch_is_the_connection_lost_not_a_failed_start(monkeypatch):
    """Was read as `train: could not start on HOST: ` (empty reason): the job may well be running."""
    vm = machine.Vm(SimpleNamespace(host="vm"), Layout("tpu-rl"))
    monkeypatch.setattr(vm, "_open", lambda command, timeout: ClosedChannel())
    layout = Layout("tpu-rl")
    job = PlannedJob("train", "tpu-rl/runs/r/train", runner_spec(layout, "train", ["true"], ["out"]))
    with pytest.raises(machine.ConnectionLost, match="lost the connection to vm .*Anything started on the VM goes on"):
        vm.launch(job)
    vm.held = SimpleNamespace(lost=machine.threading.Event())  # while the lock lived on this connection
    with pytest.raises(machine.LockLost, match="lost the VM's lock"):
        vm.launch(job)
