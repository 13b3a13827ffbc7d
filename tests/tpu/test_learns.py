"""MaxText's real GRPO makes a model better on the chip, and the run is judged as the product judges it (marker
`tpu`; tests/tpu/tier.py).

The model and data are make_learnable_inputs.py's (a bigram model whose greedy answer starts wrong, on problems
whose answer is always 7). Two runs of the same jobs, as `fab plan` renders them: one with learning rate 3e-3,
and a control with learning rate 0. Each is judged from its durable eval records, by the result line and the
publish gate (`results.publish_if: improved`) the Hub upload uses. MaxText's eval samples 4 completions a
problem (eval_sampling_strategy standard, pass_at_1), so the measure does not rest on one greedy completion.
"""

from __future__ import annotations

import time

import pytest

from bootstrap.demo import MAKE_LEARNABLE_INPUTS
from bootstrap.remote import attempts, evals
from tests.tpu import tier as harness
from tests.tpu.tier import note

STEPS = 40
LEARNS = [  # the CPU-measured settings (make_learnable_inputs.py): 4 prompts x 8 generations a step, float32
    "train.max_prefill_predict_length=112",
    "train.max_target_length=128",
    "train.weight_dtype=float32",
    "train.batch_size=4",
    "train.rl.num_generations=8",
    "train.learning_rate=3e-3",
    "train.num_test_batches=1",
    "train.eval_batch_size=64",
    "train.eval_interval=0",  # before and after training only: the sampled evals cost most of the run
    "train.checkpoint_period=20",
    "train.eval_sampling_strategy=standard",
    "train.eval_mode=pass_at_1",
    "train.num_eval_passes=4",
]


@pytest.fixture(scope="module")
def tier(tmp_path_factory) -> harness.Tier:
    return harness.Tier(tmp_path_factory.mktemp("learns"), make_inputs=MAKE_LEARNABLE_INPUTS)


def run(tier: harness.Tier, name: str, rate: str) -> dict:
    """One run of the learnable jobs at learning rate `rate`, judged from its durable eval records."""
    plan = tier.plan(name, tier.args(STEPS, *LEARNS, f"train.learning_rate={rate}"))
    started = time.monotonic()
    items = tier.drive(plan)
    assert harness.finished(items) == "done", tier.failure(plan)
    results = attempts.recorded_evals(attempts.read_records(plan.job("train").rendered.env[attempts.EVALS_ENV]), STEPS)
    result = evals.outcome(results)
    note(**{f"{name}_s": round(time.monotonic() - started, 1), f"{name}_result": result and evals.result_line(result)})
    return {"results": results, "result": result, "log": tier.log(plan, "train")}


# Each run its own fixture: one device call (600 s at most) runs one: `-k grpo` (learning rate 3e-3) or `-k control`.
@pytest.fixture(scope="module")
def learns(tier) -> dict:
    return run(tier, "learns", "3e-3")


@pytest.fixture(scope="module")
def control(tier) -> dict:
    return run(tier, "control", "0")


def test_grpo_learns_the_model_better_beyond_the_noise_and_the_gate_publishes_it(learns):
    result = learns["result"]
    assert "Pre RL Training" in learns["log"] and "Post RL Training" in learns["log"]  # MaxText's own evals
    assert result["format_after"] - result["format_before"] >= 20, result
    assert result["judged"] and result["change"] >= 20, result  # accuracy, beyond its 95% interval
    assert evals.held_back(learns["results"], "improved") is None  # what the Hub upload would do: publish


def test_the_control_with_learning_rate_0_is_not_better_and_is_held_back(control):
    result = control["result"]
    assert not (result["judged"] and result["change"] > 0), result
    assert evals.held_back(control["results"], "improved").startswith("publish_if: improved, and it did not")
