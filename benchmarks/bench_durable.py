"""What the durable checkpoints cost and what they save, on the real MaxText jobs on CPU.

    .venv/bin/python benchmarks/bench_durable.py [--steps 6]

On the loopback host of the CPU tier (tests/maxtext_cpu), with a checkpoint every step:
1. a run with everything in "/dev/shm" (durable_dir left as work_dir);
2. the same run with durable_dir in the bucket (the Cloud Storage emulator behind tests/gcslayer.py):
   MaxText writes the converted model and each checkpoint there itself;
3. a run in the bucket with a checkpoint every 2 steps, the VM lost at a random point (just after
   train logs step 3, between two checkpoints), then `fab train --recover` on a "new VM".
Prints the training step time of 1 and 2 and their ratio (each step saves a checkpoint), Orbax's own
time for one checkpoint (the whole save, and the part that holds training up), the convert
job's time (what a new VM without the bucket would redo, after downloading 32 GB) against the
restore of the last checkpoint, and the steps the loss made train redo. The emulator is in memory,
on the same machine: the bucket's speed is not measured here (a real bucket is slower to write).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_fab import timed  # noqa: E402  (this folder is on sys.path when run as a script)

from bootstrap.demo import MAKE_INPUTS  # noqa: E402
from tests import computestub, gcsemulator, gcslayer  # noqa: E402
from tests.loopback import Fab, loopback_host, wait_for  # noqa: E402
from tests.maxtext_cpu.conftest import HOST_ENV, VENV, cpu_fab_at, overrides  # noqa: E402
from tests.stack import INSTANCE, Stack, lose, wipe  # noqa: E402

ABSL_TIME = re.compile(r"^[IWEF]\d{4} (\d\d:\d\d:\d\d\.\d+) .*Train step (\d+) training loss", re.M)
CONVERT_MINUTES = re.compile(r"Overall Elapse: ([\d.]+) min")
SAVED = re.compile(r"Finished save \(blocking \+ background\) in ([\d.]+) seconds")
BLOCKING = re.compile(r"'checkpoint_manager_blocking_duration_secs': ([\d.]+)")
RESTORED = re.compile(r"Restored params from step: (\d+) in ([\d.]+) seconds")


def step_seconds(log: str) -> list[float]:
    """The time between consecutive training steps (the first step's compile left out)."""
    times = [datetime.strptime(t, "%H:%M:%S.%f") for t, _ in ABSL_TIME.findall(log)]
    return [(b - a).total_seconds() for a, b in zip(times[1:], times[2:], strict=False)]


def saves(log: str) -> tuple[float, float]:
    """Orbax's own timings of train's checkpoints (medians): a whole save, and the part that held training up."""
    whole = [float(t) for t in SAVED.findall(log)]
    blocking = [float(t) for t in BLOCKING.findall(log)]
    return statistics.median(whole), statistics.median(blocking)


def convert_seconds(fab: Fab, durable: str) -> float:
    for log in (fab.tmp / "state" / "shared").glob("convert-*/log"):
        text = log.read_text(errors="replace")
        if f"Checkpoint saved to {durable}" in text:
            return float(CONVERT_MINUTES.findall(text)[-1]) * 60
    raise LookupError(f"no convert log for {durable}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    options = parser.parse_args()
    steps = options.steps
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with (
            gcsemulator.emulator(tmp / "emulator.log") as emulator,
            gcslayer.layer(emulator) as url,
            loopback_host(tmp / "sshd", HOST_ENV | gcsemulator.client_env(url)) as host,
            cpu_fab_at(host, tmp / "fab") as fab,
        ):
            compute, server = computestub.serve()
            compute.host_keys[INSTANCE] = [tuple(host.host_key.read_text().split()[:2])]
            stack = Stack(fab, compute)
            timed(stack, "setup")
            inputs = fab.tmp / "inputs"
            subprocess.run([VENV / "bin" / "python", MAKE_INPUTS, inputs], check=True, capture_output=True)
            base = [word for o in overrides(inputs, steps) for word in ("--arg", o)]
            local_dir = f"{fab.tmp}/shm/local"
            bucket = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}"
            os.environ["STORAGE_EMULATOR_HOST"] = url  # where fab, on this side, reads the bucket

            timed(stack, "train", *base, "--arg", f"vars.durable_dir={local_dir}", "--run-name", "local")
            local_log = (fab.job_dir("local", "train") / "log").read_text(errors="replace")
            local_steps, local_saves = step_seconds(local_log), saves(local_log)
            local_convert = convert_seconds(fab, local_dir)

            timed(stack, "train", *base, "--arg", f"vars.durable_dir={bucket}/a", "--run-name", "bucket")
            bucket_log = (fab.job_dir("bucket", "train") / "log").read_text(errors="replace")
            bucket_steps, bucket_saves = step_seconds(bucket_log), saves(bucket_log)
            bucket_convert = convert_seconds(fab, f"{bucket}/a")

            lossy = [*base, "--arg", f"vars.durable_dir={bucket}/b", "--arg", "train.checkpoint_period=2"]
            timed(stack, "train", *lossy, "--run-name", "lost", "--detach")
            log = fab.job_dir("lost", "train") / "log"
            wait_for(lambda: "Train step 3 " in (log.read_text(errors="replace") if log.exists() else ""), 1800)
            lost_at = max(int(n) for _, n in ABSL_TIME.findall(log.read_text(errors="replace")))
            lose(fab)
            wipe(fab)
            del compute.instances[INSTANCE]
            stack.unreachable("1001")
            stack.after_up("2002")
            recovered = timed(stack, "train", *lossy, "--recover")
            again = (fab.job_dir("lost", "train") / "log").read_text(errors="replace")
            restored_step, restore_seconds = RESTORED.findall(again)[-1]
            server.shutdown()
    local, bucket = statistics.median(local_steps), statistics.median(bucket_steps)
    rows = [
        ("training step, a checkpoint every step, /dev/shm", f"{local:.2f} s (median)"),
        ("  each step", " ".join(f"{t:.1f}" for t in local_steps)),
        ("the same, the checkpoints in the bucket", f"{bucket:.2f} s"),
        ("  each step", " ".join(f"{t:.1f}" for t in bucket_steps)),
        ("  ratio", f"{bucket / local:.2f}"),
        (
            "one checkpoint saved, /dev/shm: whole, holding up training",
            f"{local_saves[0]:.2f} s, {local_saves[1]:.2f} s",
        ),
        ("the same, in the bucket", f"{bucket_saves[0]:.2f} s, {bucket_saves[1]:.2f} s"),
        (
            "convert (a new VM without the bucket redoes it)",
            f"{local_convert:.1f} s, {bucket_convert:.1f} s to the bucket",
        ),
        ("restore of the last checkpoint on the new VM", f"{float(restore_seconds):.1f} s (step {restored_step})"),
        (f"lost after step {lost_at} of {steps}, a checkpoint every 2", f"{lost_at - int(restored_step)} steps redone"),
        ("fab train --recover, to the end of the pipeline", f"{recovered:.1f} s"),
    ]
    for what, result in rows:
        print(f"{what:52} {result}")


if __name__ == "__main__":
    main()
