"""tests/fabfork.py: a forked `fab` is the `fab` a new process would be, so the tests that use it test the real one."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from bootstrap.paths import REPO
from bootstrap.results.runs import RunRecord
from tests import fabfork

# Python's, pydantic-core's, or the loader's for a library
OUT_OF_MEMORY = re.compile(r"MemoryError|memory allocation of \d+ bytes failed|Cannot allocate memory")


@pytest.mark.parametrize("args", [["plan"], ["plan", "--run-name", "../x"], ["trian"], ["--list"]], ids=str)
def test_a_forked_fab_prints_and_exits_as_a_new_one(args, tmp_path):
    command = [fabfork.FAB, "-r", str(REPO), *args]
    env = {**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs"), "COLUMNS": "120"}
    new = subprocess.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    forks = fabfork.forks()
    forked = fabfork.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert fabfork.forks() == forks + 1  # not a new process after all
    assert (forked.returncode, forked.stdout, forked.stderr) == (new.returncode, new.stdout, new.stderr)
    assert forked.stdout or forked.stderr


def test_each_child_takes_its_own_calls_environment_and_folder(tmp_path, monkeypatch):
    """Two calls from one folder, each given another working folder that holds a run: TPU_RL_RUNS=runs, relative
    to it. Each lists its own run, so each child took its call's folder and variables."""
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path / name / "runs"))
        RunRecord(f"run-{name}", results={}, settings=[], chips=8).save()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TPU_RL_RUNS", "runs")
    forks, listed = fabfork.forks(), []
    for name in ("first", "second"):
        env = {**os.environ, "HOME": str(tmp_path / name)}
        shown = fabfork.run(
            [fabfork.FAB, "-r", str(REPO), "runs", "--json"], env=env, cwd=name, capture_output=True, timeout=120
        )
        assert shown.returncode == 0, shown.stderr
        listed.append([row["run"] for row in json.loads(shown.stdout)])
    assert listed == [["run-first"], ["run-second"]] and fabfork.forks() == forks + 2


# The server's imports, each variable, folder and file they read recorded: os.environ's reads and os.getcwd patched,
# and every file opened that is not a module's code or its cached bytecode (written on a first import).
PRELOAD_PROBE = """
import json, os, sys
read, environ = [], type(os.environ)
def opened(event, args):
    code = isinstance(args[0], int) or str(args[0]).endswith((".py", ".pyc", ".so")) or "__pycache__" in str(args[0])
    if event == "open" and not code:
        read.append(f"the file {args[0]}")
sys.addaudithook(opened)
for name in ("__getitem__", "get", "__contains__", "__iter__"):
    def recorded(self, *args, _name=name, _original=getattr(environ, name)):
        read.append(args[0] if args else "every variable")
        return _original(self, *args)
    setattr(environ, name, recorded)
getcwd = os.getcwd
os.getcwd = lambda: read.append("the working folder") or getcwd()
sys.path.insert(0, sys.argv[1])
from tests import fabfork
sys.path[0] = os.path.dirname(sys.executable)  # the server's, in place of its script's folder
fabfork.preload_fab()
read.clear()
fabfork.preload_tpu_rl()
print(json.dumps({"read": read, "modules": list(sys.modules)}))
"""


def test_the_server_imports_only_tpu_rl_modules_that_read_nothing_and_print_nothing_as_they_load():
    """A module the server imported is not imported again in a child: one that read a variable (faults.py's crash
    point, a timeout, the console's width), the working folder or a file as it loaded would keep the server's value in
    every child, and what it printed (a warning) a new fab prints and a child does not. The tpu-rl modules the server
    imports (and what they import) do neither; none is the Hub's, Google's or Kubernetes' client, which read theirs."""
    probe = subprocess.run(
        [sys.executable, "-I", "-c", PRELOAD_PROBE, str(REPO)], capture_output=True, text=True, check=True
    )
    found = json.loads(probe.stdout)
    assert "fabric.main" in found["modules"] and "bootstrap.jobs.spec" in found["modules"]
    read = {name for name in found["read"] if not fabfork._read_at_start(name)}
    assert not read and not probe.stderr, f"read as they loaded: {sorted(read)}; printed: {probe.stderr}"
    kept_out = ("huggingface_hub", "google", "kubernetes", "bootstrap.tasks", "bootstrap.remote.gcs")
    assert not [m for m in found["modules"] if m == "fabfile" or m.startswith(kept_out)]


