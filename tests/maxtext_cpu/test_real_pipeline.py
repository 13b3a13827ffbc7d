"""The real pipeline, end to end, through fab: real `fab setup` of maxtext 0.2.3 from PyPI, then the real
to_maxtext, train_rl (only vLLM replaced by a CPU sampler, shim/) and to_huggingface on a tiny model.

The tests share one run (module fixture) and run in file order: the last ones change it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.loopback import Fab
from tests.maxtext_cpu.conftest import HERE, VENV, overrides

STEPS = 4


def current_run(fab: Fab) -> str:
    return (fab.tmp / "state" / "current-run").read_text().strip()


@pytest.fixture(scope="module")
def run(cpu_fab: Fab) -> dict:
    """fab setup, the tiny inputs, then one fab train; everything the tests below read."""
    setup = cpu_fab("setup", timeout=1800)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr
    inputs = cpu_fab.tmp / "inputs"
    subprocess.run([VENV / "bin" / "python", HERE / "make_inputs.py", inputs], check=True, capture_output=True)
    args = [word for override in overrides(inputs, STEPS) for word in ("--arg", override)]
    train = cpu_fab("train", *args, timeout=1800)
    assert train.returncode == 0, train.stdout[-5000:] + train.stderr
    name = current_run(cpu_fab)
    work = cpu_fab.tmp / "shm" / "llama3.1-8b-Instruct"
    return {"args": args, "inputs": inputs, "train": train, "run": name, "work": work}


def job_log(fab: Fab, run: dict, job: str) -> str:
    folder = (
        next((fab.tmp / "state" / "shared").glob(f"{job}-*"), None) or fab.tmp / "state" / "runs" / run["run"] / job
    )
    return (folder / "log").read_text(errors="replace")


def test_each_job_logs_its_real_completion_lines_and_status_shows_them_done(cpu_fab: Fab, run: dict):
    assert "Conversion complete. Checkpoint saved to" in job_log(cpu_fab, run, "convert")
    train = job_log(cpu_fab, run, "train")
    assert "RL Training Completed Successfully!" in train and "Post RL Training: corr=" in train
    export = job_log(cpu_fab, run, "export")
    assert "MaxText model successfully saved in HuggingFace format at" in export
    validate = job_log(cpu_fab, run, "validate")  # MaxText's own check of all three, before any started
    for job, module in (("convert", "to_maxtext"), ("train", "train_rl"), ("export", "to_huggingface")):
        assert f"{job}: ok: maxtext." in validate and module in validate
    status = cpu_fab("status", *run["args"])
    assert status.returncode == 0, status.stderr
    rows = {line.split()[1]: line for line in status.stdout.splitlines() if line.startswith("│ ")}
    for job in ("setup", "validate", "prefetch", "convert", "train", "export"):
        assert " done " in rows[job], status.stdout


def test_fab_showed_train_steps_and_the_real_eval_table(run: dict):
    out = run["train"].stdout
    assert f"[train] training steps 1/{STEPS}" in out and f"[train] training steps {STEPS}/{STEPS}" in out
    table = out[out.index("GSM8K evaluation") :]
    assert "before training" in table and "step 2" in table and "after training" in table
    assert f"step {STEPS}" not in table  # the eval at the final step is the Post eval, not a second row
    assert "0/2" in table  # corr/total of the real evals (a random model answers nothing right)


def test_metrics_come_from_the_real_tensorboard_tags(cpu_fab: Fab, run: dict):
    result = cpu_fab("metrics", *run["args"])
    assert result.returncode == 0, result.stderr
    folder = cpu_fab.tmp / "runs" / run["run"]
    header, *rows = (folder / "metrics.csv").read_text().splitlines()
    for tag in ("actor/train/loss", "actor/train/kl", "rewards/train/score/mean"):
        assert tag in header.split(",")
    assert [row.split(",")[0] for row in rows] == [str(s) for s in range(1, STEPS + 1)]
    assert (folder / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert (folder / "evals.csv").read_text().count("\n") == 4  # header, before, step 2, after


def test_export_read_the_highest_actor_step(run: dict, cpu_fab: Fab):
    actor = run["work"] / "post-train" / run["run"] / "checkpoints" / "actor"
    assert sorted(int(p.name) for p in actor.iterdir() if p.name.isdigit()) == [1, STEPS]
    assert (actor / str(STEPS) / "optimizer_state").is_dir()
    assert f"load_parameters_path: {actor}/{STEPS}/model_params" in job_log(cpu_fab, run, "export")


def test_the_export_is_servable_and_every_tensor_round_trips(run: dict):
    export = run["work"] / "hf-trained" / run["run"]
    snapshot = next((run["inputs"] / "hf_home" / "hub").glob("models--*/snapshots/*"))
    base_generation = json.loads((snapshot / "generation_config.json").read_text())
    assert json.loads((export / "generation_config.json").read_text()) == base_generation
    config = json.loads((export / "config.json").read_text())
    assert config["eos_token_id"] == json.loads((snapshot / "config.json").read_text())["eos_token_id"]
    compare = subprocess.run(
        [VENV / "bin" / "python", HERE / "compare_weights.py", run["inputs"] / "hf_model", export],
        capture_output=True,
        text=True,
    )
    assert compare.returncode == 0, compare.stdout + compare.stderr
    assert "291 tensors equal within bf16 tolerance, dtype bfloat16" in compare.stdout
    sums = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=export, capture_output=True, text=True)
    assert sums.returncode == 0 and ".safetensors: OK" in sums.stdout, sums.stdout + sums.stderr


def test_a_rerun_is_a_no_op_and_a_lost_export_runs_alone_again(cpu_fab: Fab, run: dict):
    again = cpu_fab("train", *run["args"], timeout=600)
    assert again.returncode == 0, again.stderr
    assert "starting" not in again.stdout
    assert again.stdout.count("done already") == 6
    shutil.rmtree(run["work"] / "hf-trained" / run["run"])  # as a VM restart wipes /dev/shm
    redo = cpu_fab("train", *run["args"], timeout=900)
    assert redo.returncode == 0, redo.stdout[-3000:] + redo.stderr
    assert "export: was done but its outputs are gone" in redo.stdout
    started = [
        line.split(":")[0] for line in redo.stdout.splitlines() if line.endswith(("starting", "running it again"))
    ]
    assert started == ["export"]
    assert Path(run["work"] / "hf-trained" / run["run"] / "generation_config.json").exists()
