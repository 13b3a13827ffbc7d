"""A lost VM: said in one line with the fix, and `fab train --recover` recreates it and carries on.

The loopback sshd plays the VM before and after; the Compute Engine API stand-in says
whether the stack's instance exists and runs; the stand-in `pulumi up` (tests/stack.py)
"recreates" it under a new instance id. A lost VM is its processes killed at once; a new
one has none of its state folder, "/dev/shm", environment or Hugging Face cache. The
bucket is a real Cloud Storage emulator (tests/gcsemulator.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import uuid

import pytest

from bootstrap.remote import gcs, jobrunner
from tests import gcsemulator
from tests.loopback import edit_yaml, wait_for
from tests.stack import INSTANCE, Stack, closed_port, drop_connections, lose, wipe
from tests.webhook import Receiver

SMALL = ("--arg", "vars.num_batches=2")


def current_run(fab) -> str | None:
    """The run the VM's pipeline carries on (its state folder's current-run file)."""
    path = fab.tmp / "state" / "current-run"
    return path.read_text().strip() if path.exists() else None


@pytest.fixture
def stack(fab, compute) -> Stack:
    compute.host_keys[INSTANCE] = [tuple(fab.host.host_key.read_text().split()[:2])]
    return Stack(fab, compute, instance_id="1001")


RECOVER = "; its /dev/shm went with it. Recreate it and carry on: fab train --recover\n"
PENDING = (
    f"; nothing is recreated. Once `gcloud compute instances describe {INSTANCE} --format='value(status)'` says "
    "RUNNING, run `pulumi up --refresh` (a first pulumi up stops on \"unexpected state 'PENDING'\": this records "
    "the VM it made), then fab train\n"
)
FOREIGN = (
    "; fab never replaces an instance the stack did not make: if it is yours to lose, delete it, then fab train "
    "--recover; or give this stack another tpu-rl:instanceName and run pulumi up\n"
)


@pytest.mark.parametrize(
    "status, instance_id, why",
    [
        (
            None,
            "1001",
            "no longer exists (deleted on host maintenance, preemption or the end of its run time)" + RECOVER,
        ),
        ("TERMINATED", "1001", "is TERMINATED (stopped: by autostop or from the VM itself)" + RECOVER),
        ("RUNNING", "9009", "is another instance (id 9009, the stack's is 1001)" + FOREIGN),
        # identity before status: stopped or not, an instance the stack did not make is never replaced
        ("TERMINATED", "9009", "is another instance (id 9009, the stack's is 1001)" + FOREIGN),
        ("SUSPENDED", "9009", "is another instance (id 9009, the stack's is 1001)" + FOREIGN),
        ("STOPPING", "9009", "is another instance (id 9009, the stack's is 1001)" + FOREIGN),
        # a FLEX_START VM made and waiting for capacity: never replaced (it would lose its place in the queue)
        ("PENDING", "1001", "is PENDING: waiting for capacity (FLEX_START)" + PENDING),
    ],
)
def test_a_lost_vm_is_one_line_that_names_the_fix(stack, compute, status, instance_id, why):
    assert stack("status").returncode == 0  # pinned while it ran
    stack.unreachable("1001")
    if status is None:
        del compute.instances[INSTANCE]
    else:
        compute.instances[INSTANCE] = {"id": instance_id, "status": status}
    result = stack("train", *SMALL)
    assert result.returncode == 2
    assert result.stderr == f"error: the stack's VM {INSTANCE} {why}"
    assert stack.up_calls() == []  # only --recover runs pulumi up
    if instance_id != "1001" or status == "PENDING":  # never over an instance the stack did not make, or waiting
        refused = stack("train", "--recover", *SMALL)
        assert refused.returncode == 2 and refused.stderr == result.stderr and stack.up_calls() == []


def test_without_the_compute_api_the_ssh_failure_is_the_message(stack, compute):
    assert stack("status").returncode == 0
    stack.unreachable("1001")
    stack.compute = dataclasses.replace(compute, url=f"http://127.0.0.1:{closed_port()}")  # offline laptop
    result = stack("status")
    assert result.returncode == 2 and "connection refused" in result.stderr
    assert "whether the VM still exists is unknown: the Compute Engine API failed reading" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_a_vm_that_answers_but_refuses_ssh_is_not_called_lost(stack):
    """The API says it runs as the stack says: the SSH failure itself is the message."""
    assert stack("status").returncode == 0
    stack.unreachable("1001")
    result = stack("status")
    assert result.returncode == 2 and "connection refused" in result.stderr and "--recover" not in result.stderr


def test_recover_recreates_a_deleted_vm_and_the_run_carries_on_there(fab, stack, compute):
    first = stack("train", "--run-name", "r1", *SMALL, timeout=600)
    assert first.returncode == 0, first.stderr
    wipe(fab)
    del compute.instances[INSTANCE]
    stack.unreachable("1001")
    lost = stack("train", "--run-name", "r1", *SMALL)
    assert lost.returncode == 2 and "fab train --recover" in lost.stderr
    assert not (fab.tmp / "state").exists()  # nothing was started anywhere

    stack.after_up("2002")
    recovered = stack("train", "--run-name", "r1", "--recover", *SMALL, timeout=600)
    assert recovered.returncode == 0, recovered.stderr
    urn = stack.outputs_for("1001")["instance_urn"]
    assert stack.up_calls() == [["up", "--yes", "--skip-preview", "--refresh", "--target", urn, "--target-dependents"]]
    assert f"recreating it with `pulumi up --yes --skip-preview --refresh --target {urn} --target-dependents`" in (
        " ".join(recovered.stdout.split())  # as the terminal wraps it
    )
    assert f"pinned {INSTANCE}'s SSH host keys" in recovered.stdout
    assert "compute.2002" in stack.pins.read_text() and "compute.1001" not in stack.pins.read_text()
    for job in ("setup", "prefetch", "convert", "train", "export"):
        assert f"{job}: starting" in recovered.stdout  # nothing was kept on the lost VM: all of it ran again
    assert (fab.job_dir("r1", "export") / "done").exists()
    assert (fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / "r1" / "SHA256SUMS").exists()


def test_recover_replaces_a_stopped_vm_and_leaves_a_running_one_alone(fab, stack, compute):
    assert stack("train", "--run-name", "r1", *SMALL, timeout=600).returncode == 0
    untouched = stack("train", "--run-name", "r1", "--recover", *SMALL)
    assert untouched.returncode == 0, untouched.stderr
    assert f"the stack's VM {INSTANCE} runs: nothing to recreate" in untouched.stdout
    assert stack.up_calls() == []

    compute.instances[INSTANCE]["status"] = "TERMINATED"
    stack.after_up("3003")
    recovered = stack("train", "--run-name", "r1", "--recover", *SMALL)
    assert recovered.returncode == 0, recovered.stderr
    urn = stack.outputs_for("1001")["instance_urn"]
    assert stack.up_calls() == [
        ["up", "--yes", "--skip-preview", "--refresh", "--target-replace", urn, "--target-dependents"]
    ]
    assert "export: done already" in recovered.stdout  # the loopback "new" VM kept its files: nothing ran again


def test_a_vm_lost_mid_train_resumes_on_a_new_one_from_its_last_checkpoint_in_the_bucket(
    fab, stack, compute, gcs_emulator, monkeypatch
):
    """Convert is not run again (its record and checkpoint are in the bucket, so neither is prefetch), train
    restores the last checkpoint committed before the loss and runs only the steps after it, and the export
    is of the final step. The publish gate judges the run, not the attempt: the lost VM's eval of the base
    model is kept in the bucket, so the better model is uploaded (it was held for a log the new VM lacks)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    durable = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/llama3.1-8b-Instruct"
    repo = f"tester/recovered-{uuid.uuid4().hex[:8]}"
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["results"].update(hub_repo=repo, publish_if="improved"))
    better = ("--arg", "train.env.STANDIN_EVALS=600,800,1319")
    args = ("--arg", f"vars.durable_dir={durable}", "--arg", "vars.num_batches=6", *better)
    slow = ("--arg", "train.env.STANDIN_SECONDS=2")  # a checkpoint a step (a tenth of 6, at least 1), 2 s each
    actor = f"{durable}/post-train/r1/checkpoints/actor"

    started = stack("train", "--run-name", "r1", *args, *slow, "--detach", timeout=600)
    assert started.returncode == 0, started.stderr
    wait_for(
        lambda: 2 in jobrunner.finished_steps(actor), timeout=300, what="train's checkpoint of step 2 in the bucket"
    )
    lose(fab)
    kept = jobrunner.finished_steps(actor)[-1]  # what the bucket holds at the loss: 2, perhaps 3
    assert 2 <= kept < 6
    wipe(fab)
    del compute.instances[INSTANCE]
    stack.unreachable("1001")

    stack.after_up("2002")
    recovered = stack("train", *args, *slow, "--recover", timeout=600)  # as the one-line error says: no --run-name
    assert recovered.returncode == 0, recovered.stderr
    out = recovered.stdout
    assert "run r1 (the current run)" in out  # this machine's, the lost VM's: a new VM has none
    assert "convert: done already, kept in the bucket" in out
    assert "prefetch: not needed, convert done already" in out and "prefetch: starting" not in out
    assert "train: starting" in out and "export: starting" in out
    log = (fab.job_dir("r1", "train") / "log").read_text()
    assert f"Restored params from step: {kept} in" in log  # tunix's own line, as the real train_rl logs it
    assert f"resumed at step {kept}" in out and "before training" not in out  # its Pre eval: restored weights
    assert re.findall(r"Train step (\d+) training loss", log) == [str(n) for n in range(kept + 1, 7)]  # none redone
    config = json.loads((fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / "r1" / "config.json").read_text())
    assert config["exported_from"] == f"{actor}/6/model_params"  # the final checkpoint, read from the bucket
    convert_record = json.loads(
        gcs.read(f"{durable}/tpu-rl/shared/{next((fab.tmp / 'state' / 'shared').glob('convert-*')).name}.json")
    )
    assert convert_record["outputs"] == [f"{durable}/mt-format/{convert_record['outputs'][0].split('/')[-3]}/0/items"]
    assert json.loads(gcs.read(f"{durable}/tpu-rl/runs/r1/train.json"))["outputs"][-1] == f"{actor}/6/model_params"
    assert f"model kept at {fab.hub.url}/{repo} (verified)" in out  # judged from the run's records in the bucket
    card = fab.hub.repos[repo]["README.md"].decode()
    assert "| before training | 45.49 |" in card and "**Result:** GSM8K accuracy 45.5% -> 60.7%" in card

    metrics = stack("metrics", *args, *slow)  # the events are in the bucket: the new VM copies them for fab
    assert metrics.returncode == 0, metrics.stderr
    assert f"copying event files from {durable}/post-train/r1/tensorboard" in " ".join(metrics.stdout.split())
    assert "train started 2 times" in metrics.stdout  # one event file per start, both in the bucket
    rows = (fab.tmp / "runs" / "r1" / "metrics.csv").read_text().splitlines()[1:]
    assert [int(row.split(",")[0]) for row in rows] == list(range(1, 7))


