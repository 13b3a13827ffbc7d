"""The narrow VM interface over a channel that misbehaves (no SSH server needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
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


class AnsweringChannel(ClosedChannel):
    """A command's channel that answers `out` and exits 0; `ended`: its command ended before it was asked."""

    def __init__(self, out: bytes = b"", ended: bool = False):
        self.out, self.ended, self.closed = out, ended, False

    def makefile(self, mode):
        return SimpleNamespace(read=lambda: self.out)

    def makefile_stderr(self, mode):
        return SimpleNamespace(read=lambda: b"")

    def recv_exit_status(self):
        return 0

    def exit_status_ready(self):
        return self.ended

    def close(self):
        self.closed = True


@pytest.mark.parametrize("ended", [False, True], ids=["waiting", "ended"])
def test_the_first_look_uses_facts_started_ahead_unless_it_ended(monkeypatch, ended: bool):
    """Started by the dial while the jobs were checked: its request goes there, no command more. One that ended
    first (python3 being replaced on the VM) is started again, so its own error is what fab says."""
    ahead = AnsweringChannel(b'{"ahead": true}', ended=ended)
    started = []
    monkeypatch.setattr(
        machine, "_exec", lambda conn, command, timeout: started.append(command) or AnsweringChannel(b"{}")
    )
    vm = machine.Vm(SimpleNamespace(host="vm"), Layout("tpu-rl"), asking=ahead)
    assert vm.ask({}, "looking") == ({} if ended else {"ahead": True})
    assert started == ([machine.FACTS_COMMAND] if ended else []) and ahead.closed
    vm.ask({}, "looking again")  # started ahead only for the first look
    assert len(started) == (2 if ended else 1)


class LocalVm(machine.Vm):
    """The VM side run here for real, from `home` as an SSH session starts: each command through a shell, and
    SFTP on the same folder. `put` hooks the SFTP uploads (another fab writing the same tool at once)."""

    def __init__(self, home: Path, put=None):
        super().__init__(SimpleNamespace(host="vm"), Layout("state"))
        self.home, self.put, self.commands = home, put, 0

    def execute(self, command: str, stdin: bytes | None = None, meanwhile=None) -> tuple[int, str, str]:
        self.commands += 1
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home)}
        if meanwhile is not None:  # as the request goes (its order: the Recording channel below)
            meanwhile()
        done = subprocess.run(["/bin/sh", "-c", command], input=stdin, cwd=self.home, env=env, capture_output=True)
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    def _sftp(self):
        home, put = self.home, self.put

        class Sftp:
            def put(self, local, remote):
                shutil.copyfile(local, home / remote)
                if put:
                    put(home / remote)

            def posix_rename(self, old, new):
                os.replace(home / old, home / new)

        return Sftp()


def test_a_new_vm_gets_the_tools_then_is_woken_by_them_with_the_states_read(tmp_path):
    vm = LocalVm(tmp_path)
    assert vm.install(read_ahead=("job",)) is None  # no run of its own yet
    for tool in machine.TOOLS:
        assert (tmp_path / "state" / "bin" / tool).read_bytes() == (machine.REMOTE_SCRIPTS / tool).read_bytes()
    assert vm.pipeline is None and [s.state.value for s in vm.states_read_ahead(["job"])] == ["pending"]
    assert vm.commands == 2  # the look, then the look with the tools put
    vm.install(read_ahead=("job",))
    assert vm.commands == 3  # tools current: one round trip


def test_the_commands_own_work_runs_once_its_request_is_out_and_only_once(tmp_path):
    """A session imports what follows while the VM answers the install (tasks/sessions.py). Begun before the
    request went out, it held the request back: one interpreter runs either at a time."""
    vm, calls = LocalVm(tmp_path), []

    def meanwhile():
        calls.append(vm.commands)

    vm.install(read_ahead=("job",), meanwhile=meanwhile)  # a new VM: the look, then the look with the tools put
    assert vm.commands == 2 and calls == [1]  # during the first round trip, not again
    order = []

    class Recording(AnsweringChannel):
        def sendall(self, data):
            order.append("request")

        def makefile(self, mode):
            order.append("answer read")
            return super().makefile(mode)

    machine.Vm(SimpleNamespace(host="vm"), Layout("tpu-rl"), asking=Recording(b"{}")).ask(
        {}, "looking", lambda: order.append("meanwhile")
    )
    assert order == ["request", "meanwhile", "answer read"]


def test_tools_that_change_again_as_they_are_put_are_never_woken(tmp_path):
    """Another fab of another version puts its own driver at the same time: this one refuses, in one line."""
    vm = LocalVm(tmp_path, put=lambda path: path.write_text(path.read_text() + "# another version\n"))
    with pytest.raises(machine.UserError, match="tools in state/bin changed again as they were put there"):
        vm.install()
    assert not (tmp_path / "state" / "pipeline").exists()


def test_waiting_for_the_startup_script_shows_its_log_and_rides_out_a_look_that_fails(tmp_path, monkeypatch):
    """python3 may be replaced under the script's apt upgrade: a look that fails is tried again; the log is shown
    as it grows, the wait said once; a failure ends it with the log's last lines."""
    vm, said = LocalVm(tmp_path), []
    marker, log = tmp_path / "startup.done", tmp_path / "startup.log"
    looks = iter(["fails", "first", "second", "failed"])
    real_ask = vm.ask

    def ask(request, what):
        look = next(looks)
        if look == "fails":
            raise machine.UserError("vm: reading the startup script's state failed (exit 127): python3: not found")
        log.write_text(log.read_text() + f"{look} line\n" if log.exists() else f"{look} line\n")
        if look == "failed":
            (tmp_path / "startup.failed").write_text('{"step": "system packages", "exit_code": 100, "at": "T"}')
        return real_ask(request, what)

    monkeypatch.setattr(vm, "ask", ask)
    monkeypatch.setattr(machine.time, "sleep", lambda seconds: None)
    console = SimpleNamespace(print=lambda text, **_: said.append(text))
    with pytest.raises(
        machine.UserError, match="failed at step 'system packages'.*first line / second line / failed line"
    ):
        vm.wait_for_startup(str(marker), str(log), console)
    assert said == [
        f"vm: waiting for the startup script ({marker})",
        "  startup | first line",
        "  startup | second line",
    ]
