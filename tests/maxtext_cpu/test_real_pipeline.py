"""The real pipeline, end to end, through fab, on the newest release in conftest.RELEASES: real `fab setup` of
that maxtext from PyPI, then the real to_maxtext, train_rl (only vLLM replaced by a CPU sampler, shim/) and
to_huggingface on a tiny model. (The shipped release, 0.2.3, runs the pipeline end to end in test_real_loss and
test_demo, with its own train settings and pins; the schedule of each release is test_schedule's.)

The tiny model earns real rewards (make_inputs.py), so these prove the outcome, not only the mechanics:
GRPO had a learning signal, the learning rate of every update was the one `fab plan` showed (and the one
MaxText's own optimizer builds), the weights moved, and the export is the final checkpoint.
The tests share one run (module fixture) and run in file order: the last ones change it.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.demo import MAKE_INPUTS, cpu
from bootstrap.jobs import tracking
from bootstrap.remote import attempts, evals
from tests import mlflowserver
from tests.loopback import Fab, edit_yaml
from tests.maxtext_cpu.conftest import (
    BF16,
    HERE,
    RELEASES,
    REWARD,
    WANDB_PROJECT,
    Release,
    assert_logged_to_wandb_offline,
    overrides,
    planned_schedule,
    run_identity,
    set_up,
)

STEPS = 4
# Two key-value heads, each shared by two query heads (the tier's other runs: 2 share 1): compare_weights.py's own
# reshape of each head axis then sees an export that swaps heads or groups them wrongly.
LAYOUT_HEADS = (4, 2)
NEWEST = "0.2.5"  # the newest release in RELEASES; the shipped one's pipeline runs in test_real_loss and test_demo
WANDB_KEY = "wandb-cpu-tier-" + "5" * 26
UNREACHABLE = "http://127.0.0.1:9"  # W&B's server as the "VM" sees it: nothing listens there


def current_run(fab: Fab) -> str:
    return (fab.tmp / "state" / "current-run").read_text().strip()


@pytest.fixture(scope="module", params=[NEWEST])
def release(request) -> Release:
    return RELEASES[request.param]


@pytest.fixture(scope="module")
def run(cpu_fab: Fab, release: Release, mlflow_server: str) -> Iterator[dict]:
    """fab setup, the tiny inputs, then one fab train, tracked by a real MLflow server and by W&B, with its key set
    here and W&B out of reach from the "VM" (so offline); everything the tests below read."""
    set_up(cpu_fab, release)
    inputs = cpu_fab.tmp / "inputs"
    heads = [str(n) for n in LAYOUT_HEADS]
    subprocess.run([release.venv / "bin" / "python", MAKE_INPUTS, inputs, *heads], check=True, capture_output=True)
    args = [word for override in overrides(inputs, STEPS, release, LAYOUT_HEADS) for word in ("--arg", override)]
    args += ["--arg", f"train.env.WANDB_BASE_URL={UNREACHABLE}"]
    edit_yaml(
        cpu_fab.jobs / "pipeline.yaml", lambda data: data["results"].update(mlflow=mlflow_server, wandb=WANDB_PROJECT)
    )
    cpu_fab.secrets[tracking.KEY] = WANDB_KEY
    train = cpu_fab("train", *args, timeout=1800)
    assert train.returncode == 0, train.stdout[-5000:] + train.stderr
    work = cpu_fab.tmp / "shm" / "llama3.1-8b-Instruct"
    yield {"args": args, "inputs": inputs, "train": train, "run": current_run(cpu_fab), "work": work}


@pytest.fixture(scope="module")
def metrics(cpu_fab: Fab, run: dict) -> list[dict]:
    """`fab metrics` of the run: metrics.csv as rows, one per training step."""
    result = cpu_fab("metrics", *run["args"])
    assert result.returncode == 0, result.stderr
    with (cpu_fab.tmp / "runs" / run["run"] / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def weights(run: dict, release: Release) -> dict:
    """compare_weights.py on the input model, the actor checkpoints and the export (before any test changes them)."""
    actor = run["work"] / "post-train" / run["run"] / "checkpoints" / "actor"
    export = run["work"] / "hf-trained" / run["run"]
    compare = subprocess.run(
        [release.venv / "bin" / "python", HERE / "compare_weights.py", run["inputs"] / "hf_model", actor, export],
        capture_output=True,
        text=True,
    )
    assert compare.returncode == 0, compare.stderr[-3000:]
    return json.loads(compare.stdout)


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


def test_the_environment_was_proven_beside_the_validator_before_train(cpu_fab: Fab, run: dict):
    """The real check (remote/envcheck.py) on the real environment: JAX on CPU, tunix as the spec installs it,
    and uv's report holding only the accepted conflicts."""
    log = next((cpu_fab.tmp / "state" / "shared").glob("validate-*/log")).read_text()
    assert re.search(
        rf"environment: ok: JAX sees [0-9]+ cpu device\(s\); google-tunix 0\.1\.7; uv pip check: "
        rf"{len(cpu.ACCEPTED_CONFLICTS)} accepted conflict\(s\)",
        log,
    ), log


