"""A command's session: the jobs checked, the VM reached, the run chosen, the one plan built.

Imported by tasks/common.py on use: with a dial begun early (vm/dial.py), the jobs' schema and checks
import while the connection opens.
"""

from __future__ import annotations

import contextlib

from invoke import Context

from .. import beside, secrets
from ..errors import UserError, VmUnavailable
from ..jobs import check, load, task_check, tracking
from ..jobs.checked import LocalInputs
from ..jobs.plan import DURABLE_DIR, Plan, build, check_local, check_run_name, secret_sources
from ..paths import jobs_dir
from ..remote import gcs, preempted
from ..remote.attempts import DIR_ENV
from ..remote.jobrunner import JobState, Layout
from ..results import preemptions, runs
from ..results.publish import durable_jobs, durable_overrides
from ..results.runs import PROBE_PREFIX
from ..session import Session, TokenCheck
from ..vm import connect
from ..vm.dial import Dial
from ..vm.machine import Vm
from ..vm.output import Cleaner
from .common import console, gke_session


def open_session(
    c: Context,
    inputs: LocalInputs,
    dial: Dial | None,
    overrides: list[str],
    run_name: str | None = None,
    *,
    new_run: bool = False,
    runs_jobs: bool = True,
    recover: bool = False,
    reads_states: bool = False,
    named: str = "given with --run-name",
) -> Session:
    """Check everything local first, then connect, choose the run, and build the one plan.

    Commands that start jobs (`runs_jobs`) also need the jobs' secrets, checked before connecting. Those that
    show the jobs' states (`reads_states`) read them with the install's round trip, for the run expected.
    A stack of the gke backend is driven through its cluster, everything else over SSH; `recover`
    first recreates the stack's VM if it is gone. A `dial` begun early (the same `inputs` passed before) has
    been reaching the VM meanwhile; otherwise it begins once the local checks passed.
    """
    files = load.read(jobs_dir())
    pipeline = check_local(files, overrides)
    if run_name is not None:
        check_run_name(run_name)
    if runs_jobs:  # the task's rows and rewards, tried here before anything is started or paid for
        task_check.check(pipeline.task, remote=True)
    connect.refuse_several_hosts(c, None)  # -H's, read from the command line; the stack's once read
    sources = secret_sources(pipeline)
    values = secrets.require(sources) if runs_jobs else secrets.available(sources)
    inputs.passed()
    dial = dial or Dial(c, console.print, connects=not recover)
    outputs = dial.outputs()
    connect.refuse_several_hosts(c, outputs)
    target = gke_session().target_of(outputs, pipeline.spec) if outputs and outputs.get("backend") == "gke" else None
    planned_with = gke_session().overrides(files, target, overrides) if target else overrides
    if target and recover:
        raise UserError("--recover recreates the vm backend's VM; on gke the cluster replaces lost nodes itself")
    if target and pipeline.spec.results.notify:
        why = "the gke backend tells no receiver yet (its driver runs in the cluster): set notify: [] for a gke stack"
        raise UserError([pipeline.doc.origin("results", "notify").problem("results.notify", why)])
    if target and not pipeline.task.builtin:
        why = "the gke backend trains GSM8K only yet (its pods get no task files): set task: gsm8k for a gke stack"
        raise UserError([pipeline.doc.origin("task").problem("task", why)])
    if target and pipeline.spec.results.wandb:
        why = "the gke backend gives train no W&B key yet (its pods get the token alone): set wandb: '' for a gke stack"
        raise UserError([pipeline.doc.origin("results", "wandb").problem("results.wandb", why)])
    values |= secrets.notify_urls(pipeline.spec.results.notify, str(files.pipeline.path), runs_jobs)
    values |= tracking.secret_values(pipeline.spec.results)
    expected = None if target or new_run or not reads_states else (run_name or runs.current_run())
    token_check = (
        TokenCheck(values["HF_TOKEN"], check.base_model_of(pipeline), pipeline.spec.results.hub_repo)
        if runs_jobs and "HF_TOKEN" in values and _work_likely(expected, overrides)
        else None
    )
    recreated = False  # with --recover: the VM was gone, and made again
    if target:
        console.print(f"connecting to the GKE cluster {outputs['cluster_name']} (Pulumi stack outputs)")
        driver = gke_session().connect(outputs, Cleaner(values.values()))
        source = f"{runs.runs_dir()}/{runs.CURRENT}"
    else:
        if recover:
            outputs, recreated = connect.recover(outputs, console.print)
            conn = connect.connection(c, console.print, outputs)
            console.print(f"connecting to {conn.host} (Pulumi stack outputs)")
            conn, asking = connect.open_connection(conn, outputs), None
        else:
            if host := dial.host():  # none: the dial's own error says so
                console.print(f"connecting to {host} ({'-H' if outputs is None else 'Pulumi stack outputs'})")
            try:
                conn, asking = dial.connection()
            except VmUnavailable as lost:  # what the VM recorded as it went, when it was preempted
                run = None if new_run else run_name or runs.current_run()
                found = preemptions.last(_preemption_folder(files, pipeline, outputs, overrides, run)) if run else None
                said = f"; it was {preemptions.said(found)}" if found else ""
                raise VmUnavailable(lost.reason + said, str(lost)[len(lost.reason) :]) from None
        driver = Vm(conn, Layout(pipeline.spec.vm.state_dir), Cleaner(values.values()), asking)
        source = f"{driver.name}:{driver.layout.current_run}"
    durable = [] if target else durable_overrides(pipeline.spec, outputs)
    user = None if target else conn.user  # the SSH user: its own folder in the VM's /dev/shm
    machine_type = (outputs or {}).get("machine_type")  # the stack's: vm.accelerator auto
    chosen = (user, machine_type)
    expected_plan = build(files, [*durable, *overrides], expected, *chosen) if expected else None  # the plan if chosen
    ahead = _read_ahead(expected_plan, outputs, runs_jobs) if expected_plan else ()
    current = driver.install(
        values, pipeline.spec.vm.startup_marker, *([ahead] if ahead else []), meanwhile=_start_importing_what_follows
    )
    laptop = runs.current_run()
    if laptop and laptop.startswith(PROBE_PREFIX):  # a probe measured rates; the run itself is another
        laptop = None
    if current is None and not target and not (run_name or new_run) and laptop:
        # A VM with no run of its own (a new one, or a -H host recreated): the run this machine last handed to that
        # same VM carries on where its durable state is kept, rather than a new run from step 0 beside it.
        if recover:
            current, source = laptop, f"{runs.runs_dir()}/{runs.CURRENT} (the lost VM's run)"
        elif runs.RunRecord.load(laptop).machine == driver.identity and gcs.is_gcs(
            kept := durable_dir(files, pipeline, outputs, overrides)
        ):  # handed to this same host and state folder before (not another VM's live run)
            current, source = laptop, f"{runs.runs_dir()}/{runs.CURRENT}"
            console.print(
                f"{driver.name} has no run of its own: carrying on with this machine's run {laptop}, whose model and "
                f"checkpoints are kept in {kept} (--new-run starts another)"
            )
    name, why = choose_run(current, source, run_name, new_run, named)
    console.print(f"run {name} ({why}) on {driver.name}")
    if target:
        plan = gke_session().plan(files, planned_with, name, target)
    else:
        plan = (
            expected_plan if expected_plan and name == expected else build(files, [*durable, *overrides], name, *chosen)
        )
    record = runs.RunRecord.load(name)
    if runs_jobs:
        same_task(record, plan.task)
    if recreated:  # the VM the run was on is gone: its billed time is kept apart, the new VM's counted from now
        found = preemptions.last(_preemption_folder(files, pipeline, outputs, overrides, name))
        record.lose_vm(found["at"] if found and isinstance(found.get("at"), (int, float)) else None)
        record.save()
    session = Session(plan, driver, console, record, values, overrides, outputs, token_check=token_check)
    if runs_jobs and target:  # the cluster's driver starts what it needs: the token is checked before it is handed over
        session.check_token()
    return session


