"""A task of your own, learned for real on the CPU (marker maxtext): MaxText 0.2.5 trains the example task
(jobs/tasks/arithmetic: its template, its reward file, its measure) through its own hooks, with fab demo's settings
and the tiny model built to learn (bootstrap/demo/make_learnable_inputs.py, its tokenizer taught the task's words).

The rows are the example task's kind of problem, each of whose answers is 7: the one answer the tiny bigram model can
learn to give. The learning run's measure rises beyond its interval; the control's (a learning rate that changes no
weight) stays, and the gate holds it back. The user's reward runs on the model's real completions.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from bootstrap.demo import MAKE_LEARNABLE_INPUTS, cpu, rehearsal
from bootstrap.paths import REPO
from bootstrap.remote import evals
from tests.loopback import Fab, edit_yaml
from tests.maxtext_cpu.conftest import RELEASES, Release, cpu_fab_at, set_up

TASKS_RELEASE = "0.2.5"  # MaxText's first release with reward hooks
RESULT = re.compile(r"result: arithmetic correct ([\d.]+)% -> ([\d.]+)% \(([+-][\d.]+) points, 95% interval \+-([\d.]+)\)")


@pytest.fixture(scope="module", params=[TASKS_RELEASE])
def release(request) -> Release:
    return RELEASES[request.param]


def rows(count: int, seed: int) -> list[dict]:
    """The example task's problems, each of whose answers is 7."""
    rng, made = random.Random(seed), []
    for _ in range(count):
        a = rng.randint(8, 99)
        op, left, right = rng.choice([("+", 7 - a % 8, a % 8), ("-", a, a - 7)])
        made.append({"question": f"What is {left} {op} {right}?", "answer": "7"})
    return made


@pytest.fixture(scope="module")
def runs(cpu_host, tmp_path_factory, release: Release) -> Iterator[dict]:
    """fab setup, then the learning run and its control on the example task: what the tests below read."""
    tmp = tmp_path_factory.mktemp("own-task")
    with cpu_fab_at(cpu_host, tmp, release) as fab:
        set_up(fab, release)
        shutil.copytree(REPO / "jobs" / "tasks", fab.jobs / "tasks")
        for split, count, seed in (("train", 512, 1), ("test", 64, 2)):
            path = fab.jobs / "tasks" / "arithmetic" / f"{split}.jsonl"
            path.write_text("".join(json.dumps(row) + "\n" for row in rows(count, seed)))
        edit_yaml(fab.jobs / "pipeline.yaml", lambda data: data.update(task="arithmetic"))
        edit_yaml(fab.jobs / "pipeline.yaml", lambda data: data["results"].update(publish_if="improved"))
        texts, inputs = tmp / "texts.txt", tmp / "inputs"
        texts.write_text("\n".join(rehearsal.task_texts(fab.jobs, "arithmetic")) + "\n")
        python = release.venv / "bin" / "python"
        subprocess.run([python, MAKE_LEARNABLE_INPUTS, inputs, texts], check=True, capture_output=True)
        settings = [
            *cpu.model_overrides(inputs, gsm8k=False),
            *rehearsal.TRAIN,
            *(f"train.{setting}" for setting in release.train),
            *rehearsal.TASK_LENGTHS,
        ]
        found = {"fab": fab}
        for name, rate in (("learns", rehearsal.LEARNING_RATE), ("control", rehearsal.CONTROL_LEARNING_RATE)):
            args = [word for s in [*settings, f"train.learning_rate={rate}"] for word in ("--arg", s)]
            done = fab("train", "--run-name", name, *args, timeout=1800)
            assert done.returncode == 0, done.stdout[-5000:] + done.stderr
            found[name] = {"out": done.stdout, "args": args}
        yield found


def record(fab: Fab, run: str) -> list[dict]:
    """The evals this machine's record of the run holds."""
    return json.loads((fab.tmp / "runs" / run / "record.json").read_text())["evals"]


def result(out: str) -> tuple[float, ...]:
    found = RESULT.search(" ".join(out.split()))
    assert found, out[-3000:]
    return tuple(float(group) for group in found.groups())


def test_the_task_is_learned_beyond_its_interval_by_its_own_measure(runs):
    before, after, change, interval = result(runs["learns"]["out"])
    assert change > interval and change >= 50, runs["learns"]["out"][-3000:]
    assert after - before == pytest.approx(change, abs=0.1)
    recorded = record(runs["fab"], "learns")  # the laptop's record: the gate judges by the task's measure
    assert evals.outcome(recorded)["measure"] == "correct" and evals.held_back(recorded, "improved") is None


def test_the_control_stays_and_the_gate_holds_it_back(runs):
    _, _, change, interval = result(runs["control"]["out"])
    assert change <= interval, runs["control"]["out"][-3000:]
    held = evals.held_back(record(runs["fab"], "control"), "improved")
    assert held.startswith("publish_if: improved, and it did not: arithmetic correct")


def test_the_users_reward_scored_the_models_real_completions_and_the_table_shows_its_measure(runs):
    fab: Fab = runs["fab"]
    log = (fab.job_dir("learns", "train") / "log").read_text(errors="replace")
    assert "reward_fns: using 2 custom reward function(s)" in log  # MaxText's own line: the task's, not GSM8K's
    assert re.search(r"\[tpu-rl\] task arithmetic, Post RL Training: correct=[\d.]+%, right=\d+, total=64", log)
    table = runs["learns"]["out"][runs["learns"]["out"].index("task arithmetic evaluation") :]
    assert "before training" in table and "after training" in table and "/64)" in table


def test_fab_runs_and_fab_metrics_say_the_tasks_measure(runs):
    fab: Fab = runs["fab"]
    listed = fab("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    row = next(row for row in json.loads(listed.stdout) if row["run"] == "learns")
    assert row["measure"] == "arithmetic correct" and row["accuracy"][1] > row["accuracy"][0]
    metrics = fab("metrics", "--run-name", "learns", *runs["learns"]["args"])
    assert metrics.returncode == 0, metrics.stderr
    summary = json.loads((fab.tmp / "runs" / "learns" / "summary.json").read_text())
    assert summary["result"]["measure"] == "correct" and summary["result"]["task"] == "arithmetic"
    assert "task_value" in (fab.tmp / "runs" / "learns" / "evals.csv").read_text().splitlines()[0]
