"""A trainer's starts and its evals, recorded where its checkpoints are as they happen: durable by construction.

A trainer's TensorBoard writer buffers in its process, and a VM that disappears flushes nothing, so a
lost attempt may leave no event file in the bucket at all. Counting starts from event files then
under-counts exactly when a loss happened. Instead, the job's launcher (maxtext_run.py) writes one
small record per start into the folder its environment names, beside the checkpoints (in the bucket
when they are there): when it began, on which host, and the last committed checkpoint step it resumes
from. `fab metrics` counts the attempts and the steps each trained from these records; the event
files still give the curves and the step times.

The same launcher records each GSM8K eval the trainer logs, one record an eval, in the folder
EVALS_ENV names (eval_recorder.py): the base model's before the first attempt trains, the final one
after the last. A restarted attempt's log is moved aside and a lost VM's is gone, so the publish gate
and the model card judge the run from these records (hub_upload.py), never from the current attempt's log.

Standard library only: it runs on the VM and in a gke pod, with the job's own python.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time

try:
    from . import evals, faults, gcs, jobrunner  # on the laptop: bootstrap.remote
except ImportError:
    import evals  # on the VM and in a pod: beside this script in the tools folder
    import faults
    import gcs
    import jobrunner

DIR_ENV = "TPU_RL_ATTEMPTS_DIR"  # where the records of the starts go (the job's YAML sets it)
CHECKPOINTS_ENV = "TPU_RL_CHECKPOINT_DIR"  # whose last committed step a start resumes from
EVALS_ENV = "TPU_RL_EVALS_DIR"  # where the records of the evals go


def record(folder: str, data: dict) -> str:
    """Write one record into `folder` (in the bucket, or on disk), named unique and in the order they were made;
    its path."""
    host = os.uname().nodename
    path = f"{folder}/{time.time_ns()}-{host}.json"
    if gcs.is_gcs(path):
        gcs.write(path, json.dumps(data).encode())
        faults.point("attempts.recorded-in-bucket")
    else:
        os.makedirs(os.path.expanduser(folder), exist_ok=True)
        jobrunner.write_json(os.path.expanduser(path), data)
        faults.point("attempts.recorded-on-disk")
    return path


def record_start(environ: dict[str, str]) -> str | None:
    """Write this start's record (before any training) and return where; None when the job asks for none.
    A record that cannot be written is said on stderr and never stops the job: it is accounting."""
    folder = environ.get(DIR_ENV, "").rstrip("/")
    if not folder:
        return None
    try:
        steps = (
            jobrunner.finished_steps(os.path.expanduser(environ[CHECKPOINTS_ENV]))
            if environ.get(CHECKPOINTS_ENV)
            else []
        )
        return record(
            folder, {"started": time.time(), "host": os.uname().nodename, "resumed_from": steps[-1] if steps else 0}
        )
    except Exception as err:  # noqa: BLE001 - a storage error of any kind must not stop the training
        print(f"[tpu-rl] could not record this start in {folder}: {err}", file=sys.stderr)
        return None


def recorded_evals(texts: list[str], total_steps: int | None) -> list[dict]:
    """The run's evals from their records' texts, as the eval table shows them: a later record of the same eval
    (an attempt that evaluated that step again) in place of an earlier one; a half-written record left out."""
    found = []
    for text in texts:
        try:
            item = json.loads(text)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("recorded"), (int, float)) and evals.valid(item):
            found.append(item)
    collected: list[dict] = []
    for item in sorted(found, key=lambda e: e["recorded"]):
        collected = evals.collect(collected, {k: v for k, v in item.items() if k != "recorded"})
    return evals.final(evals.merged([], collected), total_steps)


def read_records(folder: str) -> list[str]:
    """The texts of the records in `folder` (in the bucket, or on disk); none when it holds none."""
    if gcs.is_gcs(folder):
        return [(gcs.read(name) or b"").decode(errors="replace") for name in gcs.names(f"{folder.rstrip('/')}/")]
    folder = os.path.expanduser(folder)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".json")) if os.path.isdir(folder) else []
    texts = []
    for name in names:
        with open(os.path.join(folder, name), errors="replace") as f:
            texts.append(f.read())
    return texts


def record_names(folder: str) -> list[str]:
    """The names of the records in `folder` (in the bucket, or on disk), without their folder."""
    if gcs.is_gcs(folder):
        return [name.rsplit("/", 1)[-1] for name in gcs.names(f"{folder.rstrip('/')}/")]
    folder = os.path.expanduser(folder)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def run_identity(names: list[str]) -> str | None:
    """The run's identity in the trackers (its W&B run id, its MLflow run's tag), from the name of its first start's
    record (when and on which host it began, to the nanosecond): no other run has it, another stack's or user's of
    the same name included, and a run resumed on a new VM keeps it (the records are beside the checkpoints, in the
    bucket with results.gcs). None before train first started."""
    starts = sorted(name for name in names if name.endswith(".json"))
    return hashlib.sha256(starts[0].encode()).hexdigest()[:16] if starts else None


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
