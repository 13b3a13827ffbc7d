"""`fab train --probe`'s estimate against the run, on a TPU chip: the TPU tier's learning jobs (tests/tpu).

    (on the TPU host) TPU_RL_TPU_VENV=/tmp/tv /tmp/tv/bin/python benchmarks/bench_tpu_probe.py [--steps 20]

A probe of --probe steps (10) with one eval batch (estimate.probe_overrides), driven by the VM's own driver as fab drives it
(tests/tpu/tier.py); the whole run's estimate calibrated on the probe's record, as `fab train --probe` prints it;
then the whole run. Prints each stage's estimate against what it took, and keeps the numbers in $OUT/tpu-tier.json.
(TPU_RL_TPU_TIER_ON_CPU=1 tries it on a CPU.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bootstrap.demo import MAKE_LEARNABLE_INPUTS  # noqa: E402
from bootstrap.jobs.plan import Plan  # noqa: E402
from bootstrap.results import estimate, timing  # noqa: E402
from bootstrap.results.runs import RunRecord  # noqa: E402
from tests.tpu import tier as harness  # noqa: E402
from tests.tpu.test_learns import LEARNS  # noqa: E402

# Smaller evals than the tier's (4 sampled passes of 64 problems): the probe and the run fit one device call; the run's
# evals are two batches, the probe's one, so the estimate scales them.
SHAPE = ("train.eval_batch_size=16", "train.num_eval_passes=1", "train.num_test_batches=2")


def drive(tier: harness.Tier, plan: Plan) -> RunRecord:
    """One run through the VM's driver, kept as fab keeps it: each job's start and end, train's time split."""
    items = tier.drive(plan)
    assert harness.finished(items) == "done", tier.failure(plan)
    record = RunRecord(plan.run_name, chips=plan.accelerator.chips)
    for item in items:
        if item.get("event") == "end" and isinstance(item.get("state"), dict):
            state = item["state"]
            record.jobs[item["job"]] = {"job_dir": state["job_dir"], "state": "done", "started": state["started"],
                                        "finished": state["finished"], "ran": True}  # fmt: skip
    log = tier.log(plan, "train")
    if os.environ.get("OUT"):  # train's own log beside the numbers, to see where an error came from
        Path(os.environ["OUT"], f"{plan.run_name}-train.log").write_text(log)
    split = timing.from_log(log)
    record.timing = estimate.measured(split, plan.job("train").rendered.argv[3:], plan)
    record.save()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="the whole run's steps")
    parser.add_argument("--probe", type=int, default=10, help="the probe's steps")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TPU_RL_RUNS"] = str(Path(tmp) / "runs")
        tier = harness.Tier(Path(tmp) / "tier", make_inputs=MAKE_LEARNABLE_INPUTS)
        whole_args = tier.args(options.steps, *LEARNS, *SHAPE)
        probe = drive(tier, tier.plan("probe", [*whole_args, *estimate.probe_overrides(options.probe)]))
        whole_plan = tier.plan("whole", whole_args)
        expected = estimate.estimate(whole_plan).to_dict()
        whole = drive(tier, whole_plan)
    rows = []
    numbers = {"probe_s": estimate.took(probe), "whole_s": estimate.took(whole), "probe_split": probe.timing,
               "whole_split": whole.timing, "probe_estimate": expected["stages"]}  # fmt: skip
    for stage in expected["stages"]:
        job = whole.jobs.get(stage["name"])
        if job is None or stage["low_s"] is None or not stage["high_s"]:  # a shared job done by the probe
            continue
        actual, middle = job["finished"] - job["started"], (stage["low_s"] + stage["high_s"]) / 2
        rows.append(f"{stage['name']:<10} {stage['low_s']:>7.0f}-{stage['high_s']:<7.0f} {actual:>8.1f} "
                    f"{(middle - actual) / max(actual, 1):>+7.0%}")  # fmt: skip
        numbers[f"probe_estimate_{stage['name']}"] = [round(stage["low_s"]), round(stage["high_s"]), round(actual, 1)]
    print(
        f"calibrated on {expected['calibrated_on']} ({options.probe} steps, one eval batch); the run: {options.steps} steps"
    )
    print(f"{'stage':<10} {'estimated (s)':>15} {'took (s)':>8} {'error':>7}")
    print("\n".join(rows))
    harness.note(**numbers)


if __name__ == "__main__":
    main()
