"""CSV and plot from real-format TensorBoard event files written here with TensorBoard's writer."""

import csv
import json

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from bootstrap.results import metrics
from bootstrap.results.runs import RunRecord


def scalar_event(step: int, tag: str, value: float, as_tensor: bool) -> event_pb2.Event:
    if as_tensor:  # how TF2 / flax metric writers store scalars
        summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(value)))
        summary_value.metadata.plugin_data.plugin_name = "scalars"
    else:  # how tensorboardX and older writers store them
        summary_value = summary_pb2.Summary.Value(tag=tag, simple_value=value)
    return event_pb2.Event(step=step, wall_time=1700000000.0 + step, summary=summary_pb2.Summary(value=[summary_value]))


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
    summary = metrics.summarize(record, tmp_path / "summary.json")
    assert summary["jobs"]["train"] == {"state": "done", "minutes": 10.0}
    assert json.loads((tmp_path / "summary.json").read_text())["evals"][2]["accuracy"] == 65.0
