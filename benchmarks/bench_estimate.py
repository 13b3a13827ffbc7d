"""How close `fab plan`'s estimate comes: a run measured, then a second run with other steps estimated from it.

    .venv/bin/python benchmarks/bench_estimate.py [--first 4] [--second 8]

On the loopback host of the CPU tier (tests/maxtext_cpu, MaxText 0.2.3 on the tiny model): `fab setup`, a
first `fab train` with --first steps (it measures train's time split), then `fab plan --json` for a second
run with --second steps (the estimate, calibrated on the first), then that run. Prints each stage's estimate
against what it took, and the error of the whole run's midpoint.
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
from bootstrap.results.estimate import took  # noqa: E402
from bootstrap.results.runs import RunRecord  # noqa: E402
from tests.maxtext_cpu.conftest import VENV, overrides  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=4, help="the measured run's steps")
    parser.add_argument("--second", type=int, default=8, help="the estimated run's steps")
    options = parser.parse_args()
    with cpu_fab() as fab:
        tmp = fab.tmp
        assert fab("setup", timeout=3600).returncode == 0
        inputs = tmp / "inputs"
        subprocess.run([VENV / "bin" / "python", MAKE_INPUTS, inputs], check=True, capture_output=True)

        def run(name: str, steps: int) -> None:
            args = [word for o in overrides(inputs, steps) for word in ("--arg", o)]
            done = fab("train", "--run-name", name, *args, timeout=3600)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr

        run("measured", options.first)
        args = [word for o in overrides(inputs, options.second) for word in ("--arg", o)]
        planned = fab("plan", "--json", "--run-name", "estimated", *args)
        assert planned.returncode == 0, planned.stderr
        expected = json.loads(planned.stdout)["estimate"]
        run("estimated", options.second)
        os.environ["TPU_RL_RUNS"] = str(tmp / "runs")
        record = RunRecord.load("estimated")
    print(f"calibrated on run {expected['calibrated_on']}: {options.first} steps measured, {options.second} estimated")
    print(f"{'stage':<10} {'estimated (s)':>16} {'took (s)':>9} {'error of the middle':>20}")
    for stage in expected["stages"]:
        job = record.jobs.get(stage["name"]) or {}
        if stage["low_s"] is None or not job.get("finished"):
            continue
        actual = job["finished"] - job["started"]
        middle = (stage["low_s"] + stage["high_s"]) / 2
        error = f"{(middle - actual) / actual:+.0%}" if actual > 1 else "-"
        print(f"{stage['name']:<10} {stage['low_s']:>7.0f}-{stage['high_s']:<8.0f} {actual:>9.1f} {error:>20}")
    whole = took(record)
    middle = (expected["low_s"] + expected["high_s"]) / 2
    print(
        f"{'in all':<10} {expected['low_s']:>7.0f}-{expected['high_s']:<8.0f} {whole:>9.1f} {(middle - whole) / whole:>+20.0%}"
    )


if __name__ == "__main__":
    main()
