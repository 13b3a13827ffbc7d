"""Crash points: the places in the VM-side code where a durable file is written, renamed or removed,
named so that a test can kill the process exactly there (SIGKILL: nothing after it runs, nothing is
flushed), as SQLite's crash tests stop at every write and FoundationDB's BUGGIFY turns faults on in
tests only.

`point(NAME)` is inert unless the environment names it: TPU_RL_CRASH_AT=NAME kills the process at its
first hit, NAME@N at its Nth (having written NAME to the file TPU_RL_CRASH_NOTE names, if any: a test
then knows the kill happened). Off, it costs one comparison. A child process inherits the variable, so
a point in the runner fires in the runner that the driver starts. POINTS lists every point, and
tests/unit/test_crash_points.py fails on a durable write in a VM-side module with no point after it.

Standard library only: it runs on the VM and in a gke pod.
"""

from __future__ import annotations

import os
import signal

ENV = "TPU_RL_CRASH_AT"
NOTE_ENV = "TPU_RL_CRASH_NOTE"
POINTS = (
    # jobrunner.launch, a fresh attempt: the old verdict forgotten (exit code and process first), the
    # old log kept aside, the job's files and its spec written, a dead runner's record removed
    "launch.forgot-exit-code",
    "launch.forgot-process",
    "launch.forgot-result",
    "launch.forgot-done",
    "launch.forgot-runner",
    "launch.kept-old-log",
    "launch.wrote-files",
    "launch.wrote-spec",
    "launch.removed-dead-runner",
    # jobrunner._Job.run: the runner's record, each step's process and exit code, the verdict
    "run.recorded-runner",
    "run.forgot-step-exit-code",
    "run.started-process",
    "run.recorded-process",
    "run.process-going",
    "run.step-ended",
    "run.recorded-in-bucket",
    "run.wrote-done",
    "run.wrote-result",
    # jobrunner.restore: a job taken as done from its record in the bucket
    "restore.wrote-spec",
    "restore.wrote-done",
    "restore.wrote-result",
    # jobrunner.record_run: the run later fab commands continue
    "current-run.recorded",
    # driver.revive: a revival counted against the plan's REVIVALS; driver.start: the count forgotten
    "revive.counted",
    "start.forgot-revivals",
    # envcache: an environment kept in the bucket (its manifest last), one restored into place
    "envcache.stored",
    "envcache.removed-old",
    "envcache.moved-into-place",
    "envcache.linked-python",
)
_at, _, _nth = (os.environ.get(ENV) or "").partition("@")
_hits: dict[str, int] = {}


def point(name: str) -> None:
    """Kill this process here if the environment names this point (and this hit)."""
    if not _at or name != _at:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(_nth or 1):
        if note := os.environ.get(NOTE_ENV):
            with open(note, "a") as f:
                f.write(f"{name}\n")
        os.kill(os.getpid(), signal.SIGKILL)
