"""Bring the plan's jobs to done on the VM: a graph, not a chain.

Each job is decided from its state on the VM (`decide`: skip, re-attach or start), and
every job whose needs are met runs at the same time as the others (setup and prefetch
together). Jobs run detached, so a dropped connection or Ctrl-C loses nothing: the next
command decides again from the VM's state. Only a job's own verdict on the VM (exit 0
and outputs present) makes it done; a followed job that is still running is never
reported as failed.
"""

from __future__ import annotations

import enum
import getpass
import os
import queue
import shlex
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime

from rich.console import Console

from ..errors import UserError
from ..jobs.plan import Plan, PlannedJob
from ..remote import jobrunner
from ..remote.jobrunner import JobState
from ..results.runs import RunRecord, minutes
from .machine import JobStatus, Vm
from .progress import Board, JobProgress

LOG_TAIL_LINES = 30
WAIT_SECONDS = 1


class Action(enum.Enum):
    """What to do with a job, given its state on the VM."""

    SKIP = "skip"
    """Done, outputs present: nothing to do."""
    ATTACH = "attach"
    """Running (perhaps started by a fab that went away): follow it."""
    START = "start"
    """Never run, failed, interrupted, or its outputs are gone: (re)start it."""


def decide(name: str, status: JobStatus) -> tuple[Action, str]:
    """The decision table: one action and one line for the user per state."""
    state = status.state
    if state is JobState.DONE:
        return Action.SKIP, f"{name}: done already (finished {_clock(status.finished)}, outputs present), skipping"
    if state is JobState.RUNNING:
        return Action.ATTACH, f"{name}: already running since {_clock(status.started)}, re-attaching"
    if state is JobState.LOST:
        return Action.START, f"{name}: was done but its outputs are gone (VM restarted?), running it again"
    if state is JobState.FAILED:
        return Action.START, f"{name}: last attempt failed ({status.error or 'see its log'}), retrying"
    if state is JobState.INTERRUPTED:
        return Action.START, f"{name}: last attempt was interrupted, starting it again"
    return Action.START, f"{name}: starting"


def owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since {datetime.now().strftime('%H:%M:%S')}"


@dataclass
class Session:
    """One fab command's plan, VM (or the gke backend's cluster, behind the same interface), display and run record."""

    plan: Plan
    vm: Vm
    console: Console
    record: RunRecord
    secrets: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    preflight_done: bool = False

    def hint(self, *task: str) -> str:
        """A fab command line that works as printed: the task, with this command's run and overrides."""
        words = ["fab", *task, "--run-name", self.plan.run_name]
        for override in self.overrides:
            words += ["--arg", override]
        return shlex.join(words)


def preflight(session: Session) -> None:
    """Check the VM once per command, just before the first TPU job starts."""
    if session.preflight_done:
        return
    vm_spec = session.plan.spec.vm
    request = {
        "chips": vm_spec.chips,
        "chip_glob": vm_spec.chip_glob,
        "min_memory_gb": vm_spec.min_memory_gb,
        "min_shm_gb": vm_spec.min_shm_gb,
        "shm_path": vm_spec.shm_path,
        "secrets": {name: f"{session.plan.layout.secrets}/{name}" for name in session.secrets},
    }
    checks = session.vm.preflight(request)
    failures = [f"{session.vm.name}: preflight {c['check']}: {c['message']}" for c in checks if not c["ok"]]
    if failures:
        raise UserError(failures)
    for check in checks:
        if "removed" in check["message"]:
            session.console.print(f"{session.vm.name}: {check['message']}")
    session.preflight_done = True
    session.console.print(f"preflight ok on {session.vm.name}")