def same_task(record: runs.RunRecord, task) -> None:
    """A run carries on only with the task it began with: a reward, data or prompt changed since would judge and
    train a mixture of two tasks. One line, naming the files, and the way on."""
    if not record.task or record.task.get("digest") == task.digest:
        return
    was = record.task.get("files") or {}
    changed = sorted(name for name in {*was, *task.digests} if was.get(name) != task.digests.get(name))
    raise UserError(
        f"run {record.name} began with the task {record.task.get('name')} as it was then; "
        f"{', '.join(changed) or 'its files'} changed since (jobs/tasks/): --new-run trains it as a new run, or put "
        "them back to carry this one on"
    )


def _work_likely(expected: str | None, overrides: list[str]) -> bool:
    """This machine's guess, before connecting, that the command will start a job: a new run, or the run last
    run with other settings or not seen done here. The Hub check then runs beside the connection; only a
    guess: a no-op as this machine last saw it asks the Hub nothing, and no job starts before the check."""
    if expected is None:
        return True
    record = runs.RunRecord.load(expected)
    return (
        record.settings != list(overrides)
        or not record.jobs
        or any(job.get("state") != JobState.DONE.value for job in record.jobs.values())
    )


def _read_ahead(plan: Plan, outputs: dict | None, runs_jobs: bool) -> tuple[str, ...]:
    """The job folders whose states the install reads for the run expected: its jobs, and for a command that
    runs them the durable copies too (a no-op `fab train` then knows in that one round trip)."""
    jobs = [*plan.jobs, *(durable_jobs(plan, outputs) if runs_jobs else [])]
    return tuple(job.job_dir for job in jobs)


