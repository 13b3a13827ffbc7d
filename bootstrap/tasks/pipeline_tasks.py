"""Tasks that drive the VM: build the environment, run jobs, show state and logs.

Each imports what it needs once its session is open (tasks/common.py says why).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

from fabric import Connection, task

from ..errors import UserError
from ..paths import jobs_dir
from ..remote.jobrunner import GO_ON_ENV
from ..vm import recovery
from .common import ARG_HELP, RUN_HELP, console, number, open_session, prepare, reports_errors

RUN_OPTIONS = {"arg": ARG_HELP, "run_name": RUN_HELP}
DETACH_HELP = "return as soon as the pipeline runs on the VM (watch it later with the same command, or fab status)"


def _run(
    c,
    arg,
    run_name,
    task: str,
    only: list[str] | None,
    new_run=False,
    detach=False,
    recover=False,
    opened=None,
    progressed=None,
    named: str = "given with --run-name",
) -> None:
    """Bring the selected jobs (`only` and setup; all by default, and then the durable copies) to done on the VM.
    For fab train --watch: `opened(run_name)` is told once the VM answered and the run is chosen, `progressed()`
    each time train trains a step."""
    session = open_session(c, arg or [], run_name, named=named, new_run=new_run, recover=recover, reads_states=True)
    if opened:
        opened(session.plan.run_name)
    from ..jobs.load import SETUP
    from ..results.publish import durable_jobs, report
    from ..vm import pipeline
    from ..vm.machine import Vm

    plan = session.plan
    names = plan.names if only is None else [n for n in plan.names if n in (SETUP, *only)]
    if not names:  # `fab setup` on gke: the image is the environment
        raise UserError(
            f"{session.vm.name} has no {', '.join(only or [SETUP])} job: the gke backend runs a prebuilt image"
        )
    durable = durable_jobs(plan, session.stack) if only is None else []
    jobs = [plan.job(name) for name in names] + durable
    if isinstance(session.vm, Vm):
        pipeline.run(session, jobs, task, detach, prepare, progressed)
    else:
        from ..gke import driving  # a gke stack only

        driving.run(session, jobs, task, detach, prepare)
    if detach:
        return
    if only is None:
        session.record.results.update(report(plan, durable, console.print, session.vm.read_json))
        session.record.save()
        if plan.spec.results.mlflow and any(job.progress for job in plan.rendered):  # as fab metrics reads it
            from .results_tasks import write_metrics

            try:
                write_metrics(session)
            except UserError as err:  # the run is done all the same
                console.print(f"MLflow: not logged ({err}); fab metrics logs it again", markup=False, highlight=False)
        console.print(
            f"run {plan.run_name} done. Next: fab metrics (CSV and a plot), fab download (the model), pulumi destroy"
        )


@task(iterable=["arg"], help={"arg": ARG_HELP})
@reports_errors
def setup(c, arg=None):
    """Build the MaxText environment on the VM (a no-op in seconds when the spec is unchanged)."""
    _run(c, arg, None, "setup", only=[])


@task(
    iterable=["arg"],
    help={
        **RUN_OPTIONS,
        "new_run": "start a new run with a fresh name instead of continuing the current one",
        "detach": DETACH_HELP,
        "recover": "if the stack's VM is gone or stopped, recreate it first (your `pulumi up`), then carry on",
        "probe": "first measure: convert if needed, N train steps and one eval batch, then the whole run's estimate",
        "watch": "stay attached; if the VM is lost (a Spot preemption), recreate it and carry the run on by itself",
        "tries": f"with --watch: the most recoveries in a row before giving up (default {recovery.TRIES})",
        "go_on": "carry on a run a health rule stopped (jobs/pipeline.yaml: health), from its last checkpoint",
    },
)
@reports_errors
def train(
    c,
    arg=None,
    run_name=None,
    new_run=False,
    detach=False,
    recover=False,
    probe=None,
    watch=False,
    tries=None,
    go_on=False,
):
    """Set up the VM, then prefetch + convert -> train -> export and the durable copies, all driven on the VM."""
    if go_on:  # in train's environment: its launcher clears the stop and trains on (remote/health.py)
        arg = [*(arg or []), f"train.env.{GO_ON_ENV}=1"]
    probe, tries = number(probe, "--probe", 0), number(tries, "--tries", recovery.TRIES, least=1)
    if watch and (detach or probe):
        raise UserError("--watch stays attached to the run: leave out --detach and --probe")
    if probe:
        _probe(c, arg or [], probe, run_name)
        return
    if not watch:
        _run(c, arg, run_name, "train", None, new_run, detach, recover)
        return
    stack = not isinstance(c, Connection)  # a -H host is its owner's to recreate: only reached again
    chosen: list[str] = []  # the run the first session chose: every recovery carries on that one

    def attempt(recovering: bool, progressed) -> None:
        def opened(name: str) -> None:
            chosen[:] = chosen or [name]

        if recovering and chosen:
            named = "the run fab train --watch carries on"
            _run(c, arg, chosen[0], "train", None, recover=stack, opened=opened, progressed=progressed, named=named)
        else:
            recovers = recover or recovering and stack
            _run(c, arg, run_name, "train", None, new_run, recover=recovers, opened=opened, progressed=progressed)

    def preempted(since: float) -> str | None:
        """What the VM recorded as it went, when it was preempted since `since`."""
        from ..results import preemptions
        from .sessions import preemption_folder

        found = preemptions.last(preemption_folder(arg or [], chosen[0], stack)) if chosen else None
        return preemptions.said(found) if found and found.get("at", 0) >= since else None

    from ..jobs import load
    from ..jobs.plan import check_local

    notify_entries = check_local(load.read(jobs_dir()), arg or []).spec.results.notify
    tell = recovery.teller(notify_entries, console.print)
    # the run the watch carries on, not this machine's current-run file (another fab may have changed it)
    recovery.watch(
        attempt,
        tries,
        console.print,
        lambda text, event: tell(text, {**event, "run": chosen[0] if chosen else run_name or ""}),
        preempted=preempted,
    )


def _probe(c, arg: list[str], steps: int, run_name: str | None) -> None:
    """`fab train --probe N`: a run of its own (never the one later commands carry on) with N steps and one eval
    batch, its own cost said first; then the whole run's estimate, calibrated on the rates it measured."""
    from ..results import estimate, runs

    probe = estimate.probe_overrides(steps)
    name = run_name or f"{runs.PROBE_PREFIX}{runs.new_run_name()}"
    if not name.startswith(runs.PROBE_PREFIX):
        raise UserError(f"--probe with --run-name {name}: a probe's run is named {runs.PROBE_PREFIX}..., never a run's")
    session = open_session(c, [*arg, *probe], name, reads_states=True)
    session.command = ("fab", "train", "--probe", str(steps), *(w for a in arg for w in ("--arg", a)))
    from ..jobs import load
    from ..jobs.plan import build
    from ..results.publish import durable_jobs, durable_overrides
    from ..vm import pipeline
    from ..vm.machine import Vm

    if not isinstance(session.vm, Vm):
        raise UserError("--probe drives the vm backend's VM; on gke, a short run (--arg vars.num_batches=N) measures")
    stack, plan = session.stack or {}, session.plan
    where = (stack.get("provisioning_model"), stack.get("zone"))
    jobs = [plan.job(name) for name in plan.names if name != "export"]  # what the rates need; no export, no copies
    own = estimate.estimate(plan, *where, pipeline.autostop(session, jobs), {job.name for job in jobs})
    console.print(f"the probe ({' '.join(probe)}; no export), before it starts:", markup=False, highlight=False)
    for line in own.lines()[1:]:
        console.print(line, markup=False, highlight=False)
    pipeline.run(session, jobs, "train", False, prepare)
    files = load.read(jobs_dir())
    durable = durable_overrides(plan.spec, session.stack)
    whole = build(files, [*durable, *arg], "the-run", session.vm.conn.user, stack.get("machine_type"))
    idle = pipeline.autostop(session, [*whole.jobs, *durable_jobs(whole, session.stack)])
    console.print("the whole run (fab train with the same --args), estimated from the probe:")
    for line in estimate.estimate(whole, *where, idle).lines():
        console.print(line, markup=False, highlight=False)


