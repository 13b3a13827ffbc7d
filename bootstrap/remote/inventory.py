"""What the VM and its bucket hold of each run, read on the VM for `fab runs` (driver.py's `runs`).

Standard library only, beside driver.py in the tools folder. The VM side spells no path of its
own: the state folder's are Layout's, and everything else comes from fab as places, each a glob
in which PLACEHOLDER stands for a run's name (rendered by fab from the plan for that placeholder:
the jobs' YAML, Layout and publish.py own them). A place in the bucket is read with the VM's service
account, each bucket prefix listed once, and the laptop needs no credentials.
"""

from __future__ import annotations

import glob
import json
import os
import re

try:
    from . import attempts, evals, folders, gcs, jobrunner  # on the laptop: bootstrap.remote
except ImportError:
    import attempts  # on the VM: beside this script in the tools folder
    import evals
    import folders
    import gcs
    import jobrunner

# The places fab sends (keys of the request's "places"), each a glob with the run's name as the placeholder.
EVALS = "evals"  # the log of the job that evaluates (train's), on the VM
EXPORT = "export"  # the export's SHA256SUMS on the VM
CHECKPOINTS = "checkpoints"  # the folder of the run's checkpoints (its steps in it)
ATTEMPTS = "attempts"  # each start's record (attempts.py)
PREEMPTIONS = "preemptions"  # each preemption's record (preempted.py)
STOP = "stop"  # the record of a health rule's stop (health.py)
RECORDS = "records"  # a job's record of done, beside its outputs in the bucket
COPIES = "copies"  # the SHA256SUMS of each durable copy of the export in the bucket
SPEC_KEYS = ("argv", "env")  # what of a planned job fab compares with what jobs/ renders now


class Listing:
    """The bucket's names below a prefix, each prefix listed once: a longer prefix is read from a shorter one's
    listing (fab's places share their parents)."""

    def __init__(self):
        self.listed: dict[str, list[str]] = {}

    def __call__(self, prefix: str) -> list[str]:
        parent = next((p for p in self.listed if prefix.startswith(p)), None)
        if parent is None:
            parent = prefix
            self.listed[prefix] = gcs.names(prefix)
        return [name for name in self.listed[parent] if name.startswith(prefix)]


def instances(place: str, placeholder: str, listing: Listing) -> dict[str, list[str]]:
    """What a place in the bucket names now, by run: `place` with the placeholder as any one path segment."""
    found = gcs.matches(place.replace(placeholder, "*"), listing)
    head, _, tail = place.partition(placeholder)
    run_of = re.compile(re.escape(head) + r"([^/]+)" + re.escape(tail).replace(r"\*", "[^/]*"))
    runs: dict[str, list[str]] = {}
    for name in found:
        if (match := run_of.fullmatch(name)) and not glob.has_magic(match[1]):
            runs.setdefault(match[1], []).append(name)
    return runs


def _json(data: bytes | None) -> dict | None:
    try:
        found = json.loads(data) if data else None
    except ValueError:
        return None  # half a record
    return found if isinstance(found, dict) else None


def _read(path: str) -> bytes | None:
    if gcs.is_gcs(path):
        return gcs.read(path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def on_vm(layout: jobrunner.Layout, run: str, places: dict, placeholder: str) -> dict:
    """A run's jobs in the state folder (its own folder's: a shared job was another run's cost too), what it
    was planned with, its evals, its durable copies' markers and whether its export is still here."""
    plan = jobrunner.read_json(layout.run_plan(run)) or {}
    folder = os.path.expanduser(f"{layout.runs}/{run}")
    names = sorted(n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n)))
    jobs = {}
    for name in names:
        try:  # a job done in the bucket is looked at there (its outputs)
            state = jobrunner.job_state(os.path.join(folder, name))
        except OSError as err:
            state = {"state": "unknown", "error": str(err)[:200]}
        jobs[name] = {key: state.get(key) for key in ("state", "started", "finished")}
    kept = {}
    for marker in plan.get("kept_by", []):
        found = jobrunner.read_json(os.path.expanduser(marker))
        if found:
            kept[os.path.basename(os.path.dirname(marker))] = found
    log = places.get(EVALS, "").replace(placeholder, run)
    export = places.get(EXPORT, "").replace(placeholder, run)
    stop = places.get(STOP, "").replace(placeholder, run)
    return {
        "stop": _json(_read(os.path.expanduser(stop))) if stop and not gcs.is_gcs(stop) else None,
        "jobs": jobs,
        "settings": plan.get("settings"),
        "chips": plan.get("chips"),
        "specs": {job["name"]: {key: job["spec"].get(key) for key in SPEC_KEYS} for job in plan.get("jobs", [])},
        "evals": evals.from_log(os.path.expanduser(log), None) if log else [],
        "markers": kept,
        "export": _trusted_export(os.path.expanduser(export), jobs.get("export")) if export else None,
    }


