"""The local run record: saved whole and merged, by any number of watchers at once."""

import threading

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
