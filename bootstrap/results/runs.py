"""The local record of runs: which run is current, what ran, how long, what it scored."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import UserError
from ..paths import runs_dir

CURRENT = "current"
PROBE_PREFIX = "probe-"  # `fab train --probe`'s runs: never the run later commands carry on
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


FIELDS = (
    "name", "jobs", "evals", "results", "machine", "settings", "chips", "timing", "estimate", "preemptions", "lost_vms",
    "task", "booted", "train_losses",
)  # fmt: skip


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
    preemptions: list[dict] = field(default_factory=list)  # each Spot preemption, with what it cost (fab metrics)
    lost_vms: list[dict] = field(default_factory=list)  # each VM the run lost: its billed span (`lose_vm`)
    task: dict | None = None  # what it learns: the task's name, digest and each file's (jobs/task.py)
    booted: float | None = None  # when its VM booted (None: this machine as the VM): goodput's boot (goodput.boot_of)
    train_losses: dict | None = None  # what fab metrics counted of train's starts and steps again (metrics.loss_cost)

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

    def lose_vm(self, ended: float | None) -> None:
        """The VM the run was on is gone (a recovery recreates it): its billed span is kept, from its first job's start
        to `ended` (when it was preempted, as its shutdown script recorded; else the last time its jobs were seen, a
        lower bound, said as such), and its jobs leave the current VM's time."""
        ran = {name: job for name, job in self.jobs.items() if job.get("ran", True) and not job.get("lost_vm")}
        starts = [job["started"] for job in ran.values() if job.get("started")]
        if not starts:
            return
        seen = max(t for job in ran.values() for t in (job.get("started"), job.get("finished")) if t)
        self.lost_vms.append({"started": min(starts), "ended": max(ended or seen, min(starts)), "known": bool(ended)})
        self.jobs = {name: {**job, "lost_vm": True} if name in ran else job for name, job in self.jobs.items()}

    def current_times(self) -> tuple[list[float], list[float]]:
        """The starts and ends of the jobs that ran on the run's current VM (not another run's, not a lost VM's)."""
        ran = [job for job in self.jobs.values() if job.get("ran", True) and not job.get("lost_vm")]
        return [j["started"] for j in ran if j.get("started")], [j["finished"] for j in ran if j.get("finished")]

    def billed_s(self, starts: list[float] | None = None, ends: list[float] | None = None) -> float | None:
        """Seconds the run's VMs were billed: each lost one's span, and the current VM's first start to its last end
        (`starts`, `ends`: its times, this record's own by default); None before anything ran."""
        if starts is None or ends is None:
            starts, ends = self.current_times()
        since = max((vm["ended"] for vm in self.lost_vms), default=0.0)  # a lost VM's jobs are in its span
        starts, ends = [t for t in starts if t >= since], [t for t in ends if t >= since]
        lost = sum(vm["ended"] - vm["started"] for vm in self.lost_vms)
        if not (starts and ends) and not self.lost_vms:
            return None
        return lost + (max(ends) - min(starts) if starts and ends else 0.0)

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
            self.preemptions = self.preemptions or disk.preemptions
            self.lost_vms = self.lost_vms or disk.lost_vms
            self.task = self.task or disk.task
            self.booted, self.train_losses = self.booted or disk.booted, self.train_losses or disk.train_losses
            data = {key: getattr(self, key) for key in FIELDS}
            _replace(self.folder / "record.json", json.dumps(data, indent=1))
            if not self.name.startswith(PROBE_PREFIX):  # a probe measures; the run carried on stays the current
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


Time = Annotated[float, Field(gt=0, lt=1e11, allow_inf_nan=False)]  # seconds since the epoch, before year 5138
Seconds = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]  # a duration: finite, never negative
Work = Annotated[float, Field(ge=0, le=1e18, allow_inf_nan=False)]  # tokens a step or an eval handles


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # a start time as text is no time; unknown keys stay


class _Job(_Strict):
    state: str
    started: Time | None = None
    finished: Time | None = None

    @model_validator(mode="after")
    def _in_order(self):
        if self.started and self.finished and self.finished < self.started:
            raise ValueError("finished before it started")
        return self


class _Work(_Strict):
    step: Annotated[Work, Field(ge=1)]  # a step makes at least one token
    eval: Work


class _Timing(_Strict):
    startup_s: Seconds
    warmup_s: Seconds = 0.0
    step_s: Seconds
    steps: Annotated[int, Field(ge=0)]
    first_step: Annotated[int, Field(ge=0)] = 1
    eval_s: Seconds
    evals: Annotated[int, Field(ge=0)]
    eval_items: Annotated[int, Field(ge=0)] | None = None
    saves_s: Seconds = 0.0
    work: _Work | None = None  # an older record's has none: it calibrates nothing


class _Estimate(_Strict):
    low_s: Seconds
    high_s: Seconds
    chip_hours: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = []
    cost: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = None
    price_per_chip_hour: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    unknown: list[str] = []


class _LostVm(_Strict):
    started: Time
    ended: Time
    known: bool

    @model_validator(mode="after")
    def _in_order(self):
        if self.ended < self.started:
            raise ValueError("ended before it started")
        return self


class _Task(_Strict):
    name: str
    digest: str
    files: dict[str, str] = {}


class _Losses(_Strict):
    attempts: Annotated[int, Field(ge=1)]
    steps_redone: Annotated[int, Field(ge=0)]


class _Preemption(_Strict):
    at: Time
    committed_step: Annotated[int, Field(ge=0)] | None = None
    lost_chip_hours: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None


class _Record(_Strict):
    """What the readers of a record rely on (fab runs, the estimate, the result line)."""

    name: str = ""
    jobs: dict[str, _Job] = {}
    evals: list[dict] = []
    results: dict[str, str] = {}
    machine: str = ""
    settings: list[str] | None = None
    chips: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    timing: _Timing | None = None
    estimate: _Estimate | None = None
    preemptions: list[_Preemption] = []
    lost_vms: list[_LostVm] = []
    task: _Task | None = None
    booted: Time | None = None
    train_losses: _Losses | None = None


def damage(data) -> str | None:
    """What makes a record's data unusable, in one line, or None: the types its readers rely on, finite times and
    durations, no end before its start."""
    if not isinstance(data, dict):
        return f"not a run record (a {type(data).__name__})"
    try:
        _Record.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" + (f" ({str(first['input'])[:40]!r})" if "input" in first else "")
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
