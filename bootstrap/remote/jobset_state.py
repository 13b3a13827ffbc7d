"""What a JobSet means for its job, from the JobSet and the bucket: one rule for fab and for the cluster's driver.

Standard library only: gke_driver.py runs it in the cluster, cluster.py on this machine,
each with its own clients (`Api`, `Bucket`: the official ones here, the JSON APIs
through gcs.py and urllib there). A job is done only when its JobSet completed and every declared
output exists, and, for a job that names inputs (the Hub upload: the export's
SHA256SUMS), only while they are what they were when its JobSet was created.
"""

from __future__ import annotations

import calendar
import copy
import hashlib
import re
import time
from collections.abc import Mapping
from typing import Protocol

try:
    from . import gcs  # on this machine: bootstrap.remote.jobset_state
    from .jobrunner import JobState, finished_steps
except ImportError:
    import gcs  # in the cluster: beside this file in the tools folder
    from jobrunner import JobState, finished_steps

OUTPUTS_ANNOTATION = "tpu-rl/outputs"  # what must exist in Cloud Storage for the job to count as done
INPUTS_ANNOTATION = "tpu-rl/inputs"  # what the job is made from: it is stale when they change
INPUT_DIGESTS_ANNOTATION = "tpu-rl/input-digests"  # their digests when the JobSet was created
DELETE_SECONDS = 300  # how long an ended JobSet may take to go (its pods end first)
# ${latest_step:gs://...} as it stands in a JobSet's command: its $ escaped against the kubelet's expansion
LATEST_STEP = re.compile(r"\$\$\{latest_step:(gs://[^{}]+)\}")


class Bucket(Protocol):
    """The reads the rule needs, by gs:// URL."""

    def names(self, prefix: str) -> list[str]:
        """Every object below a gs:// prefix, as gs:// URLs."""

    def read_text(self, url: str) -> str | None:
        """A small object's text, or None if there is none."""


class Api(Protocol):
    """The JobSets of the namespace, by name."""

    def get(self, name: str) -> dict | None:
        """The JobSet, or None if there is none."""

    def create(self, jobset: dict) -> None:
        """Create it; one of that name created meanwhile (by another driver) is left as it is."""

    def delete(self, name: str, uid: str) -> None:
        """Delete that JobSet (its child Jobs and pods first), only if it is still the one with `uid`; one
        already gone, or replaced meanwhile, is fine."""


class NoCheckpoint(LookupError):
    """A job names ${latest_step:...} of a folder with no steps yet (its train is not done)."""


class NotDeleted(RuntimeError):
    """An ended JobSet was still there long after it was deleted (a stuck finalizer)."""


def state(jobset: Mapping | None, bucket: Bucket) -> dict:
    """The job's state as jobrunner.job_state writes it, from its JobSet (None: never created)."""
    if jobset is None:
        return {"state": JobState.PENDING.value}
    key = jobset["metadata"]["name"]
    started = timestamp(jobset["metadata"].get("creationTimestamp"))
    ended = verdict(jobset)
    if ended is None:
        return {"state": JobState.RUNNING.value, "log": key, "started": started}
    condition, finished = ended
    found = {"log": key, "started": started, "finished": finished}
    if condition["type"] == "Failed":
        return {**found, "state": JobState.FAILED.value, "error": condition.get("message")}
    annotations = jobset["metadata"].get("annotations") or {}
    outputs = annotations.get(OUTPUTS_ANNOTATION, "").split()
    missing = [pattern for pattern in outputs if not gcs.matches(pattern, bucket.names)]
    job_state, error = (
        (JobState.FAILED, f"it completed without {', '.join(missing)}") if missing else (JobState.DONE, None)
    )
    inputs = annotations.get(INPUTS_ANNOTATION)
    if job_state is JobState.DONE and inputs and digests(inputs, bucket) != annotations.get(INPUT_DIGESTS_ANNOTATION):
        job_state, error = JobState.STALE, f"{inputs} changed"
    return {**found, "state": job_state.value, "error": error, "outputs": outputs, "missing": missing}


def verdict(jobset: Mapping) -> tuple[dict, float | None] | None:
    """The JobSet's final condition (Completed or Failed) and when it came, or None while it runs."""
    for condition in (jobset.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Completed", "Failed") and condition.get("status") == "True":
            return condition, timestamp(condition.get("lastTransitionTime"))
    return None


def launch(manifest: Mapping, api: Api, bucket: Bucket, timeout: float = DELETE_SECONDS) -> None:
    """Bring the job's JobSet to running: one that runs is left alone, one that ended (failed, or done for
    what has changed since) is deleted first, so that its retry is a new JobSet of the same name."""
    name = manifest["metadata"]["name"]
    current = api.get(name)
    if current is not None:
        if verdict(current) is None:
            return
        uid = current["metadata"]["uid"]
        api.delete(name, uid)  # only that one: never a retry another driver created meanwhile
        deadline = time.monotonic() + timeout
        while (current := api.get(name)) is not None and current["metadata"]["uid"] == uid:
            if time.monotonic() > deadline:
                raise NotDeleted(f"the old JobSet {name} was not deleted within {timeout:.0f} s")
            time.sleep(1)
        if current is not None:  # another driver's retry: adopt it
            return
    api.create(to_create(manifest, bucket))


def to_create(manifest: Mapping, bucket: Bucket) -> dict:
    """The JobSet as it is created now: ${latest_step:gs://...} in a command resolved to the highest committed
    step there (as on the VM), and the digests of its inputs recorded (what `state` compares them with)."""

    def latest(match: re.Match) -> str:
        steps = finished_steps(match[1], bucket.names)  # committed ones only, as on the VM
        if not steps:
            raise NoCheckpoint(f"no committed checkpoint step in {match[1]}: is train done?")
        return str(steps[-1])

    created = copy.deepcopy(dict(manifest))
    for job in created["spec"]["replicatedJobs"]:
        for container in job["template"]["spec"]["template"]["spec"]["containers"]:
            container["command"] = [LATEST_STEP.sub(latest, word) for word in container.get("command", [])]
    annotations = created["metadata"]["annotations"]
    if INPUTS_ANNOTATION in annotations:
        annotations[INPUT_DIGESTS_ANNOTATION] = digests(annotations[INPUTS_ANNOTATION], bucket)
    return created


def digests(inputs: str, bucket: Bucket) -> str:
    """What the job was made from, as it is now: the SHA-256 of each input object (small: a SHA256SUMS)."""
    return " ".join(hashlib.sha256((bucket.read_text(url) or "").encode()).hexdigest()[:16] for url in inputs.split())


def timestamp(stamp: str | None) -> float | None:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) if stamp else None
