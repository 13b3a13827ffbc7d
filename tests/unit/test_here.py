"""This machine as the VM (vm/here.py), under the real Vm and the real VM-side tools: what fab demo stands on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from bootstrap.errors import UserError
from bootstrap.remote.jobrunner import Layout
from bootstrap.vm.here import Here
from bootstrap.vm.machine import Vm

TOKEN = "hf_" + "x" * 34  # shaped like a Hugging Face token


@pytest.fixture
def vm(tmp_path, monkeypatch) -> Vm:
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # in fab's own environment: never in a command's
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # the machine's network settings: passed
    monkeypatch.setenv("UV_INDEX_URL", "https://pypi.example/simple")  # an installer's setting: passed
    monkeypatch.setenv("UV_PUBLISH_TOKEN", "pypi-secret")  # an installer's credentials: never
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://me:tok-secret@pypi.example/simple")
    return Vm(Here({"JAX_PLATFORMS": "cpu"}), Layout(str(tmp_path / "state")))


def test_the_tools_install_and_answer_as_on_a_vm(vm, tmp_path):
    assert vm.install({"HF_TOKEN": "hf_demo"}) is None  # no current run yet
    assert {"driver.py", "jobrunner.py"} <= {p.name for p in (tmp_path / "state" / "bin").iterdir()}
    changed, ready = vm.prepare({"HF_TOKEN": "hf_demo"}, str(tmp_path / "no-marker"))
    assert changed == ["stored HF_TOKEN (readable only by the SSH user)"] and not ready
    stored = tmp_path / "state" / "secrets" / "HF_TOKEN"
    assert stored.read_text() == "hf_demo" and stored.stat().st_mode & 0o777 == 0o600
    vm.install({"HF_TOKEN": "hf_demo"})
    assert vm.prepare({"HF_TOKEN": "hf_demo"}, str(tmp_path / "no-marker"))[0] == []  # unchanged: nothing written


def test_commands_see_a_sessions_environment_not_fabs_secrets(vm):
    code, out, _ = vm.execute("env")
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert code == 0 and TOKEN not in out and "HF_TOKEN" not in seen and "secret" not in out
    assert seen["UV_INDEX_URL"] == "https://pypi.example/simple"
    assert seen["JAX_PLATFORMS"] == "cpu" and seen["HTTPS_PROXY"] == "http://proxy.example:3128"
    assert Path(vm.execute("pwd")[1].strip()) == Path.home()  # as SSH starts in the home folder


def test_a_failing_command_is_one_line_with_its_exit_and_stderr(vm):
    with pytest.raises(UserError, match=r"this machine: reading failed \(exit 3\): it broke"):
        vm.check("echo it broke >&2; exit 3", "reading")


def test_much_stderr_never_blocks_a_command(vm):
    code, out, err = vm.execute("head -c 1000000 /dev/zero | tr '\\0' e >&2; echo done")
    assert (code, out, len(err)) == (0, "done\n", 1_000_000)


def test_a_followed_stream_is_quiet_then_ends_and_closing_it_hangs_up(vm, tmp_path):
    idle, lines = [], []
    channel = vm._open("echo first; sleep 7; echo second", 5)
    from bootstrap.vm.output import lines as split

    for line in split(vm._chunks(channel, lambda: idle.append(time.monotonic()))):
        lines.append(line)
    assert lines == ["first", "second"] and idle  # a quiet stretch: on_idle, not an error
    channel = vm._open(f"sleep 600; touch {tmp_path / 'ran'}", 5)
    channel.close()  # as a closed SSH channel: the command is hung up on
    assert not (tmp_path / "ran").exists()


def test_files_travel_both_ways_relative_to_home(vm, tmp_path):
    target = tmp_path / "fetched.json"
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "x.json").write_text(json.dumps({"a": 1}))
    assert vm.read_json(str(tmp_path / "state" / "x.json")) == {"a": 1}
    vm.fetch(str(tmp_path / "state" / "x.json"), target)
    assert json.loads(target.read_text()) == {"a": 1}
    assert vm.read_text(str(tmp_path / "missing")) is None
    relative = Path.home() / f".tpu-rl-here-test-{os.getpid()}"
    try:
        with vm._sftp().open(relative.name, "w") as f:
            f.write(b"home")
        assert relative.read_text() == "home"
    finally:
        relative.unlink(missing_ok=True)
