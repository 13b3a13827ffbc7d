"""The local run record: saved whole and merged, by any number of watchers at once."""

import json
import os
import threading
from pathlib import Path

from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from bootstrap.remote import attempts, driver, evals, inventory, jobrunner
from bootstrap.results import runs, side_by_side
from bootstrap.results.runs import RunRecord
from tests import fabfork


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
    result = fabfork.run(
        [fabfork.FAB, "-r", str(REPO), "runs", "--json"],
        capture_output=True, text=True, env={**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs")}, check=True,
    )  # fmt: skip
    rows = {row["run"]: row for row in json.loads(result.stdout)}
    assert rows["r1"]["accuracy"] == [evals.outcome(scored["r1"])["before"], evals.outcome(scored["r1"])["after"]]
    assert [round(v, 1) for v in rows["r1"]["accuracy"] + rows["r2"]["accuracy"]] == [45.5, 60.7, 45.5, 37.9]
    assert rows["r1"]["chip_hours"] == 4.0 and rows["r1"]["state"] == "done" and rows["r1"]["mean_reward"] == 0.4
    assert rows["r2"]["kept"] == {"publish-hub": "held back: publish_if: improved, and it did not"}
    assert rows["r1"]["settings"] == ["vars.num_batches=2"]
    table = fabfork.run(
        [fabfork.FAB, "-r", str(REPO), "runs"],
        capture_output=True, text=True, env={**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs"), "COLUMNS": "200"},
    )  # fmt: skip
    assert table.returncode == 0 and "r1" in table.stdout and "45.5 -> 60.7" in table.stdout


def test_output_piped_to_a_file_or_a_pager_is_not_wrapped(tmp_path, monkeypatch):
    """Off a terminal, with no COLUMNS: a long path and a long cell stay whole on their line (rich would cut at 80)."""
    runs_dir = tmp_path / ("r" * 100) / "runs"
    monkeypatch.setenv("TPU_RL_RUNS", str(runs_dir))
    kept = {"publish-hub": "held back: publish_if: improved, and it did not improve beyond the interval of 64 problems"}
    RunRecord("a-run-2026-12-05-01-02-03", results=kept, settings=[], chips=8).save()
    table = fabfork.run(
        [fabfork.FAB, "-r", str(REPO), "runs"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},  # readline exports COLUMNS to children
    )
    lines = table.stdout.splitlines()
    assert any(f"runs recorded in {runs_dir}" in line for line in lines), table.stdout
    assert any(kept["publish-hub"] in line for line in lines), table.stdout


def test_one_row_a_run_merged_from_the_laptop_the_vm_and_the_bucket():
    """The laptop kept the base model's eval (a lost VM's first attempt), the VM the eval after training, the
    bucket the checkpoints and the copy: one row with each number from where it was kept."""
    before = {"phase": "pre", "step": None, "total": 1319.0, "accuracy": 45.5, "format_accuracy": 70.0}
    after = {**before, "phase": "post", "accuracy": 60.7, "format_accuracy": 95.0, "mean_reward": 0.4}
    laptop = RunRecord(
        "r1", jobs={"train": {"state": "failed", "started": 1000.0}}, evals=[{**before, "mean_reward": 0.1}]
    )
    laptop.chips, laptop.settings = 8, ["vars.num_batches=9"]
    listed = {
        "runs": {
            "r1": {
                "vm": {
                    "jobs": {"train": {"state": "done", "started": 2800.0, "finished": 4600.0}},
                    "settings": ["vars.num_batches=2"],
                    "evals": [after],
                    "markers": {"publish-hub-me--m": {"url": "https://huggingface.co/me/m"}},
                    "export": "/dev/shm/m/hf-trained/r1",
                },
                "bucket": {
                    "steps": [4, 6],
                    "attempts": [{"started": 1010.0}, {"started": 2800.0}],
                    "copies": ["gs://b/r1/ab"],
                },
            },
            "r2": {
                "bucket": {"steps": [2], "attempts": [{"started": 50.0}], "records": {"train": {"finished": 3650.0}}}
            },
        }
    }
    rows = {row["run"]: row for row in side_by_side.rows([laptop], listed, chips=4, host="vm")}
    assert rows["r1"]["known"] == ["laptop", "VM", "bucket"]
    assert rows["r1"]["accuracy"] == [45.5, 60.7] and rows["r1"]["format_accuracy"] == [70.0, 95.0]
    assert rows["r1"]["mean_reward"] == 0.4 and rows["r1"]["state"] == "done"
    assert rows["r1"]["settings"] == ["vars.num_batches=2"]  # the VM's plan is the later word
    assert rows["r1"]["chip_hours"] == round((4600 - 1000) / 3600 * 8, 2)  # from the laptop's first start
    assert rows["r1"]["kept"] == {
        "publish-hub-me--m": "https://huggingface.co/me/m",
        "bucket": "gs://b/r1/ab",
        "vm": "vm:/dev/shm/m/hf-trained/r1",
    }
    assert rows["r1"]["checkpoint_step"] == 6 and rows["r1"]["train_starts"] == 2
    assert rows["r2"]["known"] == ["bucket"] and rows["r2"]["state"] == "train done, checkpoint of step 2"
    assert rows["r2"]["chip_hours"] == 4.0 and rows["r2"]["settings"] is None  # the stack's chips, from its record
    assert [row["run"] for row in side_by_side.rows([laptop], listed)] == ["r2", "r1"]  # oldest first
    alone = side_by_side.rows([laptop], None)  # the VM not read: this machine's record as it is
    assert [(row["run"], row["known"], row["state"], row["settings"]) for row in alone] == [
        ("r1", ["laptop"], "train failed", ["vars.num_batches=9"])
    ]


def test_the_settings_a_run_had_that_jobs_renders_otherwise_now_are_its_yaml_changes():
    files = load.read(REPO / "jobs")
    then = build(files, ["train.num_test_batches=5", "train.env.STANDIN=1"], "r1")
    specs = {job.name: {"argv": job.runner_spec["argv"], "env": job.runner_spec["env"]} for job in then.jobs}
    assert side_by_side.yaml_changes(specs, build(files, [], "r1")) == [
        "train.num_test_batches=5",
        "train.env.STANDIN=1",
    ]
    assert side_by_side.yaml_changes(specs, then) == []
    assert side_by_side.yaml_changes(specs, None) == []  # jobs/ no longer renders it: nothing to compare


def test_the_places_sent_to_the_vm_are_the_plans_own_paths_for_any_run():
    files = load.read(REPO / "jobs")
    durable = ["vars.durable_dir=gs://b/p/m"]
    sent = side_by_side.request(build(files, durable), None)
    places, placeholder = sent["places"], sent["placeholder"]
    plan = build(files, durable, "r7")
    train = plan.job("train")
    assert places[inventory.CHECKPOINTS].replace(placeholder, "r7") == train.rendered.env[attempts.CHECKPOINTS_ENV]
    assert places[inventory.ATTEMPTS].replace(placeholder, "r7") == f"{train.rendered.env[attempts.DIR_ENV]}/*.json"
    assert places[inventory.RECORDS] == [train.runner_spec["record"].replace("r7", placeholder)]
    assert places[inventory.EVALS].replace(placeholder, "r7") == f"{train.job_dir}/log"
    assert places[inventory.EXPORT].replace(placeholder, "r7") == f"{plan.export_folder()}/SHA256SUMS"
    assert inventory.COPIES not in places  # results.gcs unset: no copies to look for


def test_a_malformed_file_on_the_vm_hides_neither_the_other_runs_nor_itself(tmp_path):
    """What a user, a crash or another tool may leave in the state folder: a stray file among the runs, a run
    plan that is not an object, a plan whose job has no spec. Each run is still listed, the broken one saying
    why, and a kept plan that is not ours never stops the next `start`."""
    layout = jobrunner.Layout(str(tmp_path / "state"))
    for run in ("good", "listed", "nospec"):
        os.makedirs(layout.run_job(run, "train"))
    (tmp_path / "state" / "runs" / "stray.txt").write_text("not a run\n")
    os.makedirs(os.path.dirname(layout.run_plan("x")))
    Path(layout.run_plan("listed")).write_text("[1, 2]")
    Path(layout.run_plan("nospec")).write_text(json.dumps({"jobs": [{"name": "train"}]}))
    found = inventory.runs(layout, {"places": {}, "placeholder": "<run_name>"})["runs"]
    assert sorted(found) == ["good", "listed", "nospec"]
    assert "error" not in found["good"]["vm"] and "error" not in found["listed"]["vm"]
    assert found["nospec"]["vm"]["error"].startswith("KeyError")
    row = side_by_side.rows([], {"runs": found})[-1]
    assert row["run"] == "nospec" and "its files on the VM unreadable: KeyError" in row["state"]
    driver.keep_run_plan(layout, {"run": "listed", "jobs": [{"name": "train"}], "settings": ["a=1"]})
    assert json.loads(Path(layout.run_plan("listed")).read_text())["settings"] == ["a=1"]


def test_a_job_an_earlier_run_did_is_not_this_runs_time_or_chip_hours():
    """convert, shared and done by run r1, is reused by r2: r2 took and cost its own jobs' time only."""
    record = RunRecord("r2", chips=8)
    record.jobs = {
        "convert": {"ran": False, "state": "done", "started": 1000.0, "finished": 1300.0},
        "train": {"ran": True, "state": "done", "started": 90_000.0, "finished": 93_600.0},
    }
    found = side_by_side.row("r2", record, {}, [])
    assert found["took_s"] == 3600 and found["chip_hours"] == 8.0
