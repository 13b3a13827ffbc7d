"""A VM lost mid-train, on the real pipeline: real to_maxtext, train_rl and to_huggingface on a tiny model, with
the converted model and the training checkpoints in the bucket (MaxText writes gs:// itself).

Train checkpoints every step of 4; the "VM" is lost right after step 2's checkpoint is committed
(shim/sitecustomize.py holds train there, then the test kills everything and wipes what a new VM
lacks); `fab train --recover` recreates it (tests/stack.py) and carries on. The bucket is the
Cloud Storage emulator behind tests/gcslayer.py.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import uuid

import pytest

from bootstrap.demo import MAKE_INPUTS
from bootstrap.jobs import tracking
from bootstrap.remote import gcs, jobrunner
from bootstrap.remote.graph import PipelineState
from bootstrap.results import timing
from tests import gcsemulator
from tests.loopback import Fab, edit_yaml, wait_for
from tests.maxtext_cpu.conftest import (
    BF16,
    HERE,
    RELEASES,
    WANDB_PROJECT,
    Release,
    assert_logged_to_wandb_offline,
    cpu_fab_at,
    overrides,
    planned_schedule,
    set_up,
)
from tests.stack import INSTANCE, Stack, lose, wipe

STEPS, LOST_AFTER = 4, 2
# Resuming is tunix's (the same 0.1.7 under both releases) and the bucket's: the releases do not differ in it, so one
# runs it, the shipped jobs' own.
RESUMED_RELEASE = "0.2.3"
COMPILER = "jax._src.compiler"
TRAIN_STEP_HIT = "Persistent compilation cache hit for 'jit__train_step'"  # JAX's line, at debug level


def ended(fab: Fab) -> bool:
    """Whether the VM's pipeline is over (it failed, or did all): then train will not hold any more."""
    record = jobrunner.read_json(str(fab.tmp / "state" / "pipeline" / "driver.json")) or {}
    return record.get("state") in (PipelineState.DONE.value, PipelineState.FAILED.value)


@pytest.fixture(scope="module", params=[RESUMED_RELEASE])
def release(request) -> Release:
    return RELEASES[request.param]


@pytest.fixture(scope="module")
def recovery(cpu_host, compute, gcs_emulator, tmp_path_factory, release: Release) -> dict:
    """One run lost after step LOST_AFTER and recovered with `fab train --recover`; what the tests read."""
    tmp = tmp_path_factory.mktemp(f"cpu-loss-{release.version}")
    with cpu_fab_at(cpu_host, tmp, release, compile_cache=False) as fab, pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)  # where this side reads the bucket
        compute.host_keys[INSTANCE] = [tuple(fab.host.host_key.read_text().split()[:2])]
        fab.secrets[tracking.KEY] = ""  # no W&B key anywhere, whatever this machine's environment holds
        stack = Stack(fab, compute, instance_id="1001")
        set_up(fab, release, stack)
        inputs = fab.tmp / "inputs"
        subprocess.run([release.venv / "bin" / "python", MAKE_INPUTS, inputs], check=True, capture_output=True)
        durable = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/llama3.1-8b-Instruct"
        hold = fab.tmp / "hold"
        hold.write_text(f"{LOST_AFTER}\n")
        overridden = [
            *overrides(inputs, STEPS, release),
            f"vars.durable_dir={durable}",
            f"train.env.TPU_RL_CPU_HOLD_FILE={hold}",
            f"train.env.JAX_DEBUG_LOG_MODULES={COMPILER}",  # JAX's own lines on its persistent cache
        ]
        args = [word for override in overridden for word in ("--arg", override)]

        started = stack("train", "--run-name", "r1", *args, "--detach", timeout=1800)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr
        held = hold.with_name("hold.held")
        wait_for(lambda: held.exists() or ended(fab), timeout=1800, what=f"train to hold after step {LOST_AFTER}")
        assert held.exists(), f"the pipeline ended first: {started.stdout[-2000:]}"
        actor = f"{durable}/post-train/r1/checkpoints/actor"
        first_log = (fab.job_dir("r1", "train") / "log").read_text(errors="replace")
        lose(fab)
        at_loss = jobrunner.finished_steps(actor)
        wipe(fab)
        hold.unlink()
        del compute.instances[INSTANCE]
        stack.unreachable("1001")
        stack.after_up("2002")
        recovered = stack("train", *args, "--recover", timeout=1800)  # as the one-line error says: no --run-name
        assert recovered.returncode == 0, recovered.stdout[-5000:] + recovered.stderr
        resumed_log = (fab.job_dir("r1", "train") / "log").read_text(errors="replace")
        # the same run, never lost, with W&B on and no key anywhere (the README's offline path)
        edit_yaml(fab.jobs / "pipeline.yaml", lambda data: data["results"].update(wandb=WANDB_PROJECT))
        whole = stack("train", "--run-name", "whole", *args, timeout=1800)
        assert whole.returncode == 0, whole.stdout[-5000:] + whole.stderr
        yield {
            "fab": fab,
            "gcs_url": gcs_emulator,
            "stack": stack,
            "release": release,
            "args": args,
            "inputs": inputs,
            "durable": durable,
            "actor": actor,
            "at_loss": at_loss,
            "first_log": first_log,
            "out": recovered.stdout,
            "log": resumed_log,
            "whole_log": (fab.job_dir("whole", "train") / "log").read_text(errors="replace"),
        }