@pytest.mark.parametrize(
    "root",
    [["-r", "TMP"], ["--search-root", "TMP"], ["--search-root=TMP"], ["-r=TMP"], ["-dr", "TMP"], ["-r", "."], []],
    ids=str,
)
def test_another_trees_fab_is_started_anew(root, tmp_path):
    """The server's tpu-rl modules are this tree's: a fab that looks for its fabfile elsewhere (its search root, given
    whole or relative to its working folder, or that folder) is a new process."""
    args = [word.replace("TMP", str(tmp_path)) for word in root]
    forks = fabfork.forks()
    shown = fabfork.run([fabfork.FAB, *args, "--list"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert fabfork.forks() == forks and shown.returncode != 0 and "fabfile" in shown.stderr.lower()


@pytest.mark.parametrize("variable", ["PYTHONPATH", "TZ"])
def test_what_is_read_as_a_python_starts_gets_a_new_process(variable, tmp_path):
    """A variable the server read as it started differs: a forked child would keep the server's, so fab starts anew
    (a sitecustomize.py on PYTHONPATH says that it ran)."""
    (tmp_path / "sitecustomize.py").write_text("import sys; sys.stderr.write('started anew\\n')\n")
    env = {**os.environ, variable: str(tmp_path) if variable == "PYTHONPATH" else "XYZ+3"}
    forks = fabfork.forks()
    shown = fabfork.run([fabfork.FAB, "-r", str(REPO), "--list"], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "train" in shown.stdout and fabfork.forks() == forks
    assert shown.stderr.startswith("started anew") == (variable == "PYTHONPATH")


def test_a_call_past_its_timeout_kills_the_child_and_raises_as_run_does(tmp_path):
    """fab waits on an address that answers nothing (15 s before it gives up on SSH, 30 on the Hub); the call ends at
    its 3 s timeout with run's TimeoutExpired, the child killed, and the next call is forked as before."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        env = {**os.environ, "HOME": str(tmp_path), "HF_TOKEN": "hf_" + "x" * 34, "HF_ENDPOINT": f"http://{address}"}
        command = [fabfork.FAB, "-r", str(REPO), "-H", address, "train"]
        forks = fabfork.forks()
        with pytest.raises(subprocess.TimeoutExpired) as raised:
            fabfork.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=3)
    assert raised.value.timeout == 3 and fabfork.last_exit() == -signal.SIGKILL and fabfork.forks() == forks + 1
    again = fabfork.run([fabfork.FAB, "-r", str(REPO), "--list"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "train" in again.stdout and fabfork.forks() == forks + 2


def test_a_childs_usage_is_its_own_and_an_address_space_limit_reaches_it_forked_or_new(tmp_path):
    """What test_bad_inputs.py bounds: a child's CPU-s and peak resident KiB (what it inherited and touched), the
    server's own (its imports, its resident code) apart; and RLIMIT_AS, set in the child or, started anew, before fab
    runs."""
    command, env = [fabfork.FAB, "-r", str(REPO), "plan"], {**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs")}
    planned = fabfork.run(command, env=env, capture_output=True, text=True, timeout=120)
    (cpu, rss), (start_cpu, start_files) = planned.usage, fabfork.start_usage()
    assert planned.returncode == 0 and 0 < cpu < 30 and rss > 30 * 1024 and start_cpu > 0.05 and start_files > 1024
    forks = fabfork.forks()
    limited = fabfork.run(command, env=env, capture_output=True, text=True, timeout=120, address_space=1 << 26)
    assert limited.returncode != 0 and OUT_OF_MEMORY.search(limited.stderr) and fabfork.forks() == forks + 1
    env["PYTHONPATH"] = str(tmp_path)  # read as Python starts: a new process
    new = fabfork.run(command, env=env, capture_output=True, text=True, timeout=120, address_space=1 << 26)
    assert new.returncode != 0 and OUT_OF_MEMORY.search(new.stderr) and fabfork.forks() == forks + 1
