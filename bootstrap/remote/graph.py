"""The pipeline's decisions, from job states alone: which job starts, is adopted, skipped or blocked, and how the
pipeline stands. The driver on the VM (driver.py) and the one in a gke cluster (gke_driver.py) drive through it;
it reads and launches nothing itself. Standard library only, beside them in the tools folder.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import datetime

try:
    from .jobrunner import GO_ON_ENV, JobState  # on the laptop: bootstrap.remote
except ImportError:
    from jobrunner import GO_ON_ENV, JobState  # on the VM: beside this script in the tools folder

PREFLIGHT = "preflight"  # what failed, when the run's folders are refused before any job is looked at


class PipelineState(str, enum.Enum):
    """Where the pipeline stands, as driver.json records it."""

    RUNNING = "running"
    """The driver is bringing jobs to done."""
    DONE = "done"
    """Every job is done (the driver may still wait to shut the VM down)."""
    FAILED = "failed"
    """A job failed (or a preflight check did); what did not need it ran on."""
    INTERRUPTED = "interrupted"
    """The driver died before the pipeline ended; the next fab command restarts it."""
    STOPPED = "stopped"
    """A health rule stopped a job (train: its last committed checkpoint kept); what did not need it ran on."""


class Action(enum.Enum):
    """What to do with a job, given its state on the VM."""

    SKIP = "skip"
    """Done, outputs present: nothing to do."""
    ATTACH = "attach"
    """Running (perhaps started before a driver or fab went away): follow it."""
    START = "start"
    """Never run, failed, interrupted, stale, or its outputs are gone: (re)start it."""
    HOLD = "hold"
    """Stopped by a health rule: left stopped, its dependants with it, until fab train --go-on."""


def decide(name: str, state: dict, go_on: bool = False) -> tuple[Action, str]:
    """The decision table: one action and one line for the user per job state (`go_on`: fab train --go-on)."""
    job_state = JobState(state["state"])
    if job_state is JobState.STOPPED and not go_on:
        why = "a health rule stopped it (its log says which); fab train --go-on carries it on, --new-run starts afresh"
        return Action.HOLD, f"{name}: {why}"
    if job_state is JobState.STOPPED:
        return Action.START, f"{name}: stopped by a health rule, carried on as fab train --go-on asks"
    if job_state is JobState.DONE and state.get("restored_from"):
        return (
            Action.SKIP,
            f"{name}: done already, kept in the bucket (finished {clock(state.get('finished'))}), skipping",
        )
    if job_state is JobState.DONE and state.get("source_gone"):
        return (
            Action.SKIP,
            f"{name}: done already (finished {clock(state.get('finished'))}): the model is kept there, the VM's "
            "copy it was made from is gone; nothing is trained or uploaded again (fab export makes a new one)",
        )
    if job_state is JobState.DONE:
        return Action.SKIP, f"{name}: done already (finished {clock(state.get('finished'))}, outputs present), skipping"
    if job_state is JobState.RUNNING:
        return Action.ATTACH, f"{name}: already running since {clock(state.get('started'))}, re-attaching"
    if job_state is JobState.LOST and state.get("changed"):
        return Action.START, f"{name}: was done but {state['error']} (not what it made), running it again"
    if job_state is JobState.LOST:
        return Action.START, f"{name}: was done but its outputs are gone (VM restarted?), running it again"
    if job_state is JobState.STALE:
        return (
            Action.START,
            f"{name}: was done for inputs that have changed since ({state.get('error')}), running it again",
        )
    if job_state is JobState.FAILED:
        return Action.START, f"{name}: last attempt failed ({state.get('error') or 'see its log'}), retrying"
    if job_state is JobState.INTERRUPTED:
        return Action.START, f"{name}: last attempt was interrupted, starting it again"
    return Action.START, f"{name}: starting"


def clock(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "?"


class Graph:
    """The pipeline's decisions, from job states alone: what starts, what is adopted, what is blocked.

    `state_of`, `launch` and `preflight` are the VM (or fakes, in tests; `launch` returns why a
    job could not start, or None; `preflight(tpu)` the checks before anything else (tpu False: the run's
    folders, on every pass, since a done job's outputs are trusted only in folders no one else can write) or
    before the first TPU job (chips, memory, the TPU free)); every change is handed to `emit` as an
    event. A job marked `"start": false` is only needed: it must be done already, or its dependants are
    blocked (fab convert before fab train).
    """

    def __init__(self, jobs: list[dict], state_of: Callable, launch: Callable, preflight: Callable, emit: Callable):
        self.jobs = {job["name"]: job for job in jobs}
        self.state_of, self.launch, self.preflight, self.emit = state_of, launch, preflight, emit
        self.done: set[str] = set()
        self.failed: dict[str, str] = {}  # job -> why (its own error, or the need that failed)
        self.stopped: set[str] = set()  # of those, stopped by a health rule, and what needs them
        self.running: set[str] = set()
        self.relaunched: set[str] = set()
        self.preflights: dict[bool, bool] = {}  # each phase's verdict, once: before any job (False), a TPU job (True)
        self.checked = False

    def step(self) -> bool:
        """One look at every job: start what is ready, notice what ended. False once nothing is left to do."""
        if not self.checked:  # a job only needed must be done (or not needed at all), or nothing starts
            self.checked = True
            if not self._preflight(False):  # every pass, before any output is trusted: a restart empties /dev/shm
                self.failed[PREFLIGHT] = "the run's folders are not the SSH user's alone"
                return False
            self._skip_unneeded()
            for job in self.jobs.values():
                if not job.get("start", True) and job["name"] not in self.done:
                    self._decide(job)
            if self.failed:
                return False
        self._start_ready()
        for name in sorted(self.running):
            self._check(name)
        self._start_ready()
        return bool(self.running)

    @property
    def outcome(self) -> PipelineState:
        if not self.failed:
            return PipelineState.DONE
        return PipelineState.STOPPED if set(self.failed) <= self.stopped else PipelineState.FAILED

    def _ready(self) -> list[dict]:
        decided = self.done | set(self.failed) | self.running
        return [
            job
            for name, job in self.jobs.items()
            if name not in decided and (not job.get("start", True) or all(n in self.done for n in job["needs"]))
        ]  # a job only needed is looked at first: its own needs are not in the plan

    def _skip_unneeded(self) -> None:
        """A job that only done jobs need is not run (prefetch, when the model it converts is kept in the bucket).
        A Hub upload that held the model back, whose export is gone, is said at once: the model is kept nowhere."""
        states = {name: self.state_of(job) for name, job in self.jobs.items()}
        for name in (name for name, state in states.items() if state.get("held_gone")):
            message = (
                "held the model back (results.publish_if), and the VM's copy of it is gone (VM restarted?): it is "
                "kept nowhere, so it is exported again (from the checkpoints, or trained again without them) and "
                "judged again"
            )
            self.emit({"event": "note", "job": name, "message": message})
        done = {name for name, state in states.items() if JobState(state["state"]) is JobState.DONE}
        changed = True
        while changed:
            changed = False
            for name in self.jobs:
                dependants = [n for n, job in self.jobs.items() if name in job["needs"]]
                if name not in done and dependants and all(n in done for n in dependants):
                    done.add(name)
                    self.done.add(name)
                    message = f"{name}: not needed, {', '.join(dependants)} done already"
                    self.emit({"event": "decide", "job": name, "action": Action.SKIP.value, "message": message})
                    changed = True

    def _start_ready(self) -> None:
        self._block_dependants()
        while ready := self._ready():
            for job in ready:
                self._decide(job)
            self._block_dependants()

    def _block_dependants(self) -> None:
        changed = True
        while changed:
            changed = False
            for name, job in self.jobs.items():
                bad = next((n for n in job["needs"] if n in self.failed), None)
                if bad and name not in self.failed and name not in self.running and name not in self.done:
                    self.failed[name] = f"needs {bad}, which {'stopped' if bad in self.stopped else 'failed'}"
                    if bad in self.stopped:
                        self.stopped.add(name)
                    self.emit({"event": "blocked", "job": name, "needs": bad})
                    changed = True

    def _decide(self, job: dict) -> None:
        name, state = job["name"], self.state_of(job)
        action, message = decide(name, state, bool(((job.get("spec") or {}).get("env") or {}).get(GO_ON_ENV)))
        if action is Action.HOLD:
            self.failed[name], self.stopped = state.get("error") or "stopped", self.stopped | {name}
            self.emit({"event": "decide", "job": name, "action": action.value, "message": message, "state": state})
            self.emit({"event": "end", "job": name, "state": state})
            return
        if not job.get("start", True) and action is not Action.SKIP:
            self.failed[name] = f"{name} is {state['state']}"
            self.emit({"event": "needed", "job": name, "state": state})
            return
        if action is Action.SKIP:
            self.done.add(name)
        elif action is Action.START and not all(self._preflight(tpu) for tpu in (False, bool(job.get("uses_tpu")))):
            self.failed[name] = "the VM's preflight failed"
            return
        elif error := self.launch(job):
            self.failed[name] = error
            self.emit({"event": "decide", "job": name, "action": action.value, "message": message, "state": state})
            self.emit({"event": "end", "job": name, "state": {**state, "state": JobState.FAILED.value, "error": error}})
            return
        else:
            self.running.add(name)
        self.emit({"event": "decide", "job": name, "action": action.value, "message": message, "state": state})

    def _preflight(self, tpu: bool) -> bool:
        """The VM's own checks, each phase once: the run's folders before the first job starts, the chips, memory
        and a free TPU just before the first TPU job."""
        if tpu not in self.preflights:
            checks = self.preflight(tpu)
            self.preflights[tpu] = all(c["ok"] for c in checks)
            self.emit({"event": "preflight", "ok": self.preflights[tpu], "checks": checks})
        return self.preflights[tpu]

    def _check(self, name: str) -> None:
        job = self.jobs[name]
        state = self.state_of(job)
        job_state = JobState(state["state"])
        if job_state is JobState.RUNNING:
            return
        if job_state is JobState.INTERRUPTED and name not in self.relaunched:
            self.relaunched.add(name)  # its runner died: a new one adopts the process or its exit code
            if not (error := self.launch(job)):
                self.emit({"event": "relaunch", "job": name})
                return
            state = {**state, "state": JobState.FAILED.value, "error": error}
        self.running.discard(name)
        if job_state is JobState.DONE:
            self.done.add(name)
        else:
            self.failed[name] = state.get("error") or job_state.value
            if job_state is JobState.STOPPED:
                self.stopped.add(name)
        self.emit({"event": "end", "job": name, "state": state})