def trained_batches(log: str) -> list[str]:
    """The batches GRPO trained on, in order, each by its prompts' content (shim/sitecustomize.py says them)."""
    return re.findall(r"\[shim\] GRPO batch TRAIN (\S+)", log)


def test_the_resumed_run_trained_on_the_batches_the_run_never_lost_did(recovery: dict):
    """tunix skips, on resume, the batches the restored steps consumed (its iterator is fast-forwarded by the
    checkpoint's step), and the data order is fixed by data_shuffle_seed: the resumed run trains on exactly
    what the uninterrupted run trained on, step by step; no batch twice, none skipped."""
    whole = trained_batches(recovery["whole_log"])
    assert len(whole) == STEPS and len(set(whole)) == STEPS  # distinct batches, so a repeat would show
    before = trained_batches(recovery["first_log"])
    after = trained_batches(recovery["log"].split(timing.ATTEMPT)[-1])  # the attempt on the new VM
    assert before[:LOST_AFTER] == whole[:LOST_AFTER]
    assert after == whole[LOST_AFTER:]
    said = f"resumed at step {LOST_AFTER}: the batches, step numbers and learning rates of a run never stopped"
    assert said in " ".join(recovery["out"].split())  # what the user is told, in the run's result lines


def test_the_resumed_run_ends_with_the_weights_of_the_run_never_lost(recovery: dict):
    """With the same batches, rates and optimizer state, and sampling seeded by what it samples for
    (shim/cpu_rollout.py, as a fixed-seed engine would), the resumed run's export is the never-lost run's,
    bit for bit: the resume changed nothing that reaches the model."""
    exports = recovery["fab"].tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained"
    compare = subprocess.run(
        [recovery["release"].venv / "bin" / "python", HERE / "same_weights.py", exports / "r1", exports / "whole"],
        capture_output=True,
        text=True,
    )
    assert compare.returncode == 0, compare.stderr[-3000:]
    found = json.loads(compare.stdout)
    assert found["identical"] == found["tensors"] == 291, found


def test_the_loss_came_after_step_2s_checkpoint(recovery: dict):
    assert recovery["at_loss"] == [1, LOST_AFTER]  # the bucket had step 2's checkpoint, and nothing after it
    assert f"Train step {LOST_AFTER + 1} " not in recovery["first_log"]


def test_the_new_vm_reused_the_converted_model_and_resumed_training_from_the_last_checkpoint(recovery: dict):
    out, log = recovery["out"], recovery["log"]
    assert "run r1 (the current run)" in out
    assert "convert: done already, kept in the bucket" in out and "convert: starting" not in out
    assert "prefetch: not needed, convert done already" in out
    assert f"Restored params from step: {LOST_AFTER} in" in log  # tunix's own line
    assert re.findall(r"Train step (\d+) training loss", log) == [str(n) for n in range(LOST_AFTER + 1, STEPS + 1)]
    assert f"resumed at step {LOST_AFTER}" in out  # its Pre eval scored the restored weights, and says so
    assert "RL Training Completed Successfully!" in log
    assert jobrunner.finished_steps(recovery["actor"]) == list(range(1, STEPS + 1))


def test_the_new_vm_loaded_the_train_step_the_lost_one_compiled(recovery: dict):
    """jobs/train.yaml keeps JAX's compiled programs beside the checkpoints: the lost VM compiled train's step
    and wrote it there (its log has no hit: the folder was new), and the new VM loaded it instead."""
    kept = gcs.sizes(f"{recovery['durable']}/jax-cache/")
    assert any(name.rsplit("/", 1)[1].startswith("jit__train_step-") for name in kept), sorted(kept)
    assert TRAIN_STEP_HIT not in recovery["first_log"]
    assert TRAIN_STEP_HIT in recovery["log"]


@pytest.fixture(scope="module")
def weights(recovery: dict) -> dict:
    """compare_weights.py on the input model, the actor checkpoints in the bucket and the export."""
    fab: Fab = recovery["fab"]
    export = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / "r1"
    compare = subprocess.run(
        [
            recovery["release"].venv / "bin" / "python",
            HERE / "compare_weights.py",
            recovery["inputs"] / "hf_model",
            recovery["actor"],
            export,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **gcsemulator.client_env(recovery["gcs_url"])},
    )
    assert compare.returncode == 0, compare.stderr[-3000:]
    return json.loads(compare.stdout)