@task(iterable=["arg"], help=RUN_OPTIONS)
@reports_errors
def convert(c, arg=None, run_name=None):
    """Run only the convert job (Hugging Face -> MaxText checkpoint); prefetch must be done."""
    _run(c, arg, run_name, "convert", ["convert"])


@task(iterable=["arg"], help=RUN_OPTIONS)
@reports_errors
def export(c, arg=None, run_name=None):
    """Run only the export job (last checkpoint -> Hugging Face format); train must be done."""
    _run(c, arg, run_name, "export", ["export"])


def _clock(ts):
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


@task(iterable=["arg"], help={**RUN_OPTIONS, "json": "print JSON for scripts: the lines, then each job's state"})
@reports_errors
def status(c, arg=None, run_name=None, json_=False):
    """Show the VM's pipeline (running, done or failed, since when, autostop) and each job of the run."""
    if json_:
        console.file = sys.stderr  # stdout is the JSON alone: what opening the session says goes to stderr
    session = open_session(c, arg or [], run_name, runs_jobs=False, reads_states=True)
    from rich.table import Table

    from ..results import runs
    from ..vm import pipeline
    from ..vm.machine import Vm
    from ..vm.progress import result_lines

    if isinstance(session.vm, Vm):
        startup = f"startup script: {session.vm.facts['startup'].describe()}"
        lines = [startup, *pipeline.status_lines(getattr(session.vm, "pipeline", None))]
    else:
        from ..gke import driving  # a gke stack only

        lines = driving.status_lines(session)
    lines += result_lines(session.record.evals)
    states = session.vm.states([job.job_dir for job in session.plan.jobs])
    if json_:
        jobs = [{"job": job.name, **state.to_json()} for job, state in zip(session.plan.jobs, states, strict=True)]
        found = {"run": session.plan.run_name, "vm": session.vm.name, "lines": lines, "jobs": jobs}
        print(json.dumps({**found, "pipeline": getattr(session.vm, "pipeline", None)}, indent=1))
        return
    for line in lines:
        console.print(line, markup=False, highlight=False)
    table = Table(title=f"run {session.plan.run_name} on {session.vm.name}")
    for column in ("job", "state", "started", "duration", "outputs"):
        table.add_column(column)
    for job, state in zip(session.plan.jobs, states, strict=True):
        took = runs.minutes({"started": state.started, "finished": state.finished})
        outputs = "\n".join(state.outputs or state.missing) or "-"
        duration = f"{took:.1f} min" if took is not None else "-"
        table.add_row(job.name, state.state.value, _clock(state.started), duration, outputs)
    console.print(table)


@task(
    iterable=["arg"], help={"job": "the job to follow (default: the running one, else the last started)", **RUN_OPTIONS}
)
@reports_errors
def logs(c, job=None, arg=None, run_name=None):
    """Follow a job's log on the VM; Ctrl-C stops following, never the job."""
    session = open_session(c, arg or [], run_name, runs_jobs=False, reads_states=job is None)
    from ..jobs.load import SETUP

    if job is None:
        states = dict(zip(session.plan.names, session.vm.states([j.job_dir for j in session.plan.jobs]), strict=True))
        started = [name for name, state in states.items() if state.state.value != "pending"]
        running = [name for name in started if states[name].state.value == "running"]
        job = (running or started or [SETUP])[-1]
    planned = session.plan.job(job)
    console.print(f"following {job} on {session.vm.name} (Ctrl-C stops following; the job goes on)", style="dim")
    out = sys.stdout
    try:
        session.vm.follow(planned.job_dir, lambda line: out.write(line + "\n"))
    except KeyboardInterrupt:
        console.print(f"\nstopped following; the job goes on. Again: {session.hint('logs', '--job', job)}", style="dim")
