"""`fab runs` over real SSH: a run only the VM holds and one only the bucket holds, both listed with their numbers,
in one round trip; the bucket is the Cloud Storage emulator, read on the "VM"."""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from pathlib import Path

from bootstrap.remote import attempts, evals, gcs, jobrunner
from tests import gcsemulator
from tests.loopback import Fab, edit_yaml, round_trips
from tests.stack import closed_port

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_fab_runs_lists_what_only_the_vm_and_only_the_bucket_hold_in_one_round_trip(
    fab: Fab, gcs_emulator, monkeypatch
):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)  # this side's reads of the bucket, to compare
    durable = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/llama3.1-8b-Instruct"
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["vars"].update(durable_dir=durable))
    on_disk = str(fab.tmp / "shm" / "local")
    for run, args in (("in-bucket", ()), ("on-vm", ("--arg", f"vars.durable_dir={on_disk}"))):
        done = fab("train", "--run-name", run, "--arg", "vars.num_batches=2", *args, timeout=600)
        assert done.returncode == 0, done.stderr
        shutil.rmtree(fab.tmp / "runs" / run)  # this machine forgot both
    shutil.copy(LOGS / "train.log", fab.job_dir("on-vm", "train") / "log")  # the recorded real run's evals
    shutil.rmtree(fab.tmp / "state" / "runs" / "in-bucket")  # the VM forgot this one: only the bucket holds it
    (fab.tmp / "state" / "pipeline" / "runs" / "in-bucket.json").unlink()
    edit_yaml(fab.jobs / "train.yaml", lambda d: d["args"].update(num_test_batches=41))  # a YAML change since

    before = round_trips(fab.host)
    listed = fab("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert round_trips(fab.host) - before == 1
    rows = {row["run"]: row for row in json.loads(listed.stdout)}

    scored = evals.outcome(evals.from_log(str(LOGS / "train.log"), None))
    vm = rows["on-vm"]
    assert vm["known"] == ["VM"]
    assert vm["accuracy"] == [scored["before"], scored["after"]]
    assert vm["format_accuracy"] == [scored["format_before"], scored["format_after"]]
    assert vm["mean_reward"] == scored["mean_reward_after"]
    assert vm["state"] == "done" and vm["started"] is not None
    assert vm["settings"] == ["vars.num_batches=2", f"vars.durable_dir={on_disk}", "train.num_test_batches=42"]
    export = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / "on-vm"
    assert vm["kept"] == {"vm": f"127.0.0.1:{export}"}

    bucket = rows["in-bucket"]
    actor = f"{durable}/post-train/in-bucket/checkpoints/actor"
    starts = attempts.parse([gcs.read(n).decode() for n in gcs.names(f"{durable}/post-train/in-bucket/attempts/")])
    assert bucket["known"] == ["bucket"]
    assert bucket["checkpoint_step"] == jobrunner.finished_steps(actor)[-1] == 2
    assert bucket["train_starts"] == len(starts) == 1
    assert bucket["state"] == "train done, checkpoint of step 2" and bucket["accuracy"] is None
    assert bucket["settings"] is None  # the bucket keeps no plan
    assert gcs.read(f"{durable}/tpu-rl/runs/in-bucket/train.json") is not None

    table = fab("runs")
    assert table.returncode == 0 and "on-vm" in table.stdout and "in-bucket" in table.stdout
    assert "0.0 -> 0.0" in table.stdout and "train done, checkpoint of step 2" in table.stdout


def test_fab_runs_without_a_reachable_vm_lists_this_machines_records_in_one_line(fab: Fab):
    fab.host = dataclasses.replace(fab.host, port=closed_port())  # nothing listens there
    (fab.tmp / "runs" / "laptop-run").mkdir(parents=True)
    (fab.tmp / "runs" / "laptop-run" / "record.json").write_text(json.dumps({"name": "laptop-run", "chips": 8}))
    listed = fab("runs", "--json", timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [row["run"] for row in json.loads(listed.stdout)] == ["laptop-run"]
    assert listed.stderr.startswith("the VM and its bucket were not read: ") and listed.stderr.count("\n") == 1
    assert "Traceback" not in listed.stderr
