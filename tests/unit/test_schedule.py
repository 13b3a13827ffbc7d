"""The RL learning-rate schedule: sized to the run by the shipped job, shown by fab plan, refused when it
cannot train. The reference numbers are the ones MaxText 0.2.3's own pyconfig gave for the reference's
arguments (issue 15); the real trainer's optimizer and TensorBoard are compared in tests/maxtext_cpu."""

from __future__ import annotations

import json
import subprocess

import pytest

from bootstrap.errors import UserError
from bootstrap.jobs import load, schedule, schema
from bootstrap.jobs.plan import build, check_local
from bootstrap.paths import REPO
from tests import fabfork

UNSIZED = "train.learning_rate_schedule_steps=-1"  # the reference workload: the key left at MaxText's default


def train_job(overrides=()):
    return build(load.read(REPO / "jobs"), list(overrides), "run-1").job("train")


def fab(*args: str) -> subprocess.CompletedProcess:
    return fabfork.run([fabfork.FAB, "-r", str(REPO), *args], capture_output=True, text=True)


def test_the_shipped_job_sizes_the_schedule_to_its_50_steps():
    train = train_job()
    assert "learning_rate_schedule_steps=0" in train.rendered.argv  # 0: train_rl sizes it to the run itself
    lr = train.lr_schedule
    assert (lr.train_steps, lr.schedule_steps, lr.warmup_steps, lr.peak) == (50, 50, 5, 3e-6)
    assert lr.highest == pytest.approx(3e-6)
    assert lr.rate(10) == pytest.approx(2.9e-6, rel=0.02)  # issue 15: 2.9e-6 at step 10 on 0.2.3, sized
    assert lr.rate(1) == 0.0 and lr.rate(6) == pytest.approx(3e-6)  # warmup from 0 over 5 updates


def test_the_reference_schedule_peaks_at_a_third_of_a_percent():
    lr = schedule.of(schema.load("0.2.3"), schedule.RL_TRAINER, {"num_batches": "50"})
    assert (lr.schedule_steps, lr.warmup_steps) == (150001, 15000)
    assert lr.highest == pytest.approx(9.8e-9, rel=0.01)  # issue 15, from MaxText 0.2.3's pyconfig


@pytest.mark.parametrize(
    ("overrides", "steps"),
    [
        (["train.rl.num_iterations=2"], 100),
        (["train.train_fraction=0.5"], 25),
        (["train.num_epoch=3"], 150),
        (["vars.num_batches=8", "train.rl.num_iterations=3"], 24),
    ],
)
def test_the_schedule_and_the_progress_bar_follow_the_run_length(overrides, steps):
    train = train_job(overrides)
    assert train.rendered.progress["total_steps"] == steps
    assert train.lr_schedule.train_steps == train.lr_schedule.schedule_steps == steps


def test_an_unsized_schedule_is_refused_naming_the_key_the_numbers_and_the_fix():
    with pytest.raises(UserError) as raised:
        check_local(load.read(REPO / "jobs"), [UNSIZED])
    message = str(raised.value)
    assert message.startswith(f"--arg {UNSIZED}: args.learning_rate_schedule_steps: unset (-1)")
    for fact in ("steps=150001", "the run has 50 steps", "lasts 15000 steps", "9.8e-09", "0.33%", "3e-06"):
        assert fact in message
    assert "set learning_rate_schedule_steps: 0 (MaxText then sizes the schedule to the run" in message


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.learning_rate_schedule_steps=25"], "schedule_steps: 25 steps, shorter than the run's 50 steps"),
        (["train.learning_rate_schedule_steps=5000"], "the highest learning rate is 2.9e-07"),
        (["train.warmup_steps_fraction=1.0"], "args.warmup_steps_fraction: the warmup (50 steps) fills the whole"),
        (["train.rl.num_iterations=4", "train.learning_rate_schedule_steps=50"], "shorter than the run's 200 steps"),
    ],
)
def test_schedules_that_cannot_train_are_refused(overrides, message):
    with pytest.raises(UserError) as raised:
        check_local(load.read(REPO / "jobs"), overrides)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.num_batches=0", "args.num_batches: the run would have 0 training steps (num_batches 0 x"),
        ("train.num_epoch=-1", "args.num_epoch: the run would have -50 training steps"),
        ("train.train_fraction=0.01", "args.num_batches: the run would have 0 training steps"),
        ("train.num_batches=99999999999", "the run would have 99999999999 training steps"),
        ("train.train_fraction=nan", "args.train_fraction: 'nan' is not a finite number"),
        ("train.warmup_steps_fraction=inf", "args.warmup_steps_fraction: 'inf' is not a finite number"),
        ("train.learning_rate=0", "args.learning_rate: 0: a run with no positive learning rate changes nothing"),
        ("train.learning_rate=-1e-6", "args.learning_rate: -1e-06: a run with no positive learning rate"),
        ("train.num_batches=${train_steps}", "args.num_batches: ${train_steps} is counted from num_batches"),
        # MaxText's validator takes it; Orbax fails with step % 0 on the TPU, after the model is loaded and compiled
        ("train.checkpoint_period=0", "args.checkpoint_period: 0 is not a number of steps: Orbax saves every step"),
        ("train.checkpoint_period=-2", "args.checkpoint_period: -2 is not a number of steps"),
    ],
)
def test_runs_that_cannot_train_are_one_clean_error(override, message):
    with pytest.raises(UserError) as raised:
        check_local(load.read(REPO / "jobs"), [override])
    assert message in str(raised.value) and str(raised.value).count("\n") == 0, str(raised.value)