def test_fab_showed_train_steps_and_the_real_eval_table(run: dict):
    out = run["train"].stdout
    assert f"[train] training steps 1/{STEPS}" in out and f"[train] training steps {STEPS}/{STEPS}" in out
    table = out[out.index("GSM8K evaluation") :]
    assert "before training" in table and "step 2" in table and "after training" in table
    assert f"step {STEPS}" not in table  # the eval at the final step is the Post eval, not a second row
    assert "0/2" in table  # corr/total of the real evals (a random model answers nothing right)


def test_the_run_ends_with_its_result_line_from_the_real_evals(cpu_fab: Fab, run: dict):
    """The result line's numbers are the real train log's, and 2 problems are said to judge nothing."""
    log = cpu_fab.job_dir(run["run"], "train") / "log"
    result = evals.outcome(evals.from_log(str(log), STEPS))
    assert result["problems"] == 2
    # what the publish gate judges by: the launcher recorded every eval the real train_rl logged (absl's logging)
    records = attempts.read_records(str(run["work"] / "post-train" / run["run"] / "evals"))
    assert attempts.recorded_evals(records, STEPS) == evals.from_log(str(log), STEPS)
    line = f"result: {evals.result_line(result)}"
    assert line.endswith(f"too few problems to tell this change from noise (+-{result['interval']:.1f} points)")
    assert line in " ".join(run["train"].stdout.split())


