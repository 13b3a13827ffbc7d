"""The local run record: saved whole and merged, by any number of watchers at once."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from bootstrap.paths import REPO
from bootstrap.remote import evals
from bootstrap.results import runs
from bootstrap.results.runs import RunRecord


def test_two_watchers_saving_one_record_at_once_both_succeed_and_it_stays_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path))
    errors: list[BaseException] = []

    def watch(job: str) -> None:
        record = RunRecord("r1", jobs={job: {"state": "done"}})
        try:
            for _ in range(300):
                record.save()
        except BaseException as error:  # noqa: BLE001 - the test reports any
            errors.append(error)

    watchers = [threading.Thread(target=watch, args=(job,)) for job in ("train", "export")]
    for watcher in watchers:
        watcher.start()
    for watcher in watchers:
        watcher.join(timeout=60)
    assert errors == []
    assert sorted(RunRecord.load("r1").jobs) == ["export", "train"]  # what each noted, neither lost
    assert runs.current_run() == "r1"
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "current",
        "r1",
        "record.json",
        "record.lock",
    ]  # no temporary
    assert (tmp_path / "r1" / "record.json").stat().st_mode & 0o777 == 0o666 & ~runs._UMASK  # as a plain write


def test_fab_runs_puts_this_machines_runs_side_by_side(tmp_path, monkeypatch):
    """Two runs from the evals MaxText logged (the recorded log's format): what each scored, its settings, its
    chip-hours and where its model is; the numbers are the logs'."""
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path / "runs"))
    log = tmp_path / "train.log"
    scored = {}
    for name, (before, after), kept in (
        ("r1", (600, 800), {"publish-hub": "https://huggingface.co/me/grpo"}),
        ("r2", (600, 500), {"publish-hub": "held back: publish_if: improved, and it did not"}),
    ):
        log.write_text(
            f"W1130 train_rl.py:716] Pre RL Training: corr={before}, total=1319, accuracy={100 * before / 1319}%, "
            "partial_accuracy=50.0%, format_accuracy=70.0%, mean_reward=0.1000\n"
            f"W1130 train_rl.py:754] Post RL Training: corr={after}, total=1319, accuracy={100 * after / 1319}%, "
            "partial_accuracy=50.0%, format_accuracy=95.0%, mean_reward=0.4000\n"
        )
        scored[name] = evals.from_log(str(log), 50)
        jobs = {"train": {"state": "done", "started": 1_000_000.0, "finished": 1_000_000.0 + 1800}}
        RunRecord(
            name, jobs=jobs, evals=scored[name], results=kept, settings=[f"vars.num_batches={len(name)}"], chips=8
        ).save()
    result = subprocess.run(
        [str(Path(sys.executable).with_name("fab")), "-r", str(REPO), "runs", "--json"],
        capture_output=True, text=True, env={**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs")}, check=True,
    )  # fmt: skip
    rows = {row["run"]: row for row in json.loads(result.stdout)}
    assert rows["r1"]["accuracy"] == [evals.outcome(scored["r1"])["before"], evals.outcome(scored["r1"])["after"]]
    assert [round(v, 1) for v in rows["r1"]["accuracy"] + rows["r2"]["accuracy"]] == [45.5, 60.7, 45.5, 37.9]
    assert rows["r1"]["chip_hours"] == 4.0 and rows["r1"]["state"] == "done" and rows["r1"]["mean_reward"] == 0.4
    assert rows["r2"]["kept"] == {"publish-hub": "held back: publish_if: improved, and it did not"}
    assert rows["r1"]["settings"] == ["vars.num_batches=2"]
    table = subprocess.run(
        [str(Path(sys.executable).with_name("fab")), "-r", str(REPO), "runs"],
        capture_output=True, text=True, env={**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs"), "COLUMNS": "200"},
    )  # fmt: skip
    assert table.returncode == 0 and "r1" in table.stdout and "45.5 -> 60.7" in table.stdout
