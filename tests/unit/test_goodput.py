"""Goodput (results/goodput.py): every paid second is the kept steps' or one cause's, and fab plan, the result line and
fab runs say the same figures.

Each run here is laid out by hand on a clock (seconds from 0), its causes worked out on paper in the comments.
"""

from __future__ import annotations

import pytest

from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from bootstrap.results import estimate, goodput, side_by_side
from bootstrap.results.goodput import Cause
from bootstrap.results.runs import RunRecord

T0 = 1_800_000_000.0  # the clock's zero: a time since the epoch
WORK = {"step": 1.0, "eval": 42.0, "eval_items": 1344, "num_test_batches": 42}  # a whole eval: 42 batches


def job(start: float, end: float, **more) -> dict:
    return {"state": "done", "started": T0 + start, "finished": T0 + end, "ran": True, **more}


def plain_run(**more) -> RunRecord:
    """setup 0-300 beside prefetch 0-100, convert 100-400, validate 300-350; train 400-1200, export 1200-1300.
    Train's log: start-up 100 s (the whole eval before training, 30 s, in it), warm-up 10 s, 100 steps x 5 s with
    20 s of saves in them, 2 timed evals x 30 s. Autostop waits 600 s after the run. 8 chips."""
    record = RunRecord("r", **{"chips": 8, "estimate": {"low_s": 1000, "high_s": 1600, "idle_s": 600}, **more})
    record.jobs = {
        "setup": job(0, 300), "prefetch": job(0, 100), "convert": job(100, 400), "validate": job(300, 350),
        "train": job(400, 1200), "export": job(1200, 1300),
    }  # fmt: skip
    record.timing = {"startup_s": 100.0, "warmup_s": 10.0, "step_s": 5.0, "steps": 100, "first_step": 1,
                     "eval_s": 30.0, "evals": 2, "eval_items": 1344, "saves_s": 20.0, "work": WORK}  # fmt: skip
    return record


def test_every_paid_second_of_a_plain_run_is_the_kept_steps_or_one_cause():
    ledger = goodput.measured(plain_run())
    assert ledger.productive_s == pytest.approx(100 * 5 - 20)  # the steps, less the saves inside them
    assert {cause: ledger.badput[cause] for cause in Cause if ledger.badput[cause]} == {
        Cause.SETUP: 300,  # 0-300: setup ran
        Cause.CONVERT: 100,  # 300-400: convert beyond setup
        Cause.STARTUP: 100 - 30 + 10,  # loading and compiling, and the first steps' warm-up
        Cause.EVALS: 30 + 2 * 30,  # before, and the two timed
        Cause.SAVES: 20,
        Cause.OTHER: 800 - (480 + 20 + 90 + 80),  # train's 800 s, less what its log explains
        Cause.EXPORT: 100,
        Cause.IDLE: 600,
    }
    assert ledger.paid_s == pytest.approx(1300 + 600) and ledger.share == pytest.approx(480 / 1900)
    assert ledger.line().startswith("goodput 25% of 4.22 chip-hours; badput: idle before autostop 1.33 (32%), setup ")


def test_a_run_that_lost_its_vm_counts_the_kept_steps_there_and_what_it_did_again():
    """The first VM ran 0-2000 (steps up to 60, checkpoint 50), was preempted; the second resumed at step 51.
    fab metrics counted 2 starts and 10 steps trained again."""
    record = plain_run(train_losses={"attempts": 2, "steps_redone": 10})
    record.lost_vms = [{"started": T0 - 3000, "ended": T0 - 1000, "known": True}]
    record.timing = {**record.timing, "first_step": 51, "steps": 50}
    ledger = goodput.measured(record)
    kept_there = 50 * 5.0
    assert ledger.productive_s == pytest.approx(50 * 5 - 20 + kept_there)
    assert ledger.badput[Cause.AGAIN] == pytest.approx(10 * 5.0)
    assert ledger.badput[Cause.RESTARTS] == pytest.approx(2000 - kept_there - 10 * 5.0)
    assert ledger.paid_s == pytest.approx(2000 + 1300 + 600)  # both VMs' time and the idle


def test_a_run_still_going_pays_no_idle_yet_and_one_never_started_has_no_ledger():
    record = plain_run()
    record.jobs["export"] = {"state": "running", "started": T0 + 1200, "ran": True}
    assert goodput.measured(record).badput[Cause.IDLE] == 0
    assert goodput.measured(RunRecord("new")) is None


def test_the_boot_is_the_first_run_on_a_vm_alone():
    first, second = plain_run(booted=T0 - 420), plain_run(booted=T0 - 420)
    first.name, second.name, first.machine, second.machine = "a", "b", "vm", "vm"
    second.jobs = {name: {**j, "started": j["started"] + 5000, "finished": j["finished"] + 5000}
                   for name, j in second.jobs.items()}  # fmt: skip
    both = [first, second]
    assert (goodput.boot_of(first, both), goodput.boot_of(second, both)) == (420, 0)
    assert goodput.boot_of(plain_run(), both) == 0  # this machine as the VM: no boot time
    chipless = plain_run(booted=T0 - 86400, chips=0)  # the demo's or the CPU tier's machine, up since yesterday
    assert goodput.boot_of(chipless, [chipless]) == 0
    assert goodput.measured(first, 420).paid_s == pytest.approx(420 + 1300 + 600)


def test_the_result_line_and_fab_runs_say_the_same_paid_chip_hours_and_goodput():
    from bootstrap.tasks.results_tasks import _against_estimate

    record = plain_run(booted=T0 - 420)
    record.estimate |= {"cost": [10.0, 16.0], "idle_cost": 3.6, "price_per_chip_hour": 2.7, "chip_hours": [2.2, 3.6],
                        "unknown": [], "goodput": {"share": 0.3}}  # fmt: skip
    ledger = goodput.measured(record, goodput.boot_of(record, [record]))
    line = estimate.against(record, ledger)
    hours = (420 + 1300 + 600) / 3600 * 8
    assert line == (
        f"took 21.7 min, paid 38.7 min with boot and idle before autostop: {hours:.2f} chip-hours, "
        f"${hours * 2.7:,.2f}, goodput 21% (estimated 16.7-26.7 min and 10.0 min idle, $13.60-$19.60, goodput about 30%)"
    )
    row = side_by_side.rows([record], None)[0]
    cell = _against_estimate(row)
    assert f"{hours:.2f} chip-h paid\ngoodput 21%" in cell and "goodput ~30%" in cell


def test_fab_plans_goodput_adds_up_to_its_estimate_and_names_the_largest_badput(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path / "runs"))
    expected = estimate.estimate(build(load.read(REPO / "jobs"), [], "r"), idle=(1800, "results.gcs"))
    ledger = goodput.expected(expected)
    assert ledger.paid_s == pytest.approx((expected.low_s + expected.high_s) / 2 + 1800)
    train = next(stage for stage in expected.stages if stage.name == "train")
    assert ledger.productive_s == pytest.approx(sum(train.parts["steps"]) / 2)
    cause, seconds = ledger.largest()
    assert seconds == max(ledger.badput.values())
    line = expected.goodput_line()
    assert line.startswith(f"  goodput        about {ledger.share:.0%}: steps ") and cause.label in line