def preemption_folder(overrides: list[str], run: str, stack: bool) -> str | None:
    """Where `run`'s preemption records are, for the stack's VM (or, not `stack`, a -H host); None where that is not
    known here (the stack's outputs cannot be read)."""
    files = load.read(jobs_dir())
    try:
        outputs = connect.stack_outputs() if stack else None
    except UserError:
        return None
    return _preemption_folder(files, check_local(files, overrides), outputs, overrides, run)


def _preemption_folder(
    files: load.JobFiles, pipeline, outputs: dict | None, overrides: list[str], run: str
) -> str | None:
    """Where the run's preemption records are (remote/preempted.py): beside its start records."""
    if not gcs.is_gcs(durable_dir(files, pipeline, outputs, overrides)):
        return None  # on the VM's disk, gone with it
    planned = build(files, [*durable_overrides(pipeline.spec, outputs), *overrides], run)
    train = next((job for job in planned.rendered if job.env.get(DIR_ENV)), None)
    return preempted.folder_of(train.env) if train else None


def durable_dir(files: load.JobFiles, pipeline, outputs: dict | None, overrides: list[str]) -> str:
    """Where the plan keeps the converted model and the checkpoints (vars.durable_dir; gs://: in a bucket)."""
    return load.resolve(files, [*durable_overrides(pipeline.spec, outputs), *overrides]).values.get(DURABLE_DIR, "")


def choose_run(
    current: str | None, source: str, requested: str | None, new: bool, named: str = "given with --run-name"
) -> tuple[str, str]:
    """The run to work on and why: asked for (`named` says by whom), the current one (kept at `source`), or a new
    one."""
    if requested:
        return requested, named
    if not new and current and not current.startswith(PROBE_PREFIX):  # a probe's is never carried on
        return check_run_name(current, source), "the current run"
    return runs.new_run_name(), "a new run"


def _start_importing_what_follows() -> None:
    """Begun once the install's request is out, while the VM answers: begun before, it held the request back (13 ms
    of a no-op `fab train`, 2026-12-07), as one interpreter runs either at a time."""
    beside.start(_import_what_follows, finish=True)


def _import_what_follows() -> None:
    """What a command imports once its session is open (the pipeline's driving and display). An error here is the
    command's to meet where it imports the same."""
    with contextlib.suppress(Exception):
        from ..vm import pipeline  # noqa: F401
