"""remote/facts.py as the VM runs it: `python3 -c` with its source, by the system's python3, in the SSH user's
home, the request on stdin: a fresh VM, current tools, an old tool that must never run, the startup script."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap.remote.facts import LOG_CHUNK, WARMED
from bootstrap.remote.jobrunner import Layout
from bootstrap.vm.machine import FACTS_COMMAND, REMOTE_SCRIPTS, TOOLS

TOOL_DIGESTS = {tool: hashlib.sha256((REMOTE_SCRIPTS / tool).read_bytes()).hexdigest() for tool in TOOLS}


def state(root: str) -> dict:
    """The state folder's part of a request, as Vm.install sends it (jobrunner.Layout's paths)."""
    layout = Layout(root)
    private = [layout.root, layout.bin, layout.secrets]
    return {"root": root, "private": private, "bin": layout.bin, "current_run": layout.current_run}


def ask(home: Path, request: dict) -> dict:
    """The answer, as `Vm.ask` gets it over SSH (the command through a shell; relative paths in the home folder,
    wherever the shell starts)."""
    done = subprocess.run(
        ["/bin/sh", "-c", FACTS_COMMAND],
        input=json.dumps(request),
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path


def test_a_fresh_vm_gets_its_private_folders_and_nothing_is_woken(home: Path):
    """Nothing of tpu-rl's there yet, and modules in the home folder (a job's stray json.py) shadow nothing."""
    (home / "hashlib.py").write_text("raise SystemExit('the home folder shadowed the standard library')\n")
    (home / "state").mkdir(mode=0o755)  # an old state folder others could read
    found = ask(home, {"state": state("state"), "tools": TOOL_DIGESTS, "secrets": ["state/secrets/HF_TOKEN"]})
    assert found == {"tools": {}, "current_run": None, "secrets": {}}  # no pipeline: the tools come first
    for folder in ("state", "state/bin", "state/secrets"):
        assert (home / folder).stat().st_mode & 0o777 == 0o700


def test_with_the_laptops_tools_the_pipeline_is_woken_with_the_states_read_ahead(home: Path):
    shutil.copytree(REMOTE_SCRIPTS, home / "state" / "bin", ignore=shutil.ignore_patterns("__pycache__"))
    (home / "state" / "current-run").write_text("run-1\n")
    (home / "state" / "pipeline").mkdir()  # a pipeline ran here: a fab command puts its autostop off again
    (home / "job").mkdir()
    (home / "state" / "secrets").mkdir()
    (home / "state" / "secrets" / "HF_TOKEN").write_text("hf_x")
    (home / "state" / "secrets" / "HF_TOKEN").chmod(0o644)
    found = ask(
        home,
        {"state": state("state"), "tools": TOOL_DIGESTS, "read_ahead": ["job"], "secrets": ["state/secrets/HF_TOKEN"]},
    )
    assert found["tools"] == TOOL_DIGESTS and found["current_run"] == "run-1"
    assert found["pipeline"] is None and (home / "state" / "pipeline" / "seen").exists()  # woken: seen now
    assert [job["state"] for job in found["states"]] == ["pending"]
    token = {"digest": hashlib.sha256(b"hf_x").hexdigest(), "mode": "644"}
    assert found["secrets"] == {"state/secrets/HF_TOKEN": token}


def test_a_tool_just_put_is_run_from_its_source_not_an_old_cached_copy(home: Path):
    """Python takes a cached copy as current when the source's size and second match: a tool of the same size put
    within the second of the last one must not run the last one's code."""
    bin_dir = home / "state" / "bin"
    shutil.copytree(REMOTE_SCRIPTS, bin_dir, ignore=shutil.ignore_patterns("__pycache__"))
    ran = home / "an-old-driver-ran"
    cache = (  # the VM's python3 caches other code for driver.py's very size and second
        "import importlib.util, importlib._bootstrap_external as b, os, sys; source = sys.argv[1]; st = os.stat(source)\n"
        "path = importlib.util.cache_from_source(source); os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "code = compile(sys.argv[2], source, 'exec')\n"
        "open(path, 'wb').write(b._code_to_timestamp_pyc(code, st.st_mtime, st.st_size))\n"
    )
    old_driver = f"open({str(ran)!r}, 'w').close()"
    subprocess.run(["/usr/bin/python3", "-c", cache, str(bin_dir / "driver.py"), old_driver], check=True)
    found = ask(home, {"state": {**state("state"), "put": ["driver.py"]}, "tools": TOOL_DIGESTS})
    assert found["pipeline"] is None and not ran.exists()


