"""CSV and plot from real-format TensorBoard event files written here with TensorBoard's writer."""

import csv
import json
import time

import pytest
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from bootstrap.remote import attempts
from bootstrap.results import metrics
from bootstrap.results.runs import RunRecord
from tests import tbevents
from tests.tbevents import scalar_event


@pytest.fixture
def events_dir(tmp_path):
    folder = tmp_path / "tensorboard"
    folder.mkdir()
    for as_tensor, steps in ((False, range(1, 6)), (True, range(6, 11))):  # a resumed run: two files
        writer = EventFileWriter(str(folder), filename_suffix=f".part{int(as_tensor)}")
        for step in steps:  # as tunix writes them: rollout metrics of step N at N-1, jax/* timings at 0
            writer.add_event(scalar_event(step - 1, "rewards/train/score/mean", step / 10, as_tensor))
            writer.add_event(scalar_event(0, "jax/core/compile/backend_compile_duration", 1.5, as_tensor))
            writer.add_event(scalar_event(step, "actor/train/loss", 1 / step, as_tensor))
            writer.add_event(scalar_event(step, "actor/train/kl", 0.001 * step, as_tensor))
            # as tunix logs it: at step N the rate of update N+1, at the last step its own (the same again)
            writer.add_event(scalar_event(step, "actor/train/learning_rate", 1e-4 * min(step + 1, 10), as_tensor))
        writer.close()
    return folder


EVALS = [
    {
        "phase": "pre",
        "step": None,
        "accuracy": 38.75,
        "format_accuracy": 60.0,
        "partial_accuracy": 40.0,
        "mean_reward": 0.1,
        "corr": 31,
        "total": 80,
    },
    {
        "phase": "intermediate",
        "step": 10,
        "accuracy": 50.0,
        "format_accuracy": 80.0,
        "partial_accuracy": 52.0,
        "mean_reward": 0.7,
        "corr": 40,
        "total": 80,
    },
    {
        "phase": "post",
        "step": None,
        "accuracy": 65.0,
        "format_accuracy": 95.0,
        "partial_accuracy": 66.0,
        "mean_reward": 1.5,
        "corr": 52,
        "total": 80,
    },
]


def test_reads_simple_values_and_tensors(events_dir):
    series = metrics.read_events(events_dir)
    assert sorted(series) == [
        "actor/train/kl",
        "actor/train/learning_rate",
        "actor/train/loss",
        "rewards/train/score/mean",
    ]
    assert sorted(series["actor/train/loss"]) == list(range(1, 11))
    assert sorted(series["rewards/train/score/mean"]) == list(range(1, 11))  # aligned with the actor's steps
    assert series["rewards/train/score/mean"][3] == pytest.approx(0.3)
    assert series["rewards/train/score/mean"][8] == pytest.approx(0.8)  # from the tensor-form file


def test_each_step_shows_the_learning_rate_its_update_used(events_dir):
    rates = metrics.read_events(events_dir)["actor/train/learning_rate"]
    assert rates == {step: pytest.approx(1e-4 * step) for step in range(2, 11)}  # update 1's is not logged


def test_csv(events_dir, tmp_path):
    path = tmp_path / "metrics.csv"
    metrics.write_csv(metrics.read_events(events_dir), path)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 10
    assert rows[0]["step"] == "1" and float(rows[0]["actor/train/loss"]) == pytest.approx(1.0)
    assert float(rows[0]["rewards/train/score/mean"]) == pytest.approx(0.1)
    assert float(rows[9]["actor/train/kl"]) == pytest.approx(0.01)


def test_evals_csv_and_plot_positions(tmp_path):
    metrics.write_evals_csv(EVALS, tmp_path / "evals.csv")
    assert [r["phase"] for r in csv.DictReader((tmp_path / "evals.csv").open())] == ["pre", "intermediate", "post"]
    assert metrics.eval_steps(EVALS, 50) == [(0, 38.75, "before"), (10, 50.0, "step 10"), (50, 65.0, "after")]


def test_plot_is_a_png(events_dir, tmp_path):
    path = tmp_path / "metrics.png"
    metrics.plot(metrics.read_events(events_dir), EVALS, path, "run test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000  # three panels with lines, not an empty canvas


def test_summary_has_durations(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path))
    record = RunRecord("r1", jobs={"train": {"state": "done", "started": 100.0, "finished": 700.0}}, evals=EVALS)
    summary = metrics.summarize(record, tmp_path / "summary.json", metrics.loss_cost([]))
    assert summary["jobs"]["train"] == {"state": "done", "minutes": 10.0}
    assert json.loads((tmp_path / "summary.json").read_text())["evals"][2]["accuracy"] == 65.0


def attempts_of(folder, starts: list[tuple[range, float]], records: list[dict] = ()) -> list[dict]:
    """One event file per start: its steps, each 10 s after the one before, from `begin`; `records`: the
    durable records of the starts (attempts.py), as their texts."""
    folder.mkdir(exist_ok=True)
    for steps, begin in starts:
        events = [scalar_event(step, "actor/train/loss", 0.5) for step in steps]
        for event, step in zip(events, steps, strict=True):
            event.wall_time = begin + 10 * step
        tbevents.write(folder, events)
    return metrics.attempts(folder, attempts.parse([json.dumps(record) for record in records]))


