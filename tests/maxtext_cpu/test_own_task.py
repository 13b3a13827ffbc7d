"""A task of your own, learned for real on the CPU (marker maxtext): MaxText 0.2.5 trains the example task
(jobs/tasks/arithmetic: its template, its reward file, its measure) through its own hooks, with fab demo's settings
(the prompts' room fit to the example's) and the tiny model built to learn (bootstrap/demo/make_learnable_inputs.py,
its tokenizer taught the task's words).

The rows are the example task's kind of problem, each of whose answers is 7: the one answer the tiny bigram model can
learn to give. The learning run's measure rises beyond its interval; the control's (a learning rate that changes no
weight) stays, and the gate holds it back. The user's reward runs on the model's real completions.

The same runs prove a run's health (remote/health.py): the smoke rollout passes and the sampler-trainer agreement is
near 1 on the healthy runs; a model whose weights were broken on purpose is stopped by the smoke rollout before any
step; a learning rate that makes the loss NaN is stopped within steps, its checkpoint kept, its receiver told, the
run shown stopped, and a later fab train does not forget it.
"""

from __future__ import annotations

import csv
import json
import random
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from bootstrap.demo import MAKE_LEARNABLE_INPUTS, cpu, rehearsal
from bootstrap.paths import REPO
from bootstrap.remote import evals, jobrunner
from tests.loopback import Fab, edit_yaml, wait_for
from tests.maxtext_cpu.conftest import HERE, RELEASES, Release, cpu_fab_at, set_up
from tests.webhook import Receiver

TASKS_RELEASE = "0.2.5"  # MaxText's first release with reward hooks
HOOK = "TPU_RL_TEST_HOOK"  # results.notify's receiver: told when a rule stops a run
AGREEMENT = "sampler_trainer/train/token_mult_prob_error"
# The control's weights never move (rehearsal.CONTROL_LEARNING_RATE rounds away), so its steps after the first two
# would show nothing more: it stops at 2, a step that checkpoints, and saves the tier 6 steps' rollouts.
CONTROL = ("vars.num_batches=2", "train.checkpoint_period=2")
# The stopped runs' evals before training, on 16 problems instead of 64: enough for the smoke rollout to see a broken
# model, and the loss goes NaN whatever the eval holds.
SMALL_EVAL = "train.eval_batch_size=16"
# The example task's prompts are 39 to 41 tokens in the tiny tokenizer, chat template included: room for 64 and the
# answer chain's 16, where the demo keeps 192 for any task's (rehearsal.TASK_LENGTHS), a forward pass 2.6x as long.
# MaxText drops a row whose prompt is longer: the eval's total=64 below says that none was.
EXAMPLE_LENGTHS = ("train.max_prefill_predict_length=64", "train.max_target_length=80")
RESULT = re.compile(
    r"result: arithmetic correct ([\d.]+)% -> ([\d.]+)% \(([+-][\d.]+) points, 95% interval \+-([\d.]+)\)"
)


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
    """fab setup, then the learning run and its control on the example task: what the tests below read. MaxText's
    validator and the environment check run before the learning run's train only: every run after it changes values
    of the same arguments, in the same environment."""
    tmp = tmp_path_factory.mktemp("own-task")
    with cpu_fab_at(cpu_host, tmp, release) as fab:
        set_up(fab, release)
        shutil.copytree(REPO / "jobs" / "tasks", fab.jobs / "tasks")
        for split, count, seed in (("train", 512, 1), ("test", 64, 2)):
            path = fab.jobs / "tasks" / "arithmetic" / f"{split}.jsonl"
            path.write_text("".join(json.dumps(row) + "\n" for row in rows(count, seed)))
        edit_yaml(fab.jobs / "pipeline.yaml", lambda data: data.update(task="arithmetic", health={"smoke_right": 0}))
        receiver = Receiver()
        fab.secrets[HOOK] = receiver.url
        edit_yaml(fab.jobs / "pipeline.yaml", lambda data: data["results"].update(publish_if="improved", notify=[HOOK]))
        texts, inputs = tmp / "texts.txt", tmp / "inputs"
        texts.write_text("\n".join(rehearsal.task_texts(fab.jobs, "arithmetic")) + "\n")
        python = release.venv / "bin" / "python"
        subprocess.run([python, MAKE_LEARNABLE_INPUTS, inputs, texts], check=True, capture_output=True)
        settings = [
            *cpu.model_overrides(inputs, gsm8k=False),
            *rehearsal.TRAIN,
            *(f"train.{setting}" for setting in release.train),
            *EXAMPLE_LENGTHS,
        ]
        found = {"fab": fab, "receiver": receiver, "inputs": inputs}
        for name, rate, more in (
            ("learns", rehearsal.LEARNING_RATE, ()),
            ("control", rehearsal.CONTROL_LEARNING_RATE, CONTROL),
        ):
            args = [word for s in [*settings, f"train.learning_rate={rate}", *more] for word in ("--arg", s)]
            done = fab("train", "--run-name", name, *args, timeout=1800)
            assert done.returncode == 0, done.stdout[-5000:] + done.stderr
            found[name] = {"out": done.stdout, "args": args}
            if name == "learns":
                edit_yaml(
                    fab.jobs / "pipeline.yaml", lambda d: d["vm"].update(validate_args=False, check_environment=False)
                )
        found["settings"] = settings
        yield found
        receiver.close()


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
    (validated,) = (runs["fab"].tmp / "state" / "shared").glob("validate-*")  # this run's, before its train
    assert re.fullmatch(r"[1-9]\d* jobs accepted, the environment proven\n", (validated / "accepted").read_text())


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


