"""tests/fabfork.py: a forked `fab` is the `fab` a new process would be, so the tests that use it test the real one."""

from __future__ import annotations

import json
import os
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
    forked = fabfork.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (new.returncode, new.stdout, new.stderr)
    assert forked.stdout or forked.stderr


def test_each_child_takes_its_own_calls_environment_and_folder(tmp_path, monkeypatch):
    """Two calls, two run folders (TPU_RL_RUNS) and working folders: neither sees the other's, nor the server's."""
    listed = []
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        monkeypatch.setenv("TPU_RL_RUNS", str(folder / "runs"))
        RunRecord(f"run-{name}", results={}, settings=[], chips=8).save()
        env = {**os.environ, "HOME": str(folder)}
        shown = fabfork.run(
            [FAB, "-r", str(REPO), "runs", "--json"], env=env, cwd=folder, capture_output=True, text=True, timeout=120
        )
        assert shown.returncode == 0, shown.stderr
        listed.append([row["run"] for row in json.loads(shown.stdout)])
    assert listed == [["run-first"], ["run-second"]]


def test_the_server_holds_no_module_that_reads_the_environment_as_it_is_imported():
    """tpu-rl's modules (and the Hub's, Google's and Kubernetes' clients) read variables as they are imported: the
    server must import none of them, or every child would see the server's values."""
    preload = f"import importlib, sys; [importlib.import_module(m) for m in {fabfork.PRELOADED!r}]; print(*sys.modules)"
    modules = subprocess.run([sys.executable, "-c", preload], capture_output=True, text=True, check=True).stdout.split()
    assert "fabric.main" in modules and "pydantic" in modules
    kept_out = ("bootstrap", "fabfile", "huggingface_hub", "google", "kubernetes", "tests")
    assert not [m for m in modules if m.split(".")[0] in kept_out]


def test_what_python_reads_as_it_starts_gets_a_new_process(tmp_path):
    """PYTHONPATH differs from the server's: a forked child would not have read it, so fab starts anew."""
    (tmp_path / "sitecustomize.py").write_text("import sys; sys.stderr.write('site of the call\\n')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    shown = fabfork.run([FAB, "-r", str(REPO), "--list"], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stderr.startswith("site of the call")
