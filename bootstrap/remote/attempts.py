"""Each start of a trainer, recorded where its checkpoints are before it trains: durable by construction.

A trainer's TensorBoard writer buffers in its process, and a VM that disappears flushes nothing, so a
lost attempt may leave no event file in the bucket at all. Counting starts from event files then
under-counts exactly when a loss happened. Instead, the job's launcher (maxtext_run.py) writes one
small record per start into the folder its environment names, beside the checkpoints (in the bucket
when they are there): when it began, on which host, and the last committed checkpoint step it resumes
from. `fab metrics` counts the attempts and the steps each trained from these records; the event
files still give the curves and the step times.

Standard library only: it runs on the VM and in a gke pod, with the job's own python.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

try:
    from . import faults, gcs, jobrunner  # on the laptop: bootstrap.remote
except ImportError:
    import faults  # on the VM and in a pod: beside this script in the tools folder
    import gcs
    import jobrunner

DIR_ENV = "TPU_RL_ATTEMPTS_DIR"  # where the records go (the job's YAML sets it)
CHECKPOINTS_ENV = "TPU_RL_CHECKPOINT_DIR"  # whose last committed step a start resumes from


def record_start(environ: dict[str, str]) -> str | None:
    """Write this start's record (before any training) and return where; None when the job asks for none.
    A record that cannot be written is said on stderr and never stops the job: it is accounting."""
    folder = environ.get(DIR_ENV, "").rstrip("/")
    if not folder:
        return None
    host = os.uname().nodename
    try:
        steps = (
            jobrunner.finished_steps(os.path.expanduser(environ[CHECKPOINTS_ENV]))
            if environ.get(CHECKPOINTS_ENV)
            else []
        )
        record = {"started": time.time(), "host": host, "resumed_from": steps[-1] if steps else 0}
        path = f"{folder}/{time.time_ns()}-{host}.json"  # unique, and in the order of the starts
        if gcs.is_gcs(path):
            gcs.write(path, json.dumps(record).encode())
            faults.point("attempts.recorded-in-bucket")
        else:
            os.makedirs(os.path.expanduser(folder), exist_ok=True)
            jobrunner.write_json(os.path.expanduser(path), record)
            faults.point("attempts.recorded-on-disk")
        return path
    except Exception as err:  # noqa: BLE001 - a storage error of any kind must not stop the training
        print(f"[tpu-rl] could not record this start in {folder}: {err}", file=sys.stderr)
        return None


def parse(texts: list[str]) -> list[dict]:
    """The records' texts as attempts, oldest first; a record that is not one (half written) is left out."""
    found = []
    for text in texts:
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        started, resumed = record.get("started"), record.get("resumed_from", 0)
        if isinstance(started, (int, float)) and math.isfinite(started) and isinstance(resumed, int):
            found.append({"started": float(started), "host": str(record.get("host", "?")), "resumed_from": resumed})
    return sorted(found, key=lambda attempt: attempt["started"])