def test_an_old_tool_is_never_run(home: Path):
    """One tool differs from the laptop's: the answer says which, and no tool's code ran (the old driver would
    have left its mark)."""
    shutil.copytree(REMOTE_SCRIPTS, home / "state" / "bin", ignore=shutil.ignore_patterns("__pycache__"))
    old = home / "state" / "bin" / "driver.py"
    old.write_text(f"open({str(home / 'old-driver-ran')!r}, 'w').close()\n" + old.read_text())
    found = ask(home, {"state": state("state"), "tools": TOOL_DIGESTS, "read_ahead": ["job"]})
    assert found["tools"]["driver.py"] != TOOL_DIGESTS["driver.py"] and "pipeline" not in found
    assert not (home / "old-driver-ran").exists()


def test_the_startup_script_and_its_log(home: Path):
    marker, failed, log = home / "startup.done", home / "startup.failed", home / "startup.log"
    request = {"startup": {"marker": str(marker), "failure_record": str(failed)}}
    log.write_bytes(b"one\ntwo\n")
    with_log = {**request, "log": {"path": str(log), "offset": 4}}
    found = ask(home, with_log)
    assert found.pop("booted") == pytest.approx(time.time() - float(Path("/proc/uptime").read_text().split()[0]), abs=2)
    assert found == {"secrets": {}, "startup": "startup running", "log": {"text": "two\n", "end": 8}}
    failed.write_text('{"step": "system packages",\n "exit_code": 100}\n')
    assert ask(home, request)["startup"] == 'startup failed {"step": "system packages", "exit_code": 100}'
    log.write_bytes(b"x" * 3 * LOG_CHUNK + b"\nE: the last line\n")  # a failed script's log: its end, not all of it
    tail = ask(home, {**request, "log": {"path": str(log), "offset": 0}})["log"]
    assert tail["text"].endswith("E: the last line\n") and len(tail["text"]) == LOG_CHUNK
    marker.write_text("2026-12-03T10:00:00Z\n")
    assert ask(home, request)["startup"] == "startup done 2026-12-03T10:00:00Z"  # the marker wins


def test_started_ahead_and_never_asked_it_changes_nothing(home: Path):
    """fab starts facts.py while it checks its jobs (vm/dial.py); a command whose checks fail closes it unasked."""
    (home / "state").mkdir(mode=0o755)
    done = subprocess.run(
        ["/bin/sh", "-c", FACTS_COMMAND],
        input="",
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert sorted(p.name for p in home.rglob("*")) == ["state"] and (home / "state").stat().st_mode & 0o777 == 0o755


def test_the_tools_slow_standard_library_is_loaded_before_the_request_comes(home: Path):
    """Started ahead (vm/dial.py), facts.py loads what the tools import slowly while fab still checks its jobs;
    each module it warms is one the tools import (a stale name would cost the VM for nothing)."""
    argv = shlex.split(FACTS_COMMAND)
    argv[1:1] = ["-X", "importtime"]  # what the interpreter imported, on stderr
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    started = subprocess.run(argv, input="", env=env, cwd=home, capture_output=True, text=True, timeout=60)  # no ask
    assert started.returncode == 0, started.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in started.stderr.splitlines()}
    assert WARMED and set(WARMED) <= loaded
    script = "import sys; sys.path.insert(0, sys.argv[1]); import driver, inventory, jobrunner; print(*sys.modules)"
    argv = ["python3", "-I", "-c", script, str(REMOTE_SCRIPTS)]
    tools = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert set(WARMED) <= set(tools.stdout.split()), tools.stderr
    assert "logging" not in tools.stdout.split()  # train's eval recorder alone needs it (eval_recorder.py)
