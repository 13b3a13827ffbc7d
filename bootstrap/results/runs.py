"""The local record of runs: which run is current, what ran, how long, what it scored."""

from __future__ import annotations

import fcntl
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..errors import UserError
from ..paths import runs_dir

CURRENT = "current"
_UMASK = os.umask(0o22)  # read once, at import (setting it is process-wide), and put back at once
os.umask(_UMASK)


def new_run_name() -> str:
    """MaxText's run name, as the reference makes it: $(date +%Y-%m-%d-%H-%M-%S)."""
    return datetime.now(UTC).strftime("%Y-%m-%d-%H-%M-%S")


def minutes(state: dict) -> float | None:
    """How long a job ran, from its state's start and finish times."""
    if state.get("started") and state.get("finished"):
        return round((state["finished"] - state["started"]) / 60, 2)
    return None


def current_run() -> str | None:
    path = runs_dir() / CURRENT
    return path.read_text().strip() if path.exists() else None


FIELDS = ("name", "jobs", "evals", "results", "machine", "settings", "chips", "timing", "estimate")


@dataclass
class RunRecord:
    name: str
    jobs: dict[str, dict] = field(default_factory=dict)  # job -> state, started, finished, ...
    evals: list[dict] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)  # durable copies of the export
    machine: str = ""  # the VM (host and state folder) the run was last handed to (vm.machine.Vm.identity)
    settings: list[str] | None = None  # the --arg overrides it was last run with (None: not yet run here)
    chips: int = 0  # the VM's TPU chips, billed while it runs
    timing: dict | None = None  # where train's time went (results/timing.py), its work and shape (estimate.py)
    estimate: dict | None = None  # what fab estimated when the run started (results/estimate.py)

    @property
    def folder(self) -> Path:
        return runs_dir() / self.name

    def note_job(self, name: str, status, job_dir: str = "", ran: bool = True) -> None:
        """Keep a job's final state (a machine.JobStatus) for fab metrics' summary and the next estimate
        (`ran`: False for a job done already, whose times are an earlier run's)."""
        self.jobs[name] = {
            "job_dir": job_dir,
            "ran": ran,
            "state": status.state.value,
            "started": status.started,
            "finished": status.finished,
            "exit_code": status.exit_code,
            "outputs": status.outputs,
            "error": status.error,
        }

    @classmethod
    def load(cls, name: str) -> RunRecord:
        """The run's record; a new one if there is none. A record that cannot be read, or whose figures make no
        sense (a start time as text, an infinite time, an end before its start), is refused in one line naming
        its file (DamagedRecord): no figure of it is added, compared or scaled."""
        path = runs_dir() / name / "record.json"
        if not path.exists():
            return cls(name)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise DamagedRecord(f"{path}: cannot be read ({type(err).__name__}: {str(err)[:120]})") from None
        if why := damage(data):
            raise DamagedRecord(f"{path}: {why}")
        return cls(**{key: data[key] for key in FIELDS if key in data})

    def save(self) -> None:
        """Merged into what is on disk, under a lock: two fabs watching one pipeline save it at once, and
        neither loses what the other noted."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "record.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            disk = RunRecord.load(self.name)
            self.jobs = {**disk.jobs, **self.jobs}
            self.results = {**disk.results, **self.results}
            self.evals = self.evals or disk.evals
            self.machine, self.chips = self.machine or disk.machine, self.chips or disk.chips
            self.timing, self.estimate = self.timing or disk.timing, self.estimate or disk.estimate
            self.settings = self.settings if self.settings is not None else disk.settings
            data = {key: getattr(self, key) for key in FIELDS}
            _replace(self.folder / "record.json", json.dumps(data, indent=1))
            _replace(runs_dir() / CURRENT, self.name + "\n")


def _replace(path: Path, text: str) -> None:
    """Write whole or not at all, under a temporary name of this writer's own, with the mode a plain write gives."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class DamagedRecord(UserError):
    """A run's record.json that cannot be trusted: one line naming the file and what is wrong."""


def _seconds(value) -> bool:
    """A time or a duration as the records keep it: a finite number (never text, a bool or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def damage(data) -> str | None:
    """What makes a record's data unusable, or None: the types its readers rely on and times that make sense."""
    if not isinstance(data, dict) or not isinstance(data.get("name", ""), str):
        return f"not a run record (a {type(data).__name__})"
    kinds = {"jobs": dict, "evals": list, "results": dict, "machine": str, "chips": int, "timing": (dict, type(None)),
             "estimate": (dict, type(None)), "settings": (list, type(None))}  # fmt: skip
    for key, kind in kinds.items():
        if key in data and not isinstance(data[key], kind):
            return f"{key} is a {type(data[key]).__name__}"
    for job, state in data.get("jobs", {}).items():
        if not isinstance(state, dict):
            return f"jobs.{job} is a {type(state).__name__}"
        times = {k: state.get(k) for k in ("started", "finished") if state.get(k) is not None}
        if bad := next((k for k, v in times.items() if not _seconds(v)), None):
            return f"jobs.{job}.{bad} is not a time: {str(times[bad])[:40]!r}"
        if len(times) == 2 and times["finished"] < times["started"]:
            return f"jobs.{job} finished before it started"
    for key in ("startup_s", "step_s", "steps", "eval_s", "evals") if data.get("timing") else ():
        value = data["timing"].get(key)
        if not (_seconds(value) and value >= 0):
            return f"timing.{key} is not a duration: {str(value)[:40]!r}"
    estimate = data.get("estimate") or {}
    if any(k in estimate and not _seconds(estimate[k]) for k in ("low_s", "high_s")):
        return "estimate.low_s or high_s is not a duration"
    return None


def all_records(damaged: list[str] | None = None) -> list[RunRecord]:
    """Every run this machine has a record of, oldest first; a damaged one is left out, its line added to
    `damaged` (or raised, without that list)."""
    found = []
    for name in sorted(p.parent.name for p in runs_dir().glob("*/record.json")):
        try:
            found.append(RunRecord.load(name))
        except DamagedRecord as err:
            if damaged is None:
                raise
            damaged.append(str(err))
    return sorted(found, key=lambda r: (_started(r) or 0, r.name))


def _started(record: RunRecord) -> float | None:
    return min((j["started"] for j in record.jobs.values() if j.get("started")), default=None)
