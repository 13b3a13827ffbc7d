"""A run's health (remote/health.py): each rule stops the run it is for and no other, the stop is recorded where the
run's records are and read back by its next start, and the VM's job and pipeline say stopped, not failed.

The rules meet real tunix and MaxText in the CPU tier (tests/maxtext_cpu/test_own_task.py: a broken model stopped by
the smoke rollout, a NaN loss stopped within steps); here each rule's edges, in milliseconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from bootstrap.jobs import load, schema
from bootstrap.paths import REPO
from bootstrap.remote import attempts, health, jobrunner
from bootstrap.remote.graph import Action, PipelineState, decide
from bootstrap.remote.jobrunner import JobState
from tests import gcsemulator
from tests.unit.test_driver_graph import FakeJobs
from tests.unit.test_render import load_pipeline

LAUNCHER = REPO / "bootstrap" / "remote" / "maxtext_run.py"
HEALTHY = [  # one step as tunix logs it: a loss, rewards that differ, a KL, lengths within the budget
    ("actor", "loss", 0.4), ("rewards", "score/mean", 0.5), ("rewards", "score/min", 0.0),
    ("rewards", "score/max", 1.0), ("actor", "kl", 0.01), ("completions", "min_length", 12),
    ("completions", "max_length", 90), ("sampler_trainer", health.AGREEMENT, 1.001),
]  # fmt: skip


def steps(watch: health.Watch, count: int, start: int = 1, **changed: float) -> None:
    """`count` healthy steps, with `changed` scalars (by name) in place of the healthy ones."""
    for step in range(start, start + count):
        for prefix, name, value in HEALTHY:
            watch.scalar(prefix, name, changed.get(name.replace("/", "_"), value), "train", step)


def stop_of(watch: health.Watch, count: int, start: int = 1, **changed: float) -> health.Stopped:
    with pytest.raises(health.Stopped) as stopped:
        steps(watch, count, start, **changed)
    return stopped.value


def test_a_healthy_run_is_never_stopped_nor_warned():
    said: list[str] = []
    steps(health.Watch(health.Rules(max_tokens=100), said.append), 200)
    assert said == []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan"])
def test_a_loss_gone_nan_or_infinite_stops_at_its_step(value):
    watch = health.Watch(health.Rules())
    steps(watch, 3)
    with pytest.raises(health.Stopped) as stopped:
        watch.scalar("actor", "loss", value, "train", 4)
    assert (stopped.value.rule, stopped.value.step) == ("nan", 4)
    assert stopped.value.why.startswith("actor/train/loss is nan at step 4") or "inf" in stopped.value.why


def test_an_eval_scalar_is_not_a_train_step():
    watch = health.Watch(health.Rules())
    watch.scalar("actor", "loss", float("nan"), "eval", 1)
    assert not watch.trained


def test_the_kl_beyond_its_most_either_sign_stops_and_zero_turns_it_off():
    assert stop_of(health.Watch(health.Rules(kl_max=0.5)), 5, kl=-0.6).rule == "kl_max"
    steps(health.Watch(health.Rules(kl_max=0)), 5, kl=50.0)


def test_the_agreement_warns_once_then_stops_beyond_its_stop():
    said: list[str] = []
    watch = health.Watch(health.Rules(), said.append)
    steps(watch, 10, **{f"{health.AGREEMENT}": 1.2})
    assert len(said) == 1 and "token_mult_prob_error 1.200 at step 1, above 1.05" in said[0]
    stop = stop_of(watch, 1, start=11, **{f"{health.AGREEMENT}": 1.6})
    assert stop.rule == "agreement_stop" and "above health.agreement_stop 1.5" in stop.why


def test_rewards_all_at_their_lowest_for_n_steps_in_a_row_stop_and_a_step_with_signal_resets_the_count():
    watch = health.Watch(health.Rules(reward_floor_steps=5))
    steps(watch, 4, score_max=0.0)  # four flat steps at the lowest reward
    steps(watch, 1, start=5)  # one with signal
    steps(watch, 4, start=6, score_max=0.0)
    stop = stop_of(watch, 1, start=10, score_max=0.0)
    assert stop.rule == "reward_floor_steps" and "for 5 steps in a row" in stop.why


def test_all_rewards_alike_above_the_lowest_seen_is_not_the_floor():
    """Every completion right (all 1.0) is no signal either, but it is success, not a run to stop."""
    watch = health.Watch(health.Rules(reward_floor_steps=3))
    steps(watch, 1)
    steps(watch, 10, start=2, score_min=1.0, score_max=1.0)


def test_completions_all_empty_or_all_at_the_limit_for_n_steps_stop():
    empty = stop_of(health.Watch(health.Rules(length_steps=3)), 3, min_length=0, max_length=1)
    assert empty.rule == "length_steps" and "every completion empty for 3 steps" in empty.why
    full = stop_of(health.Watch(health.Rules(length_steps=3, max_tokens=90)), 3, min_length=90, max_length=90)
    assert "at the length limit" in full.why
    steps(health.Watch(health.Rules(length_steps=3, max_tokens=0)), 5, min_length=90, max_length=90)  # no budget


SENTENCE = "Natalia sold 48 clips in April and half as many in May, so 72 in all. The answer is 72."


@pytest.mark.parametrize(
    ("answers", "ended", "right", "rule", "said"),
    [
        (["\ufffd\x00\x01" * 20] * 4, [True] * 4, 2, "smoke", "not text (4 of 4)"),
        (["the the the the the the the the the the"] * 3, [True] * 3, 2, "smoke", "repeat one token (3 of 3)"),
        (["}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}"] * 3, [True] * 3, 2, "smoke", "repeat one token"),
        (["\x01\x02 (\x7f\x03!?"] * 3, [True] * 3, 2, "smoke", "not text"),
        (["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"] * 3, [True] * 3, 2, "smoke", "repeat one token"),
        ([SENTENCE] * 4, [False] * 4, 2, "smoke", "none of the model's 4 answers before training ended"),
        ([SENTENCE] * 4, [True] * 4, 0, "smoke_right", "answered 0 of 4 held-out problems right"),
    ],
)
def test_the_smoke_rollout_stops_answers_that_are_no_answers(answers, ended, right, rule, said):
    stop = health.smoke(answers, ended, right, health.Rules())
    assert stop is not None and (stop.rule, stop.step) == (rule, 0) and said in stop.why


def test_the_smoke_rollout_passes_real_answers_some_wrong_some_unended():
    answers = [SENTENCE, "I think it is 12.", "\ufffd\ufffd", SENTENCE]
    assert health.smoke(answers, [True, True, False, False], 1, health.Rules()) is None
    assert health.smoke([SENTENCE], [True], 0, health.Rules(smoke_right=0)) is None  # no right answer asked for
    assert health.smoke([SENTENCE], [True], None, health.Rules()) is None  # a task measured by a mean reward


def test_only_the_eval_before_the_first_step_is_smoke_checked_and_no_answers_is_no_pass(monkeypatch):
    """A resumed start's eval is of restored weights: not the base model the smoke rollout judges. An eval whose
    answers never reached the sampler's hook is said unchecked, never passed."""
    from bootstrap.remote import health_hooks

    said: list[str] = []
    monkeypatch.setattr(health, "say", said.append)
    hooks = health_hooks.Hooks(health.Rules())
    hooks.answers, hooks.ended = ["}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}"] * 3, [True] * 3
    hooks.evaluated({"phase": "resumed", "corr": 0})  # the same garbage after a resume: not judged here
    with pytest.raises(health.Stopped):
        hooks.evaluated({"phase": "pre", "corr": 0})
    hooks.answers, hooks.ended = [], []
    hooks.evaluated({"phase": "pre", "corr": 5})
    assert said and "not checked" in said[-1] and not any("passed" in line for line in said)


