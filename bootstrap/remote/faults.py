"""Crash points: the places in the VM-side code where a durable file is written, renamed or removed,
named so that a test can kill the process exactly there (SIGKILL: nothing after it runs, nothing is
flushed), as SQLite's crash tests stop at every write and FoundationDB's BUGGIFY turns faults on in
tests only.

`point(NAME)` is inert unless the environment names it: TPU_RL_CRASH_AT=NAME kills the process at its
first hit, NAME@N at its Nth (having written NAME to the file TPU_RL_CRASH_NOTE names, if any: a test
then knows the kill happened). With TPU_RL_CRASH_ONCE=1 as well, the hits are counted across the whole
process tree (in NOTE.hits) and only the process that creates the note kills itself: a fault campaign
makes one kill per tree, whose children inherit the variables (a relaunched runner would otherwise die at
the same point again), and NAME@3 is the third runner's hit, not every runner's third. Off, it costs one comparison. A child process inherits the variable, so
a point in the runner fires in the runner that the driver starts. POINTS lists every point, and
tests/unit/test_crash_points.py fails on a durable write in a VM-side module with no point after it.

Standard library only: it runs on the VM and in a gke pod.
"""

from __future__ import annotations

import os
import signal

ENV = "TPU_RL_CRASH_AT"
NOTE_ENV = "TPU_RL_CRASH_NOTE"
ONCE_ENV = "TPU_RL_CRASH_ONCE"
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
    "revive.notified",
    "start.forgot-revivals",
    # hub_upload.hold: the marker of a model results.publish_if kept off the Hub
    "hub-upload.held",
    # envcache: an environment kept in the bucket (its manifest last), one restored into place
    "envcache.stored",
    "envcache.removed-old",
    "envcache.moved-into-place",
    "envcache.linked-python",
    # driver.start: the plan written (and kept as the run's), the last pass's events kept aside (the current
    # run: record_run)
    "driver.wrote-plan",
    "driver.kept-run-plan",
    "driver.rotated-events",
    # driver.start: the starting command's environment, which a revived driver runs its jobs in
    "driver.kept-environment",
    # driver.Driver.save: driver.json (the pipeline's state), saved at each change
    "driver.saved",
    # driver.Driver.autostop: about to run the shutdown command, and its outcome recorded
    "autostop.shutting-down",
    "autostop.recorded-shutdown",
    # gcs_upload.py: the objects copied (not yet verified), the marker written after the verification
    "gcs-upload.copied",
    "gcs-upload.wrote-marker",
    # hub_upload.py: the card written, each file committed to the Hub, the marker after the verification
    "hub-upload.wrote-card",
    "hub-upload.uploaded",
    "hub-upload.wrote-marker",
    # attempts.record_start: a trainer's start recorded, in the bucket or on disk
    "attempts.recorded-in-bucket",
    "attempts.recorded-on-disk",
    # manifest.write: the export's SHA256SUMS in place
    "manifest.wrote",
    # export_config.py: the base model's generation config copied, config.json's token ids aligned
    "export-config.copied-generation-config",
    "export-config.wrote-config",
    # maxtext_check.py: the validator's marker (every job accepted)
    "validate.wrote-marker",
    # gcs.copy_down: a copied file in place, a file whose object is gone removed
    "copy-down.copied",
    "copy-down.removed",
)
_at, _, _nth = (os.environ.get(ENV) or "").partition("@")
_hits: dict[str, int] = {}
os.register_at_fork(after_in_child=_hits.clear)  # a forked process counts its own hits, as a new one does


def point(name: str) -> None:
    """Kill this process here if the environment names this point (and this hit)."""
    if not _at or name != _at:
        return
    note, once = os.environ.get(NOTE_ENV), os.environ.get(ONCE_ENV)
    _hits[name] = _shared_hit(note) if note and once else _hits.get(name, 0) + 1
    if _hits[name] == int(_nth or 1):
        if note:
            if once:
                try:  # the first process to get here claims the one kill
                    os.close(os.open(note, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                except FileExistsError:
                    return
            with open(note, "a") as f:
                f.write(f"{name}\n")
        os.kill(os.getpid(), signal.SIGKILL)


def _shared_hit(note: str) -> int:
    """This hit's number in the whole process tree: one byte appended per hit, the file's size after ours."""
    fd = os.open(f"{note}.hits", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, b"x")
        return os.lseek(fd, 0, os.SEEK_CUR)
    finally:
        os.close(fd)