def test_metrics_come_from_the_real_tensorboard_tags(cpu_fab: Fab, run: dict, metrics: list[dict]):
    for tag in ("actor/train/loss", "actor/train/kl", "rewards/train/score/mean", "actor/train/learning_rate"):
        assert tag in metrics[0]
    assert [row["step"] for row in metrics] == [str(s) for s in range(1, STEPS + 1)]
    folder = cpu_fab.tmp / "runs" / run["run"]
    assert (folder / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert (folder / "evals.csv").read_text().count("\n") == 4  # header, before, step 2, after


def test_wandb_logged_the_runs_reward_series_offline_under_its_name_and_never_saw_its_key(
    cpu_fab: Fab, run: dict, metrics: list[dict], release: Release
):
    """With a key and W&B out of reach, train logged offline (the no-key path, the README's offline one: test_real_loss),
    the series fab metrics shows; the key is in no output and no file but the VM's secrets folder."""
    logged = assert_logged_to_wandb_offline(
        cpu_fab, run["run"], release, "127.0.0.1:9 cannot be reached (Connection refused)"
    )
    assert len(logged) == STEPS
    secret, state = WANDB_KEY.encode(), cpu_fab.tmp / "state"
    assert WANDB_KEY not in run["train"].stdout + run["train"].stderr
    holding = [f for f in cpu_fab.tmp.rglob("*") if f.is_file() and not f.is_symlink() and secret in f.read_bytes()]
    assert holding == [state / "secrets" / tracking.KEY]


def test_mlflow_received_the_run_with_the_numbers_fab_metrics_wrote(cpu_fab: Fab, run: dict, metrics, mlflow_server):
    """Logged at train's end and again by fab metrics: each step once, every reward, eval and the result as
    metrics.csv, evals.csv and summary.json hold them, the run's settings, FINISHED."""
    assert f"MLflow: run {run['run']} logged, {mlflow_server}/#/experiments/" in run["train"].stdout
    found = mlflowserver.logged(mlflow_server, run_identity(cpu_fab, run["run"]))
    history = found["history"]
    assert history[REWARD] == {int(row["step"]): float(row[REWARD]) for row in metrics if row[REWARD]}
    summary = json.loads((cpu_fab.tmp / "runs" / run["run"] / "summary.json").read_text())
    last = max(history[REWARD])
    assert history["result/before"] == {last: summary["result"]["before"]}
    assert history["result/after"] == {last: summary["result"]["after"]}
    assert history["goodput/share"] == {last: summary["goodput"]["share"]}
    with (cpu_fab.tmp / "runs" / run["run"] / "evals.csv").open() as f:
        evals_csv = list(csv.DictReader(f))
    assert sorted(history["eval/accuracy"].values()) == sorted(float(row["accuracy"]) for row in evals_csv)
    params = {p["key"]: p["value"] for p in found["run"]["data"]["params"]}
    assert params["train.learning_rate"] == "3e-4" and params["run"] == run["run"]
    assert found["run"]["info"]["status"] == "FINISHED"


def test_fab_tensorboard_serves_the_runs_reward_and_a_second_run_as_it_comes(cpu_fab: Fab, run: dict, metrics):
    """A real TensorBoard over the run's real events, copied over the SSH connection: its HTTP API gives the reward
    series fab metrics wrote; a run whose events arrive while it serves appears; Ctrl-C ends both cleanly."""
    copied = cpu_fab.tmp / "runs" / run["run"] / "tensorboard"
    shutil.rmtree(copied)  # fab metrics' copy: what TensorBoard serves must be fab tensorboard's own
    process = cpu_fab.start("tensorboard", *run["args"], "--every", "60", own_group=True)
    try:
        url = _said(process, re.compile(r"TensorBoard at (http://127\.0\.0\.1:\d+/)"))
        assert list(copied.rglob("events.out.tfevents.*"))  # copied before it served: not a minute later
        tags = _until(lambda: json.loads(_get(url + "data/plugin/scalars/tags")), lambda found: found)
        served = next(name for name in tags if name.startswith(run["run"]))
        series = json.loads(_get(f"{url}data/plugin/scalars/scalars?run={served}&tag=rewards/train/score/mean"))
        rewards = sorted(round(float(row["rewards/train/score/mean"]), 5) for row in metrics)
        assert sorted(round(value, 5) for _, _, value in series) == rewards  # fab metrics' numbers, all of them
        second = cpu_fab.tmp / "runs" / "a-second-run" / "tensorboard"
        shutil.copytree(copied, second)
        _until(
            lambda: json.loads(_get(url + "data/runs")), lambda runs: any(r.startswith("a-second-run") for r in runs)
        )
    finally:
        process.send_signal(signal.SIGINT)
        try:
            out = process.communicate(timeout=60)[0]
        finally:  # never left running: fab, and a TensorBoard it left, end with the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            shutil.rmtree(cpu_fab.tmp / "runs" / "a-second-run", ignore_errors=True)
    assert process.returncode == 0 and "TensorBoard stopped" in out, out[-2000:]


def _said(process: subprocess.Popen, pattern: re.Pattern, seconds: float = 180) -> str:
    """The first group of the first line of `process`'s output that matches, within `seconds`."""
    deadline, seen = time.monotonic() + seconds, []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 1)
        line = process.stdout.readline() if ready else ""
        seen.append(line)
        if found := pattern.search(line):
            return found[1]
        if process.poll() is not None and not line:
            break
    raise AssertionError(f"not said: {pattern.pattern}\n{''.join(seen)[-3000:]}")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def _until(read, done, seconds: float = 120):
    """`read()` again until `done` holds of it, within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        found = read()
        if done(found):
            return found
        assert time.monotonic() < deadline, f"still {found!r}"
        time.sleep(0.5)


def test_grpo_had_a_learning_signal(cpu_fab: Fab, run: dict, metrics: list[dict]):
    """rl.yml's batch_size is 1: each step's rewards are one prompt's group of rl.num_generations completions,
    scored by MaxText's own reward functions."""
    spread = [float(row["rewards/train/score/max"]) - float(row["rewards/train/score/min"]) for row in metrics]
    assert any(s > 0 for s in spread), spread  # completions of one prompt earned different rewards
    assert spread[0] > 0, spread
    # At step 1 the policy is the reference model, so the KL term has no gradient: what is left is the
    # policy gradient of the group's advantages, which are zero unless the rewards differ.
    assert float(metrics[0]["actor/train/kl"]) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics[0]["actor/train/grad_norm"]) > 0.01, metrics[0]
    assert any(float(row["actor/train/loss"]) != 0.0 for row in metrics)
    train = job_log(cpu_fab, run, "train")  # answers were graded, and the job still ended (maxtext_run.py)
    assert "[tpu-rl] closed MaxText's math_verify grader pool" in train