def test_what_a_loss_cost_is_read_from_the_attempts_event_files(tmp_path):
    """A first start logs steps 1-5 and is lost; the next restores step 3 and logs 4-10: steps 4 and 5 were
    trained twice, and the second start took its own time to reach its first step."""
    base = time.time()
    tries = attempts_of(tmp_path / "tensorboard", [(range(1, 6), base), (range(4, 11), base + 1000)])
    assert [sorted(t["times"]) for t in tries] == [list(range(1, 6)), list(range(4, 11))]
    cost = metrics.loss_cost(tries)
    assert cost["attempts"] == 2 and cost["steps_redone"] == 2
    assert cost["minutes_redone"] == pytest.approx(20 / 60, abs=0.01)  # steps 4 and 5, 10 s each
    begun = tries[1]["begun"]  # when the second file was begun, by the writer's clock
    assert cost["minutes_restarting"] == pytest.approx((base + 1040 - begun) / 60, abs=0.01)
    assert metrics.loss_cost(tries[:1]) == {
        "attempts": 1,
        "resumed_from": [None],
        "steps_redone": 0,
        "minutes_redone": 0.0,
        "minutes_restarting": 0.0,
        "restarts": [],
    }
    (restart,) = cost["restarts"]  # the one later start: what it cost, the preemption before it is charged it
    assert restart == {
        "begun": begun,
        "minutes": pytest.approx(cost["minutes_redone"] + cost["minutes_restarting"], abs=0.02),
    }
    preempted = [{"at": begun - 60, "committed_step": 3}, {"at": begun + 3600, "committed_step": 9}]
    charged = metrics.preemption_cost(preempted, cost, chips=8)
    assert charged[0]["lost_chip_hours"] == pytest.approx(restart["minutes"] / 60 * 8, abs=0.001)
    assert charged[1]["lost_chip_hours"] is None  # no start after it yet: not known
    twice = [
        {"at": begun - 120, "committed_step": 3},
        {"at": begun - 60, "committed_step": 3},
    ]  # one restart after both
    assert [p["lost_chip_hours"] is None for p in metrics.preemption_cost(twice, cost, chips=8)].count(False) == 1


def test_a_step_trained_by_three_starts_counts_twice_and_one_trained_once_never(tmp_path):
    """A trains 1-10, B resumes at 5 and trains 6-7, C resumes at 5 and trains 6-12: A's 6-10 and B's 6-7
    were trained again, 7 steps; 11 and 12 only once."""
    base = time.time()
    starts = [(range(1, 11), base), (range(6, 8), base + 1000), (range(6, 13), base + 2000)]
    cost = metrics.loss_cost(attempts_of(tmp_path / "tensorboard", starts))
    assert cost["attempts"] == 3 and cost["steps_redone"] == 7
    assert cost["minutes_redone"] == pytest.approx(7 * 10 / 60, abs=0.01)


def test_an_empty_event_file_is_no_attempt_and_a_rollout_is_its_step(tmp_path):
    folder = tmp_path / "tensorboard"
    folder.mkdir()
    (folder / "events.out.tfevents.1700000000.lost-vm").write_bytes(b"")
    tbevents.write(folder, [scalar_event(step, "actor/train/loss", 0.5) for step in (1, 2)])
    assert [sorted(t["times"]) for t in metrics.attempts(folder, [])] == [[1, 2]]
    tbevents.write(folder, [scalar_event(0, "rewards/train/score/mean", 0.5)])  # lost after step 1's rollout
    assert [sorted(t["times"]) for t in metrics.attempts(folder, [])] == [[1, 2], [1]]
    assert sorted(metrics.read_events(folder)["actor/train/loss"]) == [1, 2]


def test_a_start_whose_events_never_reached_the_bucket_still_counts_from_its_durable_record(tmp_path):
    """A lost VM flushed none of its first start's events: only the second start's file is there. The
    records say two starts, the second resumed from step 2 (committed by the first): nothing redone,
    and its restart counted from when it began, not from its event file."""
    base = time.time()
    records = [
        {"started": base, "host": "vm-1", "resumed_from": 0},
        {"started": base + 1000, "host": "vm-2", "resumed_from": 2},
        "{half a rec",  # a record cut short is none, and so is one that is not ours
        {"started": float("nan"), "resumed_from": 1},
        {"started": base, "resumed_from": "x"},
        {"started": base, "resumed_from": [3]},
    ]
    tries = attempts_of(tmp_path / "tensorboard", [(range(3, 5), base + 1100)], records)
    assert [(t["host"], t["resumed_from"], sorted(t["times"])) for t in tries] == [("vm-1", 0, []), ("vm-2", 2, [3, 4])]
    cost = metrics.loss_cost(tries)
    assert cost["attempts"] == 2 and cost["resumed_from"] == [0, 2] and cost["steps_redone"] == 0
    assert cost["minutes_restarting"] == pytest.approx((base + 1130 - (base + 1000)) / 60, abs=0.01)


def test_steps_after_the_step_the_next_start_resumed_from_were_trained_again(tmp_path):
    """The first start logged 1-5 (its file reached the bucket) and the second resumed from step 3: steps 4
    and 5 were redone, whatever the second start's own file holds."""
    base = time.time()
    records = [
        {"started": base, "host": "a", "resumed_from": 0},
        {"started": base + 500, "host": "b", "resumed_from": 3},
    ]
    cost = metrics.loss_cost(
        attempts_of(tmp_path / "tensorboard", [(range(1, 6), base), (range(6, 8), base + 600)], records)
    )
    assert cost["steps_redone"] == 2 and cost["minutes_redone"] == pytest.approx(20 / 60, abs=0.01)