def in_a_bucket(gcs_emulator: str, monkeypatch, seconds: int) -> tuple[str, tuple[str, ...]]:
    """A 6-step run whose model and checkpoints are in a folder of the bucket of its own, `seconds` a step."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    durable = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/llama3.1-8b-Instruct"
    settings = (f"vars.durable_dir={durable}", "vars.num_batches=6", f"train.env.STANDIN_SECONDS={seconds}")
    return durable, tuple(word for setting in settings for word in ("--arg", setting))


def test_a_host_given_with_h_recreated_mid_train_carries_on_with_this_machines_run(fab, gcs_emulator, monkeypatch):
    """Finding 11: a -H host lost mid-train and recreated by its user. The plain `fab train` started a new run
    from step 0 beside the bucket's committed checkpoints; the run this machine knows now carries on there."""
    durable, args = in_a_bucket(gcs_emulator, monkeypatch, seconds=2)
    actor = f"{durable}/post-train/r1/checkpoints/actor"
    started = fab("train", "--run-name", "r1", *args, "--detach", timeout=600)
    assert started.returncode == 0, started.stderr
    wait_for(lambda: 2 in jobrunner.finished_steps(actor), timeout=300, what="train's checkpoint of step 2")
    lose(fab)
    kept = jobrunner.finished_steps(actor)[-1]
    assert 2 <= kept < 6
    wipe(fab)  # the user recreated the host: none of its state is left

    again = fab("train", *args, timeout=600)  # no --run-name, no --recover (which -H refuses)
    assert again.returncode == 0, again.stderr
    out = " ".join(again.stdout.split())
    assert "has no run of its own: carrying on with this machine's run r1" in out and f"kept in {durable}" in out
    assert "run r1 (the current run)" in out
    log = (fab.job_dir("r1", "train") / "log").read_text()
    assert f"Restored params from step: {kept} in" in log
    assert re.findall(r"Train step (\d+) training loss", log) == [str(n) for n in range(kept + 1, 7)]  # none redone
    assert sorted((fab.tmp / "state" / "runs").iterdir()) == [fab.tmp / "state" / "runs" / "r1"]  # no second run

    fresh = fab("train", "--new-run", "--arg", "vars.num_batches=1", "--detach")  # still the user's to choose
    assert fresh.returncode == 0, fresh.stderr
    assert "carrying on" not in fresh.stdout and "(a new run)" in fresh.stdout