def test_every_update_used_the_learning_rate_fab_plan_showed(cpu_fab: Fab, run: dict, metrics: list, weights: dict):
    """The optimizer state saved at each step (a checkpoint every step) holds the rate that step's update used."""
    lr = planned_schedule(cpu_fab, run["args"])
    assert (lr.train_steps, lr.schedule_steps) == (STEPS, STEPS)  # ${train_steps}: sized to the run
    used = {int(step): saved for step, saved in weights["steps"].items()}
    assert sorted(used) == list(range(1, STEPS + 1))
    for step, saved in used.items():
        assert saved["count"] == step
        assert saved["lr"] == pytest.approx(lr.rate(step), rel=BF16), (step, saved)  # the trainer keeps it in bf16
    for row in metrics[1:]:  # and what fab metrics shows for each step is that step's rate
        assert float(row["actor/train/learning_rate"]) == pytest.approx(used[int(row["step"])]["lr"], rel=1e-6)
    assert lr.highest == pytest.approx(3e-4)  # the peak is reached, in the first update here (no warmup in 4 steps)


def test_training_moved_the_weights_and_the_export_is_the_final_checkpoint(weights: dict):
    """With weight decay off, only gradients move the weights, and only the rewards give a gradient at step 1."""
    tensors = weights["tensors"]
    assert weights["names_match"] and len(tensors) == 291 and weights["dtypes"] == ["bfloat16"]
    matrices = {name: t for name, t in tensors.items() if not name.endswith("norm.weight")}
    unmoved = [name for name, t in matrices.items() if t["moved"] <= 1.0]
    assert not unmoved, unmoved[:5]  # every weight matrix changed by more than bf16 rounding explains
    assert max(t["moved"] for t in tensors.values()) > 5
    differs = {name: t["vs_checkpoint"] for name, t in tensors.items() if t["vs_checkpoint"] > 1.0}
    assert not differs, list(differs.items())[:5]  # every tensor is the last actor checkpoint's, within bf16
    assert max(t["vs_first_checkpoint"] for t in tensors.values()) > 1.0  # the last one, not an earlier one


def test_export_read_the_highest_actor_step(run: dict, cpu_fab: Fab):
    actor = run["work"] / "post-train" / run["run"] / "checkpoints" / "actor"
    assert sorted(int(p.name) for p in actor.iterdir() if p.name.isdigit()) == list(range(1, STEPS + 1))
    assert (actor / str(STEPS) / "optimizer_state").is_dir()
    assert f"load_parameters_path: {actor}/{STEPS}/model_params" in job_log(cpu_fab, run, "export")


