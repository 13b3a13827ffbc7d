"""tests/fabfork.py: a forked `fab` is the `fab` a new process would be, so the tests that use it test the real one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.paths import REPO
from bootstrap.results.runs import RunRecord
from tests import fabfork

FAB = str(Path(sys.executable).with_name("fab"))


@pytest.mark.parametrize("args", [["plan"], ["plan", "--run-name", "../x"], ["trian"], ["--list"]], ids=str)
def test_a_forked_fab_prints_and_exits_as_a_new_one(args, tmp_path):
    command = [FAB, "-r", str(REPO), *args]
    env = {**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs"), "COLUMNS": "120"}
    new = subprocess.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    forks = fabfork.forks()
    forked = fabfork.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert fabfork.forks() == forks + 1  # not a new process after all
    assert (forked.returncode, forked.stdout, forked.stderr) == (new.returncode, new.stdout, new.stderr)
    assert forked.stdout or forked.stderr


def test_each_child_takes_its_own_calls_environment_and_folder(tmp_path, monkeypatch):
    """Two calls, each with its working folder holding a run: TPU_RL_RUNS=runs, relative to it. Each lists its own."""
    listed = []
    monkeypatch.setenv("TPU_RL_RUNS", "runs")
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        monkeypatch.chdir(folder)
        RunRecord(f"run-{name}", results={}, settings=[], chips=8).save()
        env = {**os.environ, "HOME": str(folder)}
        shown = fabfork.run(
            [FAB, "-r", str(REPO), "runs", "--json"], env=env, cwd=folder, capture_output=True, timeout=120
        )
        assert shown.returncode == 0, shown.stderr
        listed.append([row["run"] for row in json.loads(shown.stdout)])
    assert listed == [["run-first"], ["run-second"]]


def test_the_server_imports_no_tpu_rl_module_nor_a_client_that_reads_variables_as_it_loads():
    """tpu-rl's modules (and the Hub's, Google's and Kubernetes' clients) read variables as they are imported: the
    server must import none of them, or every child would see the server's values."""
    preload = f"import importlib, sys; [importlib.import_module(m) for m in {fabfork.PRELOADED!r}]; print(*sys.modules)"
    modules = subprocess.run([sys.executable, "-c", preload], capture_output=True, text=True, check=True).stdout.split()
    assert "fabric.main" in modules and "pydantic" in modules
    kept_out = ("bootstrap", "fabfile", "huggingface_hub", "google", "kubernetes", "tests")
    assert not [m for m in modules if m.split(".")[0] in kept_out]


@pytest.mark.parametrize("variable", ["PYTHONPATH", "TZ"])
def test_what_is_read_as_a_python_starts_gets_a_new_process(variable, tmp_path):
    """A variable the server read as it started differs: a forked child would keep the server's, so fab starts anew
    (a sitecustomize.py on PYTHONPATH says that it ran)."""
    (tmp_path / "sitecustomize.py").write_text("import sys; sys.stderr.write('started anew\\n')\n")
    env = {**os.environ, variable: str(tmp_path) if variable == "PYTHONPATH" else "XYZ+3"}
    forks = fabfork.forks()
    shown = fabfork.run([FAB, "-r", str(REPO), "--list"], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "train" in shown.stdout and fabfork.forks() == forks
    assert shown.stderr.startswith("started anew") == (variable == "PYTHONPATH")


def test_a_call_past_its_timeout_raises_as_run_does_and_the_next_call_is_served(tmp_path):
    """fab waits on an address that answers nothing; the call ends at its timeout with run's TimeoutExpired."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        env = {**os.environ, "HOME": str(tmp_path), "HF_TOKEN": "hf_" + "x" * 34, "HF_ENDPOINT": f"http://{address}"}
        command = [FAB, "-r", str(REPO), "-H", address, "train"]
        with pytest.raises(subprocess.TimeoutExpired) as raised:
            fabfork.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=3)
    assert raised.value.timeout == 3 and isinstance(raised.value.stderr, bytes)  # bytes, as run's on POSIX
    again = fabfork.run([FAB, "-r", str(REPO), "--list"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "train" in again.stdout