def test_another_vm_never_carries_on_with_a_run_this_machine_handed_to_a_first_one(fab, gcs_emulator, monkeypatch):
    """Review: the laptop's current run belongs to the VM it was handed to. A second VM (another host or state
    folder: here another state folder), with no run of its own, starts a new run beside the first VM's live one."""
    durable, args = in_a_bucket(gcs_emulator, monkeypatch, seconds=3)
    assert fab("train", "--run-name", "r1", *args, "--detach", timeout=600).returncode == 0
    actor = f"{durable}/post-train/r1/checkpoints/actor"
    wait_for(lambda: jobrunner.finished_steps(actor), timeout=300, what="the first VM training r1")
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["vm"].update(state_dir=str(fab.tmp / "stateB")))
    second = fab("train", *args, "--detach", timeout=600)
    assert second.returncode == 0, second.stderr
    assert "carrying on" not in second.stdout and "(a new run)" in second.stdout
    lose(fab)  # the first VM's pipeline, not this test's to finish


def test_watch_carries_a_run_preempted_mid_train_on_by_itself_with_every_committed_step_and_none_twice(
    fab, stack, compute, gcs_emulator, monkeypatch
):
    """fab train --watch, attached, and the VM deleted mid-train as a Spot preemption deletes it: its connection cut,
    its processes gone, nothing of it left. Spot capacity is short at first (the first `pulumi up` fails), then
    back. fab recreates the VM by itself and the run finishes as it would have: resumed from the last committed
    checkpoint, no step trained twice, the final step exported. Each recovery is said, and told to the receivers
    from this machine (the VM that would tell them is gone)."""
    durable, args = in_a_bucket(gcs_emulator, monkeypatch, seconds=2)
    # the bucket in jobs/ rather than an --arg: fab runs, which takes none, reads it there
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["vars"].update(durable_dir=durable))
    args = tuple(
        word for pair in zip(args[::2], args[1::2], strict=True) if "durable_dir" not in pair[1] for word in pair
    )
    receiver = Receiver()
    monkeypatch.setenv("TPU_RL_TEST_HOOK", receiver.url)
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["results"].update(notify=["TPU_RL_TEST_HOOK"]))
    monkeypatch.setenv("TPU_RL_WATCH_WAIT_SECONDS", "1")  # the first wait; doubled after each failed try
    watching = stack.start("train", "--new-run", "--watch", "--tries", "8", *args)  # no --run-name: the watch pins it
    try:
        wait_for(lambda: current_run(fab), timeout=300, what="the run the watch started")
        run = current_run(fab)
        actor = f"{durable}/post-train/{run}/checkpoints/actor"
        wait_for(lambda: 2 in jobrunner.finished_steps(actor), timeout=300, what="train's checkpoint of step 2")
        state = (
            fab.tmp / "state"
        )  # the shutdown script's work on a preemption (bootstrap/shutdown.sh), as the VM runs it
        told = subprocess.run(
            ["python3", state / "bin" / "preempted.py", state], env=os.environ, capture_output=True, text=True
        )
        assert told.returncode == 0, told.stderr
        told_out, at_step = told.stdout, json.loads(told.stdout)["committed_step"]
        stack.unreachable("1001")
        del compute.instances[INSTANCE]  # preempted: Compute Engine deletes a Spot VM
        drop_connections(fab)
        lose(fab)
        kept = jobrunner.finished_steps(actor)[-1]
        assert 2 <= kept < 6
        wipe(fab)
        wait_for(stack.up_calls, timeout=120, what="fab's first recovery, refused: no Spot capacity")
        status = stack("status", *args)  # meanwhile: what the VM recorded as it went, not only "no longer exists"
        assert status.returncode == 2 and "no longer exists (deleted on host maintenance" in status.stderr
        assert re.search(
            rf"; it was preempted on \d{{4}}-\d\d-\d\d at \d\d:\d\d UTC during train \(last committed checkpoint: step {at_step}\)\. Recreate it",
            status.stderr.strip(),
        ), status.stderr
        stack.after_up("2002")  # capacity again
        out, _ = watching.communicate(timeout=600)
    finally:
        watching.kill()
    assert watching.returncode == 0, out[-5000:]
    said = " ".join(out.split())
    assert "recovery 1 of 8 in 1 s" in said and "recovery 2 of 8 in 2 s" in said
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in out and len(stack.up_calls()) >= 2
    log = (fab.job_dir(run, "train") / "log").read_text()
    assert f"Restored params from step: {kept} in" in log
    assert re.findall(r"Train step (\d+) training loss", log) == [str(n) for n in range(kept + 1, 7)]  # none twice
    config = json.loads((fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / run / "config.json").read_text())
    assert config["exported_from"] == f"{actor}/6/model_params"
    # and the new VM tells the end, as any VM does: in a process of its own, never waited for
    wait_for(lambda: any(p["body"].get("state") == "done" for p in receiver.posts), 60, "the VM telling the end")
    told = [post["body"] for post in receiver.posts]
    recovering = [body for body in told if body.get("state") == "recovering"]
    assert [body["recovery"] for body in recovering][:2] == [1, 2] and all(b["run"] == run for b in recovering)
    (preemption,) = [body for body in told if body.get("kind") == "preempted"]  # told by the VM as it went
    assert preemption["committed_step"] == at_step and preemption["run"] == run
    assert receiver.secret not in out
    receiver.close()
    # the watch said the VM was preempted, from the VM's own record, and never told the user to do what it was doing
    assert re.search(rf"it was preempted on .* during train \(last committed checkpoint: step {at_step}\)", said)
    assert "--run-name" not in out and "fab train --recover" not in out

    listed = stack("runs", "--json")  # before fab metrics: the bucket's record of the preemption, the lost VM's time
    assert listed.returncode == 0, listed.stderr
    (row,) = [row for row in json.loads(listed.stdout) if row["run"] == run]
    assert [p["committed_step"] for p in row["preemptions"]] == [at_step] and row["vms"] == 2, row
    record = json.loads((fab.tmp / "runs" / run / "record.json").read_text())
    (lost_vm,) = record["lost_vms"]
    new_vm = [j for j in record["jobs"].values() if not j.get("lost_vm") and j.get("started")]
    assert lost_vm["known"] and lost_vm["ended"] == pytest.approx(json.loads(told_out)["at"])  # the record's time
    assert row["took_s"] == round(lost_vm["ended"] - lost_vm["started"] + max(j["finished"] for j in new_vm)
                                  - min(j["started"] for j in new_vm))  # fmt: skip
    assert f"preempted at step {at_step}: fab" in " ".join(stack("runs").stdout.split())  # its cost: fab metrics

    metrics = stack("metrics", *args)  # the preemption's record is in the bucket: counted, with what it cost
    assert metrics.returncode == 0, metrics.stderr
    assert re.search(
        rf"preempted 1 time: at \d\d:\d\d UTC \(last committed step {at_step}, \d+\.\d\d chip-hours lost\)",
        metrics.stdout,
    )
    (recorded,) = json.loads((fab.tmp / "runs" / run / "record.json").read_text())["preemptions"]
    assert recorded["committed_step"] == at_step and recorded["lost_chip_hours"] is not None
    listed = stack("runs")
    assert listed.returncode == 0, listed.stderr
    assert f"preempted at step {at_step}: " in " ".join(listed.stdout.split())