def test_the_healthy_runs_passed_the_smoke_rollout_and_the_sampler_agreed_with_the_trainer(runs):
    """0.2.5: the agreement of each step is in metrics.csv, near 1 (the CPU sampler shares the trainer's model)."""
    fab: Fab = runs["fab"]
    log = (fab.job_dir("learns", "train") / "log").read_text(errors="replace")
    assert "[tpu-rl] health: the smoke rollout passed: 64 answers before training" in log
    assert f"[tpu-rl] health: the sampler and the trainer agreed over {rehearsal.STEPS} steps" in log
    metrics = fab("metrics", "--run-name", "learns", *runs["learns"]["args"])
    assert metrics.returncode == 0, metrics.stderr
    with (fab.tmp / "runs" / "learns" / "metrics.csv").open() as f:
        agreement = [float(row[AGREEMENT]) for row in csv.DictReader(f) if row.get(AGREEMENT)]
    assert len(agreement) == rehearsal.STEPS and all(1.0 <= value < 1.01 for value in agreement), agreement


def test_a_model_broken_on_purpose_is_stopped_by_the_smoke_rollout_before_any_step(runs, release: Release):
    """The converted model's every answer is one token again and again (its output layer broken): train is stopped
    before its first step, said with the answers, and the pipeline is stopped, not failed."""
    fab: Fab = runs["fab"]
    broken = fab.tmp / "broken_model"
    script = HERE / "break_model.py"
    subprocess.run([release.venv / "bin" / "python", script, runs["inputs"] / "hf_model", broken], check=True)
    args = [word for s in [*runs["settings"], f"convert.--hf_model_path={broken}", SMALL_EVAL] for word in ("--arg", s)]
    done = fab("train", "--run-name", "broken", *args, timeout=1800)
    assert done.returncode == 2, done.stdout[-3000:]
    assert "train stopped on 127.0.0.1 by a health rule: [tpu-rl] health: stopped at step 0: the model's answers " \
           "before training repeat one token" in " ".join(done.stderr.split())  # fmt: skip
    log = (fab.job_dir("broken", "train") / "log").read_text(errors="replace")
    assert "Train step 1 " not in log and "Starting RL training" not in log


def test_a_loss_gone_nan_is_stopped_its_checkpoint_kept_told_shown_and_not_forgotten(runs):
    """A learning rate of 1e30: the KL rule stops it first (at step 2 here), so it is off for this run, and the loss
    or the reward gone NaN stops it a step later."""
    fab: Fab = runs["fab"]
    settings = [*runs["settings"], "train.learning_rate=1e30", "train.checkpoint_period=1", SMALL_EVAL]
    args = [word for s in settings for word in ("--arg", s)]
    pipeline = fab.jobs / "pipeline.yaml"
    kept = pipeline.read_text()
    edit_yaml(pipeline, lambda data: data["health"].update(kl_max=0))
    try:
        done = fab("train", "--run-name", "diverges", *args, timeout=1800)
    finally:
        pipeline.write_text(kept)
    assert done.returncode == 2 and "by a health rule" in done.stderr, done.stdout[-3000:] + done.stderr
    log = (fab.job_dir("diverges", "train") / "log").read_text(errors="replace")
    stopped = re.search(r"\[tpu-rl\] health: stopped at step (\d+): \S+ is nan at step \d+: the run diverged", log)
    assert stopped and int(stopped[1]) <= 4, log[-3000:]
    committed = re.search(r"its last committed checkpoint: step (\d+)", log)
    actor = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "post-train" / "diverges" / "checkpoints" / "actor"
    assert committed and int(committed[1]) in jobrunner.finished_steps(str(actor))  # kept

    def told() -> list[dict]:
        return [p["body"] for p in runs["receiver"].posts if p["body"].get("state") == "stopped" and
                p["body"].get("run") == "diverges"]  # fmt: skip

    wait_for(told, 60, "the stop told")
    assert len(told()) == 1 and "train stopped by a health rule" in told()[0]["text"]
    listed = json.loads(fab("runs", "--json").stdout)
    (row,) = [row for row in listed if row["run"] == "diverges"]
    assert row["state"] == "train stopped" and row["stopped"]["rule"] == "nan"
    again = fab("train", "--run-name", "diverges", *args, timeout=600)  # no --go-on: still stopped, nothing trained
    assert again.returncode == 2 and "train: a health rule stopped it" in again.stdout, again.stdout[-3000:]
    assert log == (fab.job_dir("diverges", "train") / "log").read_text(errors="replace")
