"""How close `fab plan`'s estimate comes: a run measured, then a second run with other steps estimated from it.

    .venv/bin/python benchmarks/bench_estimate.py [--first 4] [--second 8] [--probe 3]
    .venv/bin/python benchmarks/bench_estimate.py --probe 3 --lengths 2,4,8

On the loopback host of the CPU tier (tests/maxtext_cpu, MaxText 0.2.3 on the tiny model): `fab setup`, a
first `fab train` with --first steps (it measures train's time split), then `fab plan --json` for a second
run with --second steps (the estimate, calibrated on the first), then that run. Prints each stage's estimate
against what it took, and the error of the whole run's midpoint. With --lengths: one probe, then a run of each
multiple of its steps, every estimate made from the probe alone before any of them ran; train's and the whole
run's error at each length, and each run's goodput (results/goodput.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_real import cpu_fab  # noqa: E402  (this folder is on sys.path when run as a script)

from bootstrap.demo import MAKE_INPUTS  # noqa: E402
from bootstrap.results import goodput  # noqa: E402
from bootstrap.results.estimate import took  # noqa: E402
from bootstrap.results.runs import RunRecord  # noqa: E402
from tests.maxtext_cpu.conftest import VENV, overrides  # noqa: E402

SHAPE = ["train.rl.num_generations=8", "train.num_test_batches=1"]  # --probe: twice the generations, half the evals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=4, help="the measured run's steps")
    parser.add_argument("--second", type=int, default=8, help="the estimated run's steps")
    parser.add_argument("--probe", type=int, default=0, help="measure with `fab train --probe N` of the second run")
    parser.add_argument("--lengths", default="", help="with --probe: runs of these multiples of its steps (2,4,8)")
    options = parser.parse_args()
    if options.lengths:
        lengths(options.probe, [int(n) for n in options.lengths.split(",")])
        return
    shape = SHAPE if options.probe else []
    with cpu_fab() as fab:
        tmp = fab.tmp
        assert fab("setup", timeout=3600).returncode == 0
        inputs = tmp / "inputs"
        subprocess.run([VENV / "bin" / "python", MAKE_INPUTS, inputs], check=True, capture_output=True)

        def args(steps: int) -> list[str]:
            return [word for o in [*overrides(inputs, steps), *shape] for word in ("--arg", o)]

        def planned() -> dict:
            found = fab("plan", "--json", "--run-name", "estimated", *args(options.second))
            assert found.returncode == 0, found.stderr
            return json.loads(found.stdout)["estimate"]

        uncalibrated = planned()
        measure = ["--probe", str(options.probe)] if options.probe else ["--run-name", "measured"]
        done = fab("train", *measure, *args(options.first), timeout=3600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        expected = planned()
        done = fab("train", "--run-name", "estimated", *args(options.second), timeout=3600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        os.environ["TPU_RL_RUNS"] = str(tmp / "runs")
        record = RunRecord.load("estimated")
    how = f"a probe of {options.probe} steps" if options.probe else f"a run of {options.first} steps"
    print(f"calibrated on {expected['calibrated_on']} ({how}); the estimated run: {options.second} steps {shape}")
    print(f"{'stage':<10} {'estimated (s)':>16} {'took (s)':>9} {'error':>7}   {'uncalibrated (s)':>18} {'error':>7}")
    for stage, before in zip(expected["stages"], uncalibrated["stages"], strict=True):
        job = record.jobs.get(stage["name"]) or {}
        if not job.get("finished") or not job.get("ran", True):  # done already: what the estimate said of it
            print(f"{stage['name']:<10} {stage['low_s']:>7.0f}-{stage['high_s']:<8.0f} not run: {stage['source']}")
            continue
        actual = job["finished"] - job["started"]
        print(f"{stage['name']:<10} {_row(stage, actual)}   {_row(before, actual, 18)}")
    print(f"{'in all':<10} {_row(expected, took(record))}   {_row(uncalibrated, took(record), 18)}")


def lengths(probe: int, multiples: list[int]) -> None:
    """A probe, each length's estimate from it alone, then each run: how far the estimate's middle fell."""
    with cpu_fab() as fab:
        assert fab("setup", timeout=3600).returncode == 0
        inputs = fab.tmp / "inputs"
        subprocess.run([VENV / "bin" / "python", MAKE_INPUTS, inputs], check=True, capture_output=True)

        def args(steps: int) -> list[str]:
            return [word for o in [*overrides(inputs, steps), *SHAPE] for word in ("--arg", o)]

        done = fab("train", "--probe", str(probe), *args(probe * multiples[-1]), timeout=3600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        expected = {}
        for n in multiples:
            found = fab("plan", "--json", "--run-name", f"x{n}", *args(probe * n))
            assert found.returncode == 0, found.stderr
            expected[n] = json.loads(found.stdout)["estimate"]
        records = {}
        for n in multiples:
            done = fab("train", "--run-name", f"x{n}", *args(probe * n), timeout=3600)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr
            os.environ["TPU_RL_RUNS"] = str(fab.tmp / "runs")
            records[n] = RunRecord.load(f"x{n}")
    print(f"calibrated on a probe of {probe} steps ({expected[multiples[0]]['calibrated_on']}), {SHAPE}")
    print(
        f"{'steps':>5}  {'train est. (s)':>16} {'took (s)':>9} {'error':>7}   {'all est. (s)':>16} {'error':>7}  goodput"
    )
    for n in multiples:
        record, estimate = records[n], expected[n]
        train = next(stage for stage in estimate["stages"] if stage["name"] == "train")
        job = record.jobs["train"]
        ledger = goodput.measured(record)
        print(f"{probe * n:>5}  {_row(train, job['finished'] - job['started'])}   {_row(estimate, took(record), 18)}  "
              f"{ledger.line() if ledger else '-'}")  # fmt: skip


def _row(figure: dict, actual: float, width: int = 16) -> str:
    """An estimate's range, what it took, and the error of its middle."""
    if figure["low_s"] is None:
        return f"{'unknown':>{width}} {actual:>9.1f} {'-':>7}"
    middle = (figure["low_s"] + figure["high_s"]) / 2
    error = f"{(middle - actual) / actual:+.0%}" if actual > 1 else "-"
    span = f"{figure['low_s']:.0f}-{figure['high_s']:.0f}"
    return f"{span:>{width}} {actual:>9.1f} {error:>7}" if width == 16 else f"{span:>{width}} {error:>7}"


if __name__ == "__main__":
    main()
