"""`fab demo`, the README's command, end to end on this machine (marker maxtext): the real setup job builds the CPU
environment, then the real convert, train and export make the tiny model built to learn better, judged as a run on
a VM is judged.

One demo folder serves the module: the demo (its environment built there), then its control with no network at
all (a network namespace of its own: no SSH server, no Hub, no PyPI can be reached), then `--clean`. No token is
set anywhere: the demo must not need one. The user's jobs it copies name the tier's compile cache for train
(conftest.COMPILE_CACHE, as the tier's own runs do): what it compiled once, it loads. With the shipped jobs, that
cache is in the demo's folder (tests/unit/test_demo_jobs.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from bootstrap import secrets
from bootstrap.demo import rehearsal
from bootstrap.paths import JOBS_ENV, REPO
from bootstrap.remote import jobrunner, processes
from tests import fabfork
from tests.loopback import edit_yaml
from tests.maxtext_cpu.conftest import COMPILE_CACHE, EIGEN_ONE_THREAD

RESULT = re.compile(r"result: GSM8K accuracy ([\d.]+)% -> ([\d.]+)% \(([+-][\d.]+) points, 95% interval \+-([\d.]+)\)")


def demo(tmp: Path, *args: str, network: bool = True, task: str = "demo") -> subprocess.CompletedProcess:
    """`fab demo ARGS` (or another `task`) as a user runs it, with no Hugging Face token anywhere (another HOME, no
    token variables), and a PATH whose python3.12 may be a pyenv shim of another version (this machine's is)."""
    kept = {k: v for k, v in os.environ.items() if k not in (*secrets.HUB_TOKEN_SETTINGS, *secrets.HUB_TOKEN_ELSEWHERE)}
    env = {
        **kept,
        "HOME": str(tmp / "home"),
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),  # the wheels, kept
        rehearsal.ROOT_ENV: str(tmp / "demo"),
        JOBS_ENV: str(tmp / "jobs"),  # the user's jobs (the tmp fixture's)
        "COLUMNS": "200",
        **EIGEN_ONE_THREAD,  # the jobs' XLA, as on the tier's loopback VM
    }
    (tmp / "home").mkdir(exist_ok=True)
    argv = [fabfork.FAB, "-r", str(REPO), task, *args]
    if not network:  # a network namespace of its own: not even loopback is up
        argv = ["unshare", "--map-root-user", "--net", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)


def result(out: str) -> tuple[float, float, float, float]:
    """The result line's accuracy before, after, change and interval."""
    found = RESULT.search(out)
    assert found, out[-3000:]
    return tuple(float(group) for group in found.groups())


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    """The module's folder, with the user's jobs: the shipped ones, train compiling into the tier's cache."""
    tmp = tmp_path_factory.mktemp("demo")
    shutil.copytree(REPO / "jobs", tmp / "jobs")
    edit_yaml(tmp / "jobs" / "train.yaml", lambda data: data["args"].update(jax_cache_dir=str(COMPILE_CACHE)))
    return tmp


@pytest.fixture(scope="module")
def learns(tmp) -> subprocess.CompletedProcess:
    return demo(tmp)


@pytest.fixture(scope="module")
def control(tmp, learns) -> subprocess.CompletedProcess:
    assert learns.returncode == 0, learns.stdout[-3000:] + learns.stderr
    return demo(tmp, "--control", network=False)


def test_the_demo_makes_the_model_better_beyond_its_interval_and_the_gate_would_publish_it(tmp, learns):
    assert learns.returncode == 0, learns.stdout[-5000:] + learns.stderr
    before, after, change, interval = result(learns.stdout)
    assert change >= 50 and change > interval, learns.stdout[-3000:]
    assert after - before == pytest.approx(change, abs=0.1)
    assert "the publish gate (publish_if: improved) would publish this model" in learns.stdout
    runs = list((tmp / "demo" / "runs").glob("demo-grpo-*"))
    assert len(runs) == 1 and (runs[0] / "metrics.png").stat().st_size > 10_000  # fab metrics' plot
    assert "training steps 8/8" in learns.stdout  # the product's own progress, from train's real log
    assert f"{runs[0].name}" in learns.stdout.split("runs recorded in")[-1]  # fab runs' table lists it


def test_the_control_needs_no_network_and_no_token_and_the_gate_holds_it_back(tmp, control):
    assert control.returncode == 0, control.stdout[-5000:] + control.stderr
    _, _, change, _ = result(control.stdout)
    assert change <= 0, control.stdout[-3000:]
    assert "the publish gate would hold this model back: publish_if: improved, and it did not" in control.stdout
    listed = control.stdout.split("runs recorded in")[-1]
    assert "demo-grpo-" in listed and "demo-control-" in listed  # fab runs: both, side by side


def test_it_wrote_nothing_outside_its_folder_and_fab_sees_its_runs_after_it(tmp, learns):
    """HOME holds nothing after it (no registry of state folders, no cache); its last lines name the commands that
    show its runs again, and they do."""
    assert learns.returncode == 0, learns.stdout[-3000:] + learns.stderr
    assert not list((tmp / "home").rglob("*")), sorted((tmp / "home").rglob("*"))
    (run,) = [p.name for p in (tmp / "demo" / "runs").glob("demo-grpo-*")]
    assert f"run {run} (a new demo run) on this machine" in learns.stdout  # not "given with --run-name"
    assert "See its runs again: fab runs --demo, fab metrics --demo" in learns.stdout
    listed = demo(tmp, "--demo", "--json", task="runs")
    assert listed.returncode == 0, listed.stderr
    (row,) = [row for row in json.loads(listed.stdout) if row["run"] == run]
    assert row["state"] == "done" and row["accuracy"][1] > row["accuracy"][0]
    metrics = demo(tmp, "--demo", "--run-name", run, task="metrics")
    assert metrics.returncode == 0, metrics.stdout[-2000:] + metrics.stderr
    assert "result: GSM8K accuracy" in metrics.stdout


def test_the_demo_uses_the_users_jobs_with_only_what_a_cpu_needs_changed(tmp, learns):
    out = learns.stdout
    assert "the jobs are yours" in out and "environment: MaxText 0.2.3 for the CPU" in out
    copied = (tmp / "demo" / "jobs" / "train.yaml").read_text()
    assert "maxtext.trainers.post_train.rl.train_rl" in copied and "secrets" not in copied
    # MaxText's grader starts one worker, not one a core (min(8, cores)): the shim says each build of its pool
    (log,) = rehearsal.Folder(tmp / "demo").state.glob("runs/demo-grpo-*/train/log")
    builds = re.findall(r"\[shim\] math_verify grader pool built with (\d+) worker", log.read_text(errors="replace"))
    assert builds == ["1"], builds


def test_clean_stops_what_runs_and_removes_the_one_folder(tmp, control):
    folder = tmp / "demo"
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a job the demo left running
    job = folder / "state" / "runs" / "x" / "train"
    job.mkdir(parents=True)
    jobrunner.write_json(str(job / jobrunner.PROCESS), processes.identity(sleeper.pid))
    done = demo(tmp, "--clean")
    assert done.returncode == 0, done.stderr
    assert sleeper.wait(timeout=30) == -signal.SIGKILL
    assert not folder.exists() and f"removed {folder}" in done.stdout