def test_a_longer_schedule_that_still_reaches_the_peak_is_accepted():
    check_local(load.read(REPO / "jobs"), ["train.learning_rate_schedule_steps=200"])  # warmup 20 of 50 steps
    assert train_job(["train.learning_rate_schedule_steps=200"]).lr_schedule.rate(50) > 2e-6


@pytest.mark.parametrize("version", ["0.2.4", "0.2.5"])
@pytest.mark.parametrize(
    ("args", "length"),
    [
        ({"learning_rate_schedule_steps": "-1"}, 50),
        ({"learning_rate_schedule_steps": "0"}, 50),
        ({"learning_rate_schedule_steps": "60"}, 60),
        # RLConfig sets `steps` to the run's length before get_optimizer compares the two: base.yml's 150001,
        # or a length equal to a `steps` of its own, is a length like any other (the real 0.2.5: tests/maxtext_cpu)
        ({"learning_rate_schedule_steps": "150001"}, 150001),
        ({"steps": "60", "learning_rate_schedule_steps": "60"}, 60),
    ],
)
def test_from_maxtext_0_2_4_unset_is_the_run_length_and_steps_plays_no_part(version, args, length):
    lr = schedule.of(schema.load(version), schedule.RL_TRAINER, {"num_batches": "50", **args})
    assert (lr.schedule_steps, lr.warmup_steps, lr.from_unset) == (length, length // 10, False)


def test_from_maxtext_0_2_4_a_flat_rl_key_sets_the_run_length():
    """0.2.4's RLConfig routes a flat `num_iterations` into `rl.num_iterations` (0.2.3 ignores it for RL)."""
    args = {"num_batches": "50", "num_iterations": "2"}
    assert schedule.train_steps(schema.load("0.2.5"), args) == 100
    assert schedule.train_steps(schema.load("0.2.3"), args) == 50


def test_train_steps_exists_only_for_the_rl_trainer():
    with pytest.raises(UserError, match=r"env.STEPS: undefined variable \$\{train_steps\}"):
        load.resolve(load.read(REPO / "jobs"), ["export.env.STEPS=${train_steps}"])


def test_fab_plan_shows_the_schedule_in_one_line_and_refuses_the_unsized_one():
    shown = fab("plan")
    assert shown.returncode == 0, shown.stderr
    assert (
        "   lr:      warmup 5 steps to 3e-06, cosine to 0 over 50 steps; the run's 50 steps: highest 3e-06, "
        "last step 3.7e-09" in shown.stdout.splitlines()
    )
    as_json = json.loads(fab("plan", "--json").stdout)
    (train,) = [job for job in as_json["jobs"] if job["name"] == "train"]
    assert train["lr_schedule"]["highest"] == pytest.approx(3e-6) and train["lr_schedule"]["warmup_steps"] == 5
    refused = fab("plan", "--arg", UNSIZED)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("error:") == 1 and "0.33% of learning_rate 3e-06" in refused.stderr


@pytest.mark.parametrize(
    ("overrides", "period"),
    [([], 5), (["vars.num_batches=4"], 1), (["vars.num_batches=200"], 20), (["train.rl.num_iterations=2"], 10)],
)
def test_a_checkpoint_every_tenth_of_the_run_and_two_kept(overrides, period):
    """A lost VM costs at most a tenth of the run (rl.yml's every-50-steps would lose a 50-step run whole)."""
    argv = train_job(overrides).rendered.argv
    assert f"checkpoint_period={period}" in argv and "max_num_checkpoints_to_keep=2" in argv
