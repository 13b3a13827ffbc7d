"""`fab train --probe`'s estimate against the run, on a TPU chip: the TPU tier's learning jobs (tests/tpu).

    (on the TPU host) TPU_RL_TPU_VENV=/tmp/tv /tmp/tv/bin/python benchmarks/bench_tpu_probe.py [--probe 4]
        [--lengths 2,4,8] [--only 2,4]

A probe of --probe steps with one eval batch (estimate.probe_overrides), driven by the VM's own driver as fab drives it
(tests/tpu/tier.py); each length's estimate calibrated on the probe's record alone, as `fab train --probe` prints it;
then each run (--only: a share that fits one device call). Prints train's estimate against what it took, each run's
goodput and its sampler-trainer agreement, and keeps the numbers in $OUT/tpu-tier.json.
(TPU_RL_TPU_TIER_ON_CPU=1 tries it on a CPU.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bootstrap.demo import MAKE_LEARNABLE_INPUTS  # noqa: E402
from bootstrap.jobs.plan import Plan  # noqa: E402
from bootstrap.remote import health  # noqa: E402
from bootstrap.results import estimate, goodput, timing  # noqa: E402
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
    record.timing = estimate.measured(split, plan.job("train").rendered, plan)
    record.save()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", type=int, default=4, help="the probe's steps")
    parser.add_argument("--lengths", default="2,4,8", help="the runs, as multiples of the probe's steps")
    parser.add_argument("--only", default="", help="of those, run only these (a device call's share; default all)")
    parser.add_argument("--train-only", action="store_true", help="no export and no validator: train's time alone")
    options = parser.parse_args()
    multiples = [int(n) for n in options.lengths.split(",")]
    run = [int(n) for n in options.only.split(",")] if options.only else multiples
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TPU_RL_RUNS"] = str(Path(tmp) / "runs")
        # the agreement measured on the learning runs: the tier's sampler gives its log-probabilities (remote/health.py)
        rules = json.dumps({**dataclasses.asdict(health.Rules()), "smoke_right": 0, "agreement": True})
        tier = harness.Tier(
            Path(tmp) / "tier",
            make_inputs=MAKE_LEARNABLE_INPUTS,
            train_env={health.RULES_ENV: rules},
            jobs_run=("convert", "train") if options.train_only else ("convert", "train", "export"),
        )
        args = {n: tier.args(options.probe * n, *LEARNS, *SHAPE) for n in multiples}
        probe = drive(tier, tier.plan("probe", [*args[multiples[-1]], *estimate.probe_overrides(options.probe)]))
        expected = {n: estimate.estimate(tier.plan(f"x{n}", args[n])) for n in multiples}  # from the probe alone
        print(f"a probe of {options.probe} steps (one eval batch): {probe.timing}", flush=True)
        print(f"{'steps':>5} {'train est. (s)':>15} {'took (s)':>8} {'error':>7}  goodput", flush=True)
        numbers = {"probe_steps": options.probe, "probe_split": probe.timing}
        for n in run:
            plan = tier.plan(f"x{n}", args[n])
            record = drive(tier, plan)
            train = next(stage for stage in expected[n].stages if stage.name == "train")
            job = record.jobs["train"]
            actual, middle = job["finished"] - job["started"], (train.low_s + train.high_s) / 2
            ledger = goodput.measured(record)
            agreed = _agreement(tier.log(plan, "train"))
            print(f"{options.probe * n:>5} {train.low_s:>7.0f}-{train.high_s:<7.0f} {actual:>8.1f} "
                  f"{(middle - actual) / actual:>+7.0%}  {ledger.line() if ledger else '-'}\n"
                  f"      {agreed or 'no agreement line in its log'}", flush=True)  # fmt: skip
            numbers[f"x{n}"] = {"estimated": [round(train.low_s), round(train.high_s)], "took": round(actual, 1),
                                "split": record.timing, "goodput": ledger.to_dict() if ledger else None,
                                "agreement": agreed}  # fmt: skip
            harness.note(**numbers)


def _agreement(log: str) -> str | None:
    """train's last word on the sampler-trainer agreement (remote/health.py)."""
    return next((line for line in reversed(log.splitlines()) if "the sampler and the trainer agreed" in line), None)


if __name__ == "__main__":
    main()
