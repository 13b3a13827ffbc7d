"""Tasks that drive the VM: build the environment, run jobs, show state and logs."""

from __future__ import annotations

import sys
from datetime import datetime

from fabric import task
from rich.table import Table

from .. import runs
from ..errors import UserError
from ..pipeline_run import Session, Stage, owner, run_stages, stages
from ..publish import publish_after_train
from .common import ARG_HELP, RUN_HELP, console, open_session, prepare, reports_errors

RUN_OPTIONS = {"arg": ARG_HELP, "run_name": RUN_HELP}


def _run(c, arg, run_name, only: list[str] | None, new_run: bool = False, after=lambda session: None) -> None:
    """Run the selected stages, and then `after`, while holding the VM's lock."""
    session = open_session(c, arg or [], run_name, new_run)
    with session.workers[0].lock(owner()):
        prepare(session)
        selected = stages(session, only)
        if only:
            _require_needs(session, selected[1:])
        run_stages(session, selected)
        after(session)


def _require_needs(session: Session, selected: list[Stage]) -> None:
    """A single job runs only when the jobs it needs are done."""
    by_name = {stage.name: stage for stage in stages(session)}
    for stage in selected:
        for need in session.rendered(session.workers[0])[stage.name].needs:
            state = by_name[need].states()[0]["state"]
            if state != "done":
                raise UserError(f"{stage.name} needs {need}, which is {state}: run fab {need} or fab train")


@task(iterable=["arg"], help={"arg": ARG_HELP})
@reports_errors
def setup(c, arg=None):
    """Build the MaxText environment on the VM (a no-op in seconds when the spec is unchanged)."""
    _run(c, arg, None, only=[])


@task(
    iterable=["arg"],
    help={**RUN_OPTIONS, "new_run": "start a new run with a fresh name instead of continuing the current one"},
)
@reports_errors
def train(c, arg=None, run_name=None, new_run=False):
    """Set up the VM, then convert -> train -> export; safe to interrupt and run again."""
    _run(c, arg, run_name, None, new_run, after=_finish_train)


def _finish_train(session: Session) -> None:
    publish_after_train(session)
    console.print(
        f"run {session.run.name} done. Next: fab metrics (CSV and a plot), fab download (the model), pulumi destroy"
    )


@task(iterable=["arg"], help=RUN_OPTIONS)
@reports_errors
def convert(c, arg=None, run_name=None):
    """Run only the convert job (Hugging Face -> MaxText checkpoint)."""
    _run(c, arg, run_name, ["convert"])


@task(iterable=["arg"], help=RUN_OPTIONS)
@reports_errors
def export(c, arg=None, run_name=None):
    """Run only the export job (last checkpoint -> Hugging Face format); train must be done."""
    _run(c, arg, run_name, ["export"])


def _clock(ts):
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


@task(iterable=["arg"], help=RUN_OPTIONS)
@reports_errors
def status(c, arg=None, run_name=None):
    """Show each job of the run: state, start, duration, outputs."""
    session = open_session(c, arg or [], run_name, runs_jobs=False)
    table = Table(title=f"run {session.run.name}")
    for column in ("worker", "job", "state", "started", "duration", "outputs"):
        table.add_column(column)
    all_stages = stages(session)
    for worker in session.workers:
        states = worker.job_states([stage.job_dir for stage in all_stages])
        for stage, state in zip(all_stages, states, strict=True):
            took = runs.minutes(state)
            duration = f"{took:.1f} min" if took is not None else "-"
            outputs = "\n".join(state.get("outputs") or state.get("missing") or []) or "-"
            table.add_row(worker.name, stage.name, state["state"], _clock(state.get("started")), duration, outputs)
    console.print(table)


@task(
    iterable=["arg"], help={"job": "the job to follow (default: the running one, else the last started)", **RUN_OPTIONS}
)
@reports_errors
def logs(c, job=None, arg=None, run_name=None):
    """Follow a job's log on the VM; Ctrl-C stops following, never the job."""
    session = open_session(c, arg or [], run_name, runs_jobs=False)
    all_stages = {stage.name: stage for stage in stages(session)}
    worker = session.workers[0]
    if job is None:
        states = dict(zip(all_stages, worker.job_states([s.job_dir for s in all_stages.values()]), strict=True))
        started = [name for name, state in states.items() if state["state"] != "pending"]
        running = [name for name in started if states[name]["state"] == "running"]
        job = (running or started or ["setup"])[-1]
    if job not in all_stages:
        raise UserError(f"no job {job!r}; jobs are {', '.join(all_stages)}")
    console.print(f"following {job} on {worker.name} (Ctrl-C stops following; the job goes on)", style="dim")
    out = sys.stdout
    try:
        worker.follow(all_stages[job].job_dir, lambda line: out.write(line + "\n"))
    except KeyboardInterrupt:
        console.print("\nstopped following; the job goes on", style="dim")