def test_the_export_is_servable(run: dict):
    export = run["work"] / "hf-trained" / run["run"]
    snapshot = next((run["inputs"] / "hf_home" / "hub").glob("models--*/snapshots/*"))
    base_generation = json.loads((snapshot / "generation_config.json").read_text())
    assert json.loads((export / "generation_config.json").read_text()) == base_generation
    config = json.loads((export / "config.json").read_text())
    assert config["eos_token_id"] == json.loads((snapshot / "config.json").read_text())["eos_token_id"]
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


def test_fab_metrics_says_where_the_paid_time_went_as_the_result_line_and_fab_runs_do(cpu_fab: Fab, run: dict, metrics):
    """The kept steps and each cause add up to the time paid: this run's jobs from the first to the last; the steps
    are train's own (its log's steady rate, its saves left out), the evals and start-up are there, and the result
    line, summary.json and fab runs give the same goodput."""
    said = metrics_out(cpu_fab, run)  # first: the summary.json read below is this call's (its idle time grows)
    summary = json.loads((cpu_fab.tmp / "runs" / run["run"] / "summary.json").read_text())
    record = json.loads((cpu_fab.tmp / "runs" / run["run"] / "record.json").read_text())
    spent, split = summary["goodput"], record["timing"]
    assert spent["paid_s"] == pytest.approx(spent["productive_s"] + sum(spent["badput_s"].values()), abs=0.5)
    jobs = [job for job in record["jobs"].values() if job.get("ran", True)]
    span = max(j["finished"] for j in jobs) - min(j["started"] for j in jobs)
    assert record["booted"] and not record["chips"]  # this machine's boot: no VM was made for the run, none paid
    assert spent["paid_s"] == pytest.approx(span + spent["badput_s"]["idle"], abs=1)
    assert spent["productive_s"] == pytest.approx(STEPS * split["step_s"] - split["saves_s"], abs=0.5)
    assert spent["badput_s"]["evals"] > 0 and spent["badput_s"]["startup"] > 0 and spent["badput_s"]["setup"] >= 0
    # fab train's own result line said it at the run's end; another test may run export again since (a later job
    # is paid time too), so the figures of now are compared among themselves (test_goodput.py: the line = fab runs)
    assert re.search(r"took .*, goodput \d+% \(estimated", " ".join(run["train"].stdout.split())), run["train"].stdout
    assert f"goodput {spent['share']:.0%}" in said
    listed = json.loads(cpu_fab("runs", "--json").stdout)
    (row,) = [row for row in listed if row["run"] == run["run"]]
    assert row["goodput"] == spent and row["chip_hours"] == pytest.approx(spent["chip_hours"], abs=0.01)


def metrics_out(fab: Fab, run: dict) -> str:
    result = fab("metrics", *run["args"])
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split())


def test_the_next_runs_estimate_is_calibrated_on_this_runs_measured_time(cpu_fab: Fab, run: dict):
    """The run measured where train's time went; `fab plan` for a next run with twice the steps scales that, not
    the guide's figures. (How close it comes: benchmarks/bench_estimate.py; timings are no test here.)"""
    assert "took " in run["train"].stdout and "(estimated " in run["train"].stdout  # the result line, against
    record = json.loads((cpu_fab.tmp / "runs" / run["run"] / "record.json").read_text())
    split = record["timing"]
    # evals after steps 2 and 4 (eval_interval 2) and after training
    assert (split["steps"], split["evals"]) == (STEPS, 3) and split["step_s"] > 0 and split["startup_s"] > 0
    assert record["estimate"]["calibrated_on"] is None  # the first run here: nothing measured before it
    args = [*run["args"], "--arg", f"vars.num_batches={2 * STEPS}"]
    plan = cpu_fab("plan", "--json", "--run-name", "next", *args)
    assert plan.returncode == 0, plan.stderr
    expected = json.loads(plan.stdout)["estimate"]
    assert expected["calibrated_on"] == run["run"] and expected["unknown"] == []
    stages = {stage["name"]: stage for stage in expected["stages"]}
    assert f"{2 * STEPS} steps x {split['step_s']:.2f} s" in stages["train"]["source"]
    assert stages["convert"]["low_s"] == 0 and "done already" in stages["convert"]["source"]  # shared
