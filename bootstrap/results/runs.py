"""The local record of runs: which run is current, what ran, how long, what it scored."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

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
        path = runs_dir() / name / "record.json"
        if not path.exists():
            return cls(name)
        data = json.loads(path.read_text())
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


def all_records() -> list[RunRecord]:
    """Every run this machine has a record of, oldest first."""
    names = sorted(p.parent.name for p in runs_dir().glob("*/record.json"))
    return sorted((RunRecord.load(name) for name in names), key=lambda r: (_started(r) or 0, r.name))


def _started(record: RunRecord) -> float | None:
    return min((j["started"] for j in record.jobs.values() if j.get("started")), default=None)