def _trusted_export(sums: str, job: dict | None) -> str | None:
    """The export's folder, if it is still there and still the export job's: the job done with its seals intact
    (jobrunner.job_state), in a folder no other account can write (folders.py)."""
    folder = os.path.dirname(sums)
    if not os.path.isfile(sums) or (job or {}).get("state") != jobrunner.JobState.DONE.value:
        return None
    return folder if folders.problem(folder) is None else None


def in_bucket(places: dict, placeholder: str) -> dict[str, dict]:
    """By run: the committed checkpoint steps, the trainer's starts, its preemptions, the jobs recorded done and the
    export's copies that the places name in the bucket (the shortest prefix listed first: the others are read from it)."""
    listing, found = Listing(), {}

    def note(run: str, key: str, value) -> None:
        found.setdefault(run, {"steps": [], "attempts": [], "preemptions": [], "records": {}, "copies": []})[key] = (
            value
        )

    pairs = [(key, place) for key in (CHECKPOINTS, ATTEMPTS, PREEMPTIONS, STOP, COPIES) if (place := places.get(key))]
    pairs += [(RECORDS, place) for place in places.get(RECORDS) or []]
    in_the_bucket = [(key, place) for key, place in pairs if gcs.is_gcs(place)]  # what is on disk is the VM's
    for key, place in sorted(in_the_bucket, key=lambda pair: len(pair[1].partition(placeholder)[0])):
        for run, names in instances(place, placeholder, listing).items():
            if key == CHECKPOINTS:
                note(run, "steps", jobrunner.finished_steps(place.replace(placeholder, run), listing))
            elif key == ATTEMPTS:
                note(run, "attempts", attempts.parse([(_read(n) or b"").decode(errors="replace") for n in names]))
            elif key == STOP:
                note(run, "stop", _json(_read(names[0])))
            elif key == PREEMPTIONS:
                kept = [{k: r.get(k) for k in ("at", "committed_step")} for n in names if (r := _json(_read(n)))]
                note(run, "preemptions", sorted(kept, key=lambda r: r["at"] or 0))
            elif key == COPIES:
                note(run, "copies", [name.rsplit("/", 1)[0] for name in names])
            else:
                records = found.get(run, {}).get("records", {})
                job = os.path.basename(names[0]).removesuffix(".json")
                note(run, "records", {**records, job: _json(_read(names[0]))})
    return found


def runs(layout: jobrunner.Layout, request: dict) -> dict:
    """Every run the state folder and the bucket know, and the VM's current run; a bucket that cannot be read
    is said, and the VM's own runs are still listed."""
    places, placeholder = request.get("places", {}), request["placeholder"]
    root = os.path.expanduser(layout.runs)
    names = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))) if os.path.isdir(root) else []
    listed: dict[str, dict] = {run: {} for run in names}
    bucket_error = None
    with gcs.quick():  # fab waits for the answer
        try:
            for run, kept in in_bucket(places, placeholder).items():
                listed.setdefault(run, {})["bucket"] = kept
        except OSError as err:
            bucket_error = str(err)[:300] or type(err).__name__
        for run in names:
            try:
                listed[run]["vm"] = on_vm(layout, run, places, placeholder)
            except Exception as err:  # a malformed file of one run never hides the others, nor the bucket's
                listed[run]["vm"] = {"error": f"{type(err).__name__}: {err}"[:300]}
    current = _read(os.path.expanduser(layout.current_run))
    return {"current": current.decode().strip() if current else None, "runs": listed, "bucket_error": bucket_error}