def test_training_went_on_from_the_restored_state_and_the_export_is_the_final_checkpoint(weights: dict):
    """Each step's optimizer state counts one more update than the last: step 3 carried on from step 2's
    state, not from the converted model. The export is step 4's weights, not the restored step 2's (the
    steps trained on the new VM moved them), and moved from the input model."""
    assert {int(step): saved["count"] for step, saved in weights["steps"].items()} == {s: s for s in range(1, 5)}
    restored, final = weights["steps"][str(LOST_AFTER)], weights["steps"][str(STEPS)]
    assert final["export_vs"] <= 1.0 < restored["export_vs"]  # the steps after the restore moved the weights
    tensors = weights["tensors"]
    assert weights["names_match"] and len(tensors) == 291
    assert not [name for name, t in tensors.items() if t["vs_checkpoint"] > 1.0]
    assert max(t["vs_first_checkpoint"] for t in tensors.values()) > 1.0
    assert max(t["moved"] for t in tensors.values()) > 5


def test_every_update_used_the_planned_rate_across_the_loss_and_moved_every_matrix(recovery: dict, weights: dict):
    """The shipped release's real train_rl, on both VMs: the optimizer state saved at each step holds the rate `fab
    plan` showed for that step (the trainer keeps it in bf16), and every weight matrix of the bf16 export moved by
    more than bf16 rounding explains (weight decay is off: only the GRPO gradient moves them)."""
    lr = planned_schedule(recovery["stack"], recovery["args"])
    assert (lr.train_steps, lr.schedule_steps) == (STEPS, STEPS)
    for step, saved in weights["steps"].items():
        assert saved["lr"] == pytest.approx(lr.rate(int(step)), rel=BF16), (step, saved)
    assert weights["dtypes"] == ["bfloat16"]
    matrices = {name: t for name, t in weights["tensors"].items() if not name.endswith("norm.weight")}
    unmoved = [name for name, t in matrices.items() if t["moved"] <= 1.0]
    assert not unmoved, unmoved[:5]


def test_fab_metrics_reads_the_events_from_the_bucket(recovery: dict):
    fab: Fab = recovery["fab"]
    result = recovery["stack"]("metrics", "--run-name", "r1", *recovery["args"])
    assert result.returncode == 0, result.stderr
    assert f"copying event files from {recovery['durable']}/post-train/r1/tensorboard" in " ".join(
        result.stdout.split()
    )
    with (fab.tmp / "runs" / "r1" / "metrics.csv").open() as f:
        steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert set(range(LOST_AFTER + 1, STEPS + 1)) <= set(steps), steps  # the new VM's attempt, from the bucket
    # each start recorded itself in the bucket before it trained (the lost VM's events may never have)
    records = gcs.names(f"{recovery['durable']}/post-train/r1/attempts/")
    assert len(records) == 2, records
    assert f"train started 2 times (resumed from step {LOST_AFTER})" in " ".join(result.stdout.split())
    losses = json.loads((fab.tmp / "runs" / "r1" / "summary.json").read_text())["train_losses"]
    assert losses["attempts"] == 2 and losses["steps_redone"] == 0  # lost right after a checkpoint: none
    assert losses["resumed_from"] == [0, LOST_AFTER]  # from the records: the event files cannot say it
    assert losses["minutes_restarting"] > 0


def test_wandb_off_wrote_nothing_though_installed(recovery: dict):
    """results.wandb off for r1 (wandb is in the CPU environment all the same, and tunix logs to it whenever it
    imports): train's W&B run was disabled and wrote no file; nothing left the VM for a third party."""
    fab: Fab = recovery["fab"]
    assert "W&B run URL: None" in recovery["log"]  # tunix's own line: wandb imported, its run disabled
    assert not re.search(r"^wandb: .*(Syncing|saved locally|Tracking run)", recovery["log"], re.M)
    state = fab.tmp / "state"
    assert [path for path in state.rglob("*.wandb") if not path.is_relative_to(state / "runs" / "whole")] == []


def test_wandb_with_no_key_anywhere_logged_the_run_offline(recovery: dict):
    """The never-lost run had results.wandb set and no key where fab ran: it logged offline, as the README says, the
    reward series fab metrics shows."""
    shown = recovery["stack"]("metrics", "--run-name", "whole", *recovery["args"])
    assert shown.returncode == 0, shown.stderr
    logged = assert_logged_to_wandb_offline(
        recovery["fab"], "whole", recovery["release"], "no WANDB_API_KEY was set where fab ran"
    )
    assert len(logged) == STEPS