def run_jobs(session: Session, jobs: list[PlannedJob]) -> None:
    """Bring `jobs` to done; their needs outside `jobs` must be done already."""
    vm, console = session.vm, session.console
    known = {job.name: job for job in (*session.plan.jobs, *jobs)}
    statuses = dict(zip(known, vm.states([j.job_dir for j in known.values()]), strict=True))
    wanted = {job.name for job in jobs}
    for job in jobs:
        for need in job.needs:
            if need not in wanted and statuses[need].state is not JobState.DONE:
                raise UserError(f"{job.name} needs {need}, which is {statuses[need].state.value}: run fab train first")
    done: set[str] = set()
    relaunched: set[str] = set()
    running: dict[str, PlannedJob] = {}
    finished: queue.Queue = queue.Queue()
    with Board(console) as board:

        def follow(job: PlannedJob, progress: JobProgress | None = None) -> None:
            if progress is None:
                rendered = job.rendered
                progress = board.job(
                    job.name, rendered.progress["total_steps"] if rendered and rendered.progress else None
                )
            try:
                vm.follow(job.job_dir, progress.feed, progress.tick)
                finished.put((job, progress, None))
            except BaseException as err:  # handed to the main thread, which raises it
                finished.put((job, progress, err))

        def start_ready() -> None:
            changed = True
            while changed:
                changed = False
                for job in jobs:
                    if job.name in done or job.name in running or any(n in wanted and n not in done for n in job.needs):
                        continue
                    action, message = decide(job.name, statuses[job.name])
                    if action is Action.START and job.uses_tpu:
                        preflight(session)
                    console.print(message)
                    changed = True
                    if action is Action.SKIP:
                        done.add(job.name)
                        continue
                    if action is not Action.SKIP:  # a running job whose runner died gets one that adopts it
                        vm.launch(job)
                    running[job.name] = job
                    threading.Thread(target=follow, args=(job,), daemon=True).start()

        start_ready()
        while running:
            try:
                job, progress, error = finished.get(timeout=WAIT_SECONDS)
            except queue.Empty:
                vm.check_lock()
                continue
            if error is not None:
                raise error
            status = vm.states([job.job_dir])[0]
            if status.state is JobState.RUNNING:  # the log stream ended early: the job is fine, follow on
                threading.Thread(target=follow, args=(job, progress), daemon=True).start()
                continue
            if status.state is JobState.INTERRUPTED and job.name not in relaunched:
                relaunched.add(job.name)  # its runner died: a new one adopts the process or its exit code
                console.print(f"{job.name}: its runner stopped; starting one that takes over")
                vm.launch(job)
                threading.Thread(target=follow, args=(job, progress), daemon=True).start()
                continue
            del running[job.name]
            session.record.note_job(job.name, status)
            if progress.evals:  # the log is read from its start, so this is the whole list
                session.record.evals = progress.evals
            if status.state is not JobState.DONE:
                _fail(session, job, status, list(running))
            console.print(f"{job.name}: done in {minutes(session.record.jobs[job.name]) or 0:.1f} min")
            done.add(job.name)
            start_ready()
    session.record.save()


def _fail(session: Session, job: PlannedJob, status: JobStatus, still_running: list[str]) -> None:
    vm = session.vm
    session.record.save()
    session.console.print(f"--- last {LOG_TAIL_LINES} lines of {vm.name}:{status.log} ---")
    for line in vm.tail(job.job_dir, LOG_TAIL_LINES):
        session.console.print(line, markup=False, highlight=False)
    if status.state is JobState.INTERRUPTED:  # the runner itself died: its own stderr says why
        for line in vm.tail(job.job_dir, LOG_TAIL_LINES, jobrunner.RUNNER_ERR):
            session.console.print(f"runner | {line}", markup=False, highlight=False)
    going_on = f" {', '.join(still_running)} goes on on the VM." if still_running else ""
    raise UserError(
        f"{job.name} {status.state.value} on {vm.name}: {status.error or 'see the log'}.{going_on} "
        f"Full log: {session.hint('logs', '--job', job.name)}. Fix the cause, then run fab train again to retry it"
    )


def _clock(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "?"
