"""Time every bad input of tests/unit/test_bad_inputs.py through the real `fab`: wall, CPU and peak memory.

    .venv/bin/python benchmarks/bench_bad_inputs.py

The test bounds CPU time and memory; this reports the wall time too (the issue's
"under 2 s"), which depends on the machine's load and so is not a test.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bootstrap.paths import REPO  # noqa: E402
from tests.fabfork import FAB  # noqa: E402
from tests.unit.test_bad_inputs import ARG_CASES, RUN_NAME_CASES, YAML_CASES  # noqa: E402


def main() -> None:
    rows = []
    for case in YAML_CASES + ARG_CASES + RUN_NAME_CASES:
        with tempfile.TemporaryDirectory() as directory:
            tmp = Path(directory)
            shutil.copytree(REPO / "jobs", tmp / "jobs")
            if case.file:
                path = tmp / "jobs" / case.file
                path.write_bytes(case.change(path.read_bytes()))
            env = {**os.environ, "TPU_RL_JOBS": str(tmp / "jobs"), "HF_TOKEN": "hf_x", "HOME": directory}
            command = [FAB, "-r", str(REPO), "-H", "127.0.0.1:9", "train", *case.args]
            started = time.monotonic()
            process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            _, status, usage = os.wait4(process.pid, 0)
            wall = time.monotonic() - started
            process.stderr.close()
            rows.append(
                (case.name, os.waitstatus_to_exitcode(status), wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
            )
    for name, code, wall, cpu, rss in rows:
        print(f"{name:32} exit {code}  wall {wall:5.2f} s  cpu {cpu:5.2f} s  rss {rss / 1024:6.1f} MB")
    walls = [r[2] for r in rows]
    print(
        f"\n{len(rows)} bad inputs, all exit 2: {all(r[1] == 2 for r in rows)}; wall median {statistics.median(walls):.2f} s, "
        f"max {max(walls):.2f} s; peak RSS max {max(r[4] for r in rows) / 1024:.0f} MB"
    )


if __name__ == "__main__":
    main()