def test_the_stop_record_sits_beside_the_runs_start_records_and_go_on_keeps_it_said(tmp_path):
    starts = tmp_path / "run" / "attempts"
    path = health.record_path({attempts.DIR_ENV: f"{starts}/"})
    assert path == f"{tmp_path}/run/health/stopped.json"
    assert health.record_path({}) is None and health.stopped(path) is None
    health.write_record(path, health.Stopped("nan", 7, "actor/train/loss is nan at step 7"), 5)
    found = health.stopped(path)
    assert (found["rule"], found["step"], found["committed_step"]) == ("nan", 7, 5)
    health.clear(path, found)
    assert health.stopped(path) is None and health.read_record(path)["why"] == found["why"]


def launch(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    """maxtext_run.py as train runs it, on a module of `body`, with the run's start records in tmp_path."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "entry.py").write_text(textwrap.dedent(body))
    environ = {"PATH": "/usr/bin:/bin", attempts.DIR_ENV: str(tmp_path / "run" / "attempts"), **env}
    return subprocess.run(
        [sys.executable, LAUNCHER, "entry"], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120
    )


def test_a_rule_that_fires_in_train_ends_it_stopped_its_record_names_the_last_committed_checkpoint(tmp_path):
    actor = tmp_path / "checkpoints"
    for step in (2, 4):
        (actor / str(step) / "model_params").mkdir(parents=True)
        (actor / str(step) / "_CHECKPOINT_METADATA").write_text("{}")
    (actor / "6.orbax-checkpoint-tmp-1").mkdir()  # an async save in flight: never committed
    fired = """
        import sys
        raise sys.modules["health"].Stopped("nan", 6, "actor/train/loss is nan at step 6")
    """
    result = launch(tmp_path, fired, **{attempts.CHECKPOINTS_ENV: str(actor)})
    assert result.returncode == jobrunner.STOPPED_EXIT, result.stderr
    assert "[tpu-rl] health: stopped at step 6: actor/train/loss is nan at step 6 (its last committed checkpoint: " \
           "step 4)" in result.stderr  # fmt: skip
    record = json.loads((tmp_path / "run" / "health" / "stopped.json").read_text())
    assert (record["rule"], record["committed_step"]) == ("nan", 4)


def test_a_stopped_run_started_again_stays_stopped_until_go_on(tmp_path):
    path = health.record_path({attempts.DIR_ENV: str(tmp_path / "run" / "attempts")})
    health.write_record(path, health.Stopped("kl_max", 9, "the KL is 3 at step 9"), 8)
    trains = "print('trained')\n"
    again = launch(tmp_path, trains)
    assert again.returncode == jobrunner.STOPPED_EXIT and "trained" not in again.stdout
    assert "stopped at step 9: the KL is 3 at step 9 (still: fab train --go-on carries this run on" in again.stderr
    carried = launch(tmp_path, trains, **{jobrunner.GO_ON_ENV: "1"})
    assert carried.returncode == 0 and carried.stdout == "trained\n", carried.stderr
    assert "carrying on despite the stop at step 9" in carried.stderr
    assert launch(tmp_path, trains).returncode == 0  # cleared: the next start trains too


def test_go_on_past_a_smoke_stop_turns_the_smoke_rollout_off_for_every_start_of_it(tmp_path, monkeypatch):
    """The same eval before the first step would stop the run again: carried on, its starts (a restart's too, the
    record cleared by then) skip the smoke rollout; every other rule stays, and a run stopped otherwise keeps it."""
    from bootstrap.remote import maxtext_run

    path = health.record_path({attempts.DIR_ENV: str(tmp_path / "run" / "attempts")})
    health.write_record(path, health.Stopped("smoke_right", 0, "answered 0 of 64 right"), None)
    environ = {health.RULES_ENV: json.dumps({"smoke": True, "kl_max": 2.0})}
    assert health.rules_from(environ).smoke  # not carried on: the rule stands
    monkeypatch.setenv(jobrunner.GO_ON_ENV, "1")
    for _ in range(2):  # the --go-on start, then a restart of it
        carried_on = maxtext_run.still_stopped(path)
        rules = health.rules_from(environ, carried_on)
        assert carried_on["rule"] == "smoke_right" and not rules.smoke and rules.kl_max == 2.0
    nan = health.Stopped("nan", 7, "actor/train/loss is nan at step 7")
    assert health.rules_from(environ, {"rule": nan.rule}).smoke


def test_a_run_stopped_on_a_vm_it_then_lost_stays_stopped_on_the_next_from_the_bucket(tmp_path, gcs_emulator):
    """With results.gcs the start records, and the stop record beside them, are in the bucket: a new VM (a fresh
    folder, nothing of the old one) starts train, and the launcher reads the stop there and ends at once."""
    starts = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/run/attempts"
    bucket = {**gcsemulator.client_env(gcs_emulator), attempts.DIR_ENV: starts}
    fired = 'import sys\nraise sys.modules["health"].Stopped("length_steps", 12, "every completion empty")\n'
    first = launch(tmp_path / "vm-1", fired, **bucket)
    assert first.returncode == jobrunner.STOPPED_EXIT, first.stderr
    again = launch(tmp_path / "vm-2", "print('trained')\n", **bucket)
    assert again.returncode == jobrunner.STOPPED_EXIT and "trained" not in again.stdout, again.stderr
    assert "stopped at step 12: every completion empty (still: fab train --go-on" in again.stderr


def test_a_job_that_exits_stopped_is_stopped_not_failed(tmp_path):
    spec = {"name": "train", "argv": [sys.executable, "-c", f"raise SystemExit({jobrunner.STOPPED_EXIT})"],
            "env": {}, "secrets": [], "outputs": [str(tmp_path / "out")], "cwd": str(tmp_path)}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    jobrunner._Job(str(tmp_path)).run()
    state = jobrunner.job_state(str(tmp_path))
    assert state["state"] == JobState.STOPPED and "stopped by a health rule" in state["error"]


def test_a_stopped_train_is_held_with_export_and_the_pipeline_is_stopped_while_go_on_starts_it():
    assert decide("train", {"state": "stopped"})[0] is Action.HOLD
    assert decide("train", {"state": "stopped"}, go_on=True)[0] is Action.START
    jobs = FakeJobs({name: JobState.DONE for name in ("setup", "prefetch", "validate", "convert")})
    jobs.states["train"] = JobState.STOPPED
    graph = jobs.drive()
    assert graph.outcome is PipelineState.STOPPED
    assert "launch train" not in jobs.calls and "launch export" not in jobs.calls
    assert graph.failed["export"] == "needs train, which stopped"
    failing = FakeJobs(after={"prefetch": [JobState.FAILED]})
    assert failing.drive().outcome is PipelineState.FAILED


def test_the_rules_reach_train_alone_with_its_completion_budget_and_the_agreement_only_where_the_sampler_says(
    tmp_path,
):
    """MaxText's rl.yml gives a completion 1024 - 256 tokens; 0.2.3's sampler gives no log-probabilities."""
    pipeline = load_pipeline(REPO / "jobs", [], {"run_name": "run-1"})
    jobs = {job.name: job for job in load.render(pipeline)}
    assert [name for name, job in jobs.items() if load.HEALTH_ENV in job.env] == ["train"]
    agrees = schema.numbers(pipeline.maxtext.version) >= (0, 2, 5)
    assert health.rules_from(jobs["train"].env) == health.Rules(max_tokens=768, agreement=agrees)
    shutil.copytree(REPO / "jobs", tmp_path / "jobs")
    with (tmp_path / "jobs" / "pipeline.yaml").open("a") as f:
        f.write("health:\n  kl_max: 0\n")
    shorter = load_pipeline(tmp_path / "jobs", ["train.max_target_length=512"], {"run_name": "run-1"})
    train = next(job for job in load.render(shorter) if job.name == "train")
    assert health.rules_from(train.env) == health.Rules(max_tokens=256, kl_max=0, agreement=agrees)
