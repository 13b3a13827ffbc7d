"""The real MaxText 0.2.3 jobs on a real TPU chip, as `fab plan` renders them (marker `tpu`; tests/tpu/tier.py).

Run where a TPU is: `bash tests/tpu/install.sh DIR && TPU_RL_TPU_VENV=DIR DIR/bin/python -m pytest -m tpu
tests/tpu` (docs/tests.md). One run of the chain (convert, validate, train, export), then a second run of the
same arguments under another name, lost after its second committed step and resumed. Proven on the chip: the
environment check passes with the real device kind and count and refuses a wrong kind, count and slice in one
line each; every update's learning rate is the plan's; the export is the last checkpoint and every weight matrix
moved; the second run loads train's step from JAX's persistent cache and starts sooner; the resumed run trains
only the steps after its last commit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bootstrap.jobs import load
from bootstrap.jobs.plan import build, expected_environment
from bootstrap.paths import REPO
from tests.maxtext_cpu.conftest import HERE as CPU_TIER
from tests.tpu import tier as harness
from tests.tpu.tier import note

STEPS, LOST_AFTER = 4, 2
BF16 = 2**-7
TRAIN_STEP_HIT = "Persistent compilation cache hit for 'jit__train_step'"  # JAX's line, at debug level


@pytest.fixture(scope="module")
def tier(tmp_path_factory) -> harness.Tier:
    note(install=json.loads((harness.venv() / "install-timing.json").read_text()))  # install.sh's timing
    return harness.Tier(tmp_path_factory.mktemp("tpu"))


@pytest.fixture(scope="module")
def first(tier: harness.Tier) -> dict:
    args = tier.args(STEPS)
    plan = tier.plan("r1", args)
    started = time.monotonic()
    items = tier.drive(plan)
    note(first_run_s=round(time.monotonic() - started, 1), first_run_to_step_1_s=harness.seconds_to_first_step(items))
    assert harness.finished(items) == "done", tier.failure(plan)
    return {"args": args, "plan": plan, "items": items}


@pytest.fixture(scope="module")
def second(tier: harness.Tier, first: dict) -> dict:
    """The same arguments, another run: lost right after its step LOST_AFTER was committed, then resumed."""
    hold = tier.root / "hold"
    hold.write_text(f"{LOST_AFTER}\n")
    plan = tier.plan("r2", [*first["args"], f"train.env.TPU_RL_CPU_HOLD_FILE={hold}"])
    items: list[dict] = []
    watcher = threading.Thread(target=lambda: items.extend(tier.drive(plan)), daemon=True)
    watcher.start()
    deadline = time.monotonic() + harness.RUN_SECONDS
    while not hold.with_name("hold.held").exists() and watcher.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hold.with_name("hold.held").exists(), [i.get("line", i) for i in items][-40:]
    tier.kill_all()  # the VM is lost, with everything it ran
    watcher.join(60)
    hold.unlink()
    resumed = tier.drive(plan)
    assert harness.finished(resumed) == "done", tier.failure(plan)
    return {"plan": plan, "first_items": items, "items": resumed}


def test_the_environment_check_proves_the_chip_and_refuses_a_wrong_count_kind_and_slice(tier, first):
    validate = tier.log(first["plan"], "validate")
    assert re.search(r"environment: ok: JAX sees 1 tpu device\(s\); google-tunix 0\.1\.7;", validate), validate
    plan = first["plan"]
    right = expected_environment(plan.spec, plan.accelerator)
    v6e = build(load.read(REPO / "jobs"), [], "r1").accelerator  # the shipped v6e-8: its chips, kind, TPU_ variables
    shipped = {"chips": v6e.chips, "chip_kind": v6e.device_kind, "slice_env": dict(v6e.env)}
    shipped["accelerator"] = expected_environment(plan.spec, v6e).accelerator
    wrong = {
        "count": (replace(right, chips=8), {}),
        "kind": (replace(right, chip_kind="TPU v6 lite"), {}),
        "slice": (replace(right, **shipped), dict(v6e.env)),  # this host's packages, v6e-8's slice
    }
    lines = {}
    for name, (expected, variables) in wrong.items():
        env = {**tier.env(), **{k: v.replace("${hostname}", os.uname().nodename) for k, v in variables.items()}}
        result = subprocess.run(
            [tier.python, REPO / "bootstrap" / "remote" / "maxtext_check.py", "--environment", expected.to_json()],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        errors = [line for line in result.stdout.splitlines() if line.startswith("ENVIRONMENT ERROR")]
        assert result.returncode == 2 and len(errors) == 1, result.stdout + result.stderr[-2000:]
        lines[name] = errors[0]
    note(environment_errors=lines)
    assert "JAX sees 1 tpu device(s) (TPU v5 lite), vm.accelerator host expects 8 tpu devices" in lines["count"]
    assert "vm.accelerator host expects 1 tpu devices (TPU v6 lite)" in lines["kind"]
    assert "libtpu cannot start with vm.accelerator v6e-8" in lines["slice"] and "TPU_TOPOLOGY=2x4" in lines["slice"]


@pytest.fixture(scope="module")
def weights(tier: harness.Tier, first: dict) -> dict:
    """compare_weights.py (on the CPU, beside the chip) on the input model, the actor checkpoints, the export."""
    work = tier.shm / "llama3.1-8b-Instruct"
    compare = subprocess.run(
        [tier.python, CPU_TIER / "compare_weights.py", tier.inputs / "hf_model",
         work / "post-train" / "r1" / "checkpoints" / "actor", work / "hf-trained" / "r1"],
        capture_output=True, text=True, env={**tier.env(), "JAX_PLATFORMS": "cpu"}, timeout=600,
    )  # fmt: skip
    assert compare.returncode == 0, compare.stderr[-3000:]
    return json.loads(compare.stdout)


def test_every_update_used_the_learning_rate_the_plan_showed(first: dict, weights: dict):
    lr = first["plan"].job("train").lr_schedule
    used = {int(step): saved for step, saved in weights["steps"].items()}
    assert sorted(used) == list(range(1, STEPS + 1))
    for step, saved in used.items():
        assert saved["count"] == step and saved["lr"] == pytest.approx(lr.rate(step), rel=BF16), (step, saved)


def test_the_export_is_the_last_checkpoint_and_every_weight_matrix_moved(weights: dict):
    tensors = weights["tensors"]
    matrices = {name: t for name, t in tensors.items() if not name.endswith("norm.weight")}
    assert [name for name, t in matrices.items() if t["moved"] <= 1.0] == []
    assert {name: t["vs_checkpoint"] for name, t in tensors.items() if t["vs_checkpoint"] > 1.0} == {}
    note(least_moved_matrix=min(t["moved"] for t in matrices.values()))


def test_the_second_run_loads_trains_step_from_the_cache_and_starts_sooner(tier, first, second):
    log = tier.log(second["plan"], "train")  # the resumed attempt's; the lost one's is beside it
    lost = next(Path(second["plan"].job("train").job_dir).glob("log.*")).read_text(errors="replace")
    assert TRAIN_STEP_HIT in lost and TRAIN_STEP_HIT in log
    assert TRAIN_STEP_HIT not in tier.log(first["plan"], "train")  # the first run compiled it
    cold, warm = harness.seconds_to_first_step(first["items"]), harness.seconds_to_first_step(second["first_items"])
    note(step_1_cold_s=round(cold, 1), step_1_warm_s=round(warm, 1), cache_saving_s=round(cold - warm, 1))
    assert warm < cold, (cold, warm)


def test_the_resumed_run_trains_only_the_steps_after_its_last_commit(tier, second):
    log = tier.log(second["plan"], "train")
    assert f"Restored params from step: {LOST_AFTER} in" in log
    assert re.findall(r"Train step (\d+) training loss", log) == [str(s) for s in range(LOST_AFTER + 1, STEPS + 1)]


def test_the_grader_pool_is_built_once(tier, first):
    train = tier.log(first["plan"], "train")
    built = [line for line in train.splitlines() if "[shim] math_verify grader pool built with" in line]
    note(grader_pool_builds=len(built))
    assert len(built) == 1, built  # once: not per call, and not zero (the shim's pool really ran)
