"""The narrow VM interface over a channel that misbehaves (no SSH server needed)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from bootstrap.remote.jobrunner import Layout
from bootstrap.vm import machine


class ClosedChannel:
    """A channel whose connection went during the round trip: no output, no exit status (paramiko's -1)."""

    status_event = threading.Event()
    status_event.set()
    exit_status = -1

    def sendall(self, data):
        pass

    def shutdown_write(self):
        pass

    def makefile(self, mode):
        return SimpleNamespace(read=lambda: b"")

    makefile_stderr = makefile

    def recv(self, size):
        return b""

    def recv_exit_status(self):
        return -1

    def close(self):
        pass


def vm_on(channel, monkeypatch) -> machine.Vm:
    vm = machine.Vm(SimpleNamespace(host="vm"), Layout("tpu-rl"))
    monkeypatch.setattr(vm, "_open", lambda command, timeout: channel)
    return vm


def test_a_connection_that_drops_during_a_command_is_the_connection_lost_not_its_failure(monkeypatch):
    """Was read as `train: could not start on HOST: ` (empty reason): the job may well be running."""
    vm = vm_on(ClosedChannel(), monkeypatch)
    with pytest.raises(machine.ConnectionLost, match="lost the connection to vm .*Anything started on the VM goes on"):
        vm.states(["tpu-rl/runs/r/train"])


def test_a_pipeline_stream_that_drops_is_the_connection_lost_not_its_end(monkeypatch):
    vm = vm_on(ClosedChannel(), monkeypatch)
    with pytest.raises(machine.ConnectionLost):
        list(vm.drive({"digest": "x"}))
