"""A preemption recorded where the run's durable state is, and told to the receivers, before the VM goes.

    python3 -E -s preempted.py STATE_DIR     # run by the VM's shutdown script (bootstrap/shutdown.sh), as its user

Compute Engine deletes a Spot VM when it preempts it, and first runs its shutdown script for about 30 s. Each
pipeline that was running then writes one record beside its run's start records (in the bucket with results.gcs:
it outlives the VM), with the last committed checkpoint step, and tells results.notify's receivers. `fab metrics`
and `fab runs` count the records (what each preemption cost); the shutdown script finds each pipeline on the VM
through the registry its driver writes at every start (`register`). Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time

try:
    from . import attempts, gcs, jobrunner, notify  # on the laptop: bootstrap.remote.preempted
except ImportError:
    import attempts  # on the VM: beside this script in the tools folder
    import gcs
    import jobrunner
    import notify

REGISTRY = "~/.config/tpu-rl/state-dirs"  # one absolute state folder a line (bootstrap/shutdown.sh reads it)
FOLDER = "preemptions"  # beside the run's start records (attempts.DIR_ENV)


def register(layout: jobrunner.Layout) -> None:
    """Name this state folder in the user's registry, once: the shutdown script runs `main` for each."""
    path, root = os.path.expanduser(REGISTRY), os.path.abspath(os.path.expanduser(layout.root))
    try:
        with open(path) as f:
            if root in f.read().splitlines():
                return
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "a") as f:
        f.write(f"{root}\n")


def folder_of(train_env: dict[str, str]) -> str | None:
    """Where a run's preemption records go: beside its start records; None for a train that keeps none."""
    starts = train_env.get(attempts.DIR_ENV, "").rstrip("/")
    return f"{starts.rsplit('/', 1)[0]}/{FOLDER}" if "/" in starts else None


def record(layout: jobrunner.Layout) -> dict | None:
    """Record the preemption of the pipeline this state folder runs; None when none was running."""
    driver = jobrunner.read_json(os.path.join(layout.pipeline, "driver.json")) or {}
    plan = jobrunner.read_json(os.path.join(layout.pipeline, "plan.json")) or {}
    if driver.get("state") != "running" or not plan:
        return None
    train = next((job for job in plan.get("jobs", []) if job["spec"].get("env", {}).get(attempts.DIR_ENV)), None)
    env = train["spec"]["env"] if train else {}
    found = {"run": plan.get("run", "?"), "at": time.time(), "host": os.uname().nodename}
    found["running"] = list(driver.get("running") or [])
    with gcs.quick():  # within the seconds a preempted VM has
        steps = (
            jobrunner.finished_steps(os.path.expanduser(env[attempts.CHECKPOINTS_ENV]))
            if env.get(attempts.CHECKPOINTS_ENV)
            else []
        )
        found["committed_step"] = steps[-1] if steps else None
        if folder := folder_of(env):
            found["record"] = attempts.record(folder, found)
    return found


def main(state_dir: str) -> int:
    layout = jobrunner.Layout(os.path.expanduser(state_dir))
    try:
        found = record(layout)
    except Exception as err:  # noqa: BLE001 - the receivers are told all the same
        print(f"[tpu-rl] could not record the preemption: {err}", file=sys.stderr)
        found = {"at": time.time()}
    if found is not None:
        notify.notify(layout, {"kind": "preempted", **found})
        print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
