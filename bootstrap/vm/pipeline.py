"""The laptop's half of a pipeline on the VM: hand the checked plan to the VM's driver, then watch it.

fab renders and checks everything here, then sends the driver (bootstrap/remote/driver.py)
the plan as data. The driver brings it to done on the VM whether or not this laptop stays:
Ctrl-C, a lost connection or a closed laptop only stop the watching. A second fab with
the same plan attaches to it; one with another plan is refused while it runs.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import time
from datetime import datetime

from .. import secrets
from ..errors import StoppedWatching, UserError, VmUnavailable
from ..jobs import before
from ..jobs.plan import PlannedJob
from ..remote import gcs
from ..remote.graph import PipelineState, clock
from ..remote.jobrunner import JobState
from ..results import estimate
from ..results.publish import DURABLE_PREFIX
from ..session import Session
from .here import Here
from .machine import ConnectionLost, JobStatus
from .progress import Board
from .watch import Watcher

MAX_REVIVALS = 3


def owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} at {datetime.now().strftime('%H:%M:%S')}"


def autostop(session: Session, jobs: list[PlannedJob]) -> tuple[int | None, str]:
    """vm.autostop for this pipeline (before.autostop_of): `auto` follows the stack's provisioning model (off with
    -H: unknown)."""
    return before.autostop_of(
        session.plan.spec.vm.autostop,
        (session.stack or {}).get("provisioning_model"),
        any(job.name.startswith(DURABLE_PREFIX) for job in jobs),
        before.GIVEN_HOST,
    )


def preflight_request(session: Session) -> dict:
    """What the VM must offer: the run's folders its user's alone before the first job (folders.py), then the
    chips, memory and the secrets before its first TPU job (preflight.py)."""
    vm_spec = session.plan.spec.vm
    return {
        "folders": dict(session.plan.folders),
        "chips": session.plan.accelerator.chips,
        "chip_glob": vm_spec.chip_glob,
        "min_memory_gb": vm_spec.min_memory_gb,
        "min_shm_gb": vm_spec.min_shm_gb,
        "shm_path": vm_spec.shm_path,
        # each secret given a value here; one left empty on purpose (no WANDB_API_KEY: W&B offline) is no lack
        "secrets": {name: f"{session.plan.layout.secrets}/{name}" for name, value in session.secrets.items() if value},
        **({"bucket": session.plan.durable_dir} if gcs.is_gcs(session.plan.durable_dir) else {}),
    }


def driver_plan(session: Session, jobs: list[PlannedJob], task: str) -> dict:
    """The plan as the driver reads it: `jobs` to bring to done, and the jobs they need, which must be done.

    Its digest covers what decides the work (run, jobs, specs, needs), so the same command
    again attaches to a running pipeline and any other is refused while it runs.
    """
    known = {job.name: job for job in session.plan.jobs} | {job.name: job for job in jobs}
    wanted, needed = [job.name for job in jobs], []
    for name in wanted:
        needed += [n for n in known[name].needs if n not in wanted and n not in needed]
    entries = [
        {
            "name": name,
            "job_dir": known[name].job_dir,
            "spec": dict(known[name].runner_spec),
            "needs": list(known[name].needs),
            "uses_tpu": known[name].uses_tpu,
            "start": name in wanted,
        }
        for name in needed + wanted
    ]
    body = {
        "run": session.plan.run_name,
        "jobs": entries,
        "preflight": preflight_request(session),
        "notify": receivers(session),
        # where the VM's shutdown script finds the pipeline to record a preemption: a VM's, never this machine's
        # (fab demo writes nothing outside its folder)
        "register_preemptions": not isinstance(getattr(session.vm, "conn", None), Here),
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    idle, why = autostop(session, jobs)
    return {
        **body,
        "digest": digest,
        "hint": session.hint(task),
        "started_by": owner(),
        "settings": list(session.overrides),  # the --args, kept with the run's plan on the VM (fab runs)
        "autostop": {
            "idle_seconds": idle,
            "why": why,
            "command": session.plan.spec.vm.autostop_command,
            # the durable copies' markers: one that held the model back (results.publish_if) keeps no copy
            "kept_by": [job.runner_spec["outputs"][0] for job in jobs if job.name.startswith(DURABLE_PREFIX)],
        },
    }


def receivers(session: Session) -> list[dict]:
    """results.notify as the driver reads it: names and kinds; the URLs stay in the VM's secrets folder."""
    found = []
    for entry in session.plan.spec.results.notify:
        name, _, kind = entry.partition(":")
        if f"{secrets.NOTIFY_PREFIX}{name}" in session.secrets:
            found.append({"name": name, "secret": f"{secrets.NOTIFY_PREFIX}{name}", "kind": kind})
    return found


def describe(record: dict) -> str:
    """A pipeline on the VM, in one line: run, state, since when, which jobs."""
    jobs = ", ".join(record.get("running") or []) or "between jobs"
    doing = f" ({jobs})" if record["state"] == PipelineState.RUNNING.value else ""
    return f"run {record['run']} {record['state']} since {clock(record.get('since'))}{doing}, started by {record.get('started_by') or '?'}"


def status_lines(record: dict | None) -> list[str]:
    """fab status's lines on the pipeline: its state, what failed, and the VM's autostop."""
    if record is None:
        return ["pipeline: none has run on this VM yet"]
    if "state" not in record:  # the driver could not be read or started
        return [f"pipeline: the VM's driver did not answer: {record.get('error', '?')[-300:]}"]
    lines = [f"pipeline: {describe(record)}"]
    if record["state"] == PipelineState.INTERRUPTED.value:
        lines.append("  its driver had stopped; this command started it again")
    for job, why in (record.get("failed") or {}).items():
        lines.append(f"  {job}: {why}")
    idle, shutdown = record.get("autostop_idle"), record.get("shutdown")
    if shutdown:
        outcome = "" if shutdown["exit_code"] == 0 else f", which failed: {shutdown['error'] or shutdown['exit_code']}"
        lines.append(f"  autostop: shut the VM down at {clock(shutdown['at'])}{outcome}")
    elif record["state"] in (PipelineState.DONE.value, PipelineState.STOPPED.value) and record.get("alive") and idle:
        lines.append(
            f"  autostop: the VM shuts itself down after {_duration(idle)} with no fab command "
            f"(this one started the wait again: at {clock(time.time() + idle)})"
        )
    elif not idle:
        lines.append(f"  autostop: {record.get('autostop_why') or 'off'}")
    for sent in record.get("notifications") or []:
        what = f"sent (HTTP {sent.get('status')})" if sent.get("ok") else f"not sent: {sent.get('error')}"
        lines.append(f"  notified {sent.get('to')} of {sent.get('event')} at {clock(sent.get('t'))}: {what}")
    return lines


def _duration(seconds: float) -> str:
    return (
        f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"
    )


def busy(record: dict, vm_name: str) -> UserError:
    return UserError(
        f"{vm_name} runs another pipeline: {describe(record)}. Follow it: {record.get('hint') or 'fab status'}; "
        "this one can start once it has ended"
    )


def run(session: Session, jobs: list[PlannedJob], task: str, detach: bool, prepare, progressed=None) -> None:
    """Bring `jobs` to done on the VM: start the driver or attach to it, then watch until the pipeline ends
    (`progressed()` told at each step train trains, as fab train --watch counts a recovery that got going)."""
    vm, console = session.vm, session.console
    plan = driver_plan(session, jobs, task)
    current = vm.pipeline
    running = current and current.get("alive") and current["state"] == PipelineState.RUNNING.value
    if running and current["digest"] != plan["digest"]:
        raise busy(current, vm.name)
    states = None if running else vm.states_read_ahead([job.job_dir for job in jobs])
    if not running and _nothing_to_do(session, jobs, plan, states):
        return
    if not running:
        starts = states and any(state.state not in (JobState.DONE, JobState.RUNNING) for state in states)
        # The Hub check when a job will start, or when the states are unread and it began while connecting:
        # the plan is then handed over once. States read decide: a command with nothing to start needs no token.
        if starts or states is None and session.token_check:
            session.check_token()
        prepare(session)  # the secrets, and the VM ready (its startup script done)
    with Board(console) as board:
        watcher = Watcher(session, jobs, board, progressed)
        # Handed over as "check first" while the token is unchecked (the install read no states): the driver
        # starts nothing then, and says what it would start; a no-op asks the Hub nothing.
        check_first = "HF_TOKEN" in session.secrets and not session.token_checked
        stream = vm.drive({**plan, "check_first": check_first}, follow=not detach, on_idle=watcher.tick)
        answer = next(stream)
        if "check-first" in answer:
            stream.close()
            session.check_token()
            stream = vm.drive(plan, follow=not detach, on_idle=watcher.tick)
            answer = next(stream)
        if "busy" in answer:
            raise busy(answer["busy"], vm.name)
        if "attached" in answer:
            console.print(f"attached to the pipeline on {vm.name}: {describe(answer['attached'])}")
        else:
            console.print(f"pipeline started on {vm.name}; it goes on without this laptop")
        session.record.machine = vm.identity  # a recreated VM of this identity carries the run on (tasks/common.py)
        session.record.booted = vm.facts.get("booted") or session.record.booted  # goodput's boot (a recovery's VM: its)
        settings = list(session.overrides)
        if session.record.estimate is None or session.record.settings != settings:  # what it was estimated to take
            stack = session.stack or {}
            names = {job.name for job in jobs}  # a probe, fab convert: the jobs that run, not the whole plan
            only = None if set(session.plan.names) <= names else names
            expected = estimate.estimate(
                session.plan, stack.get("provisioning_model"), stack.get("zone"), autostop(session, jobs), only
            )
            session.record.estimate = expected.to_dict()
        session.record.settings, session.record.chips = settings, session.plan.accelerator.chips
        own = session.plan.task  # the user's task, not the fab task this command runs
        session.record.task = {"name": own.name, "digest": own.digest, "files": own.digests}
        session.record.save()  # this machine's current run: what `fab train --recover` carries on on a new VM
        if detach:
            stream.close()
            console.print(f"watch it: {session.hint(task)}, or fab status")
            return
        _watch(session, watcher, stream, task)
    watcher.finish()


def _nothing_to_do(session: Session, jobs: list[PlannedJob], plan: dict, states: list[JobStatus] | None) -> bool:
    """A no-op in the install's one round trip: the VM's driver brought this very plan (its digest, its autostop)
    to done, and every job's outputs are still there as the install read them (`states`). Anything else is
    driven."""
    current, vm = session.vm.pipeline or {}, session.vm
    finished = (
        current.get("digest") == plan["digest"]
        and current.get("state") == PipelineState.DONE.value
        and current.get("autostop_idle") == plan["autostop"]["idle_seconds"]
        and current.get("autostop_why") == plan["autostop"]["why"]
        and current.get("autostop_command") == list(plan["autostop"]["command"])
    )
    if not finished or not states or any(state.state is not JobState.DONE for state in states):
        return False
    session.console.print(f"run {plan['run']} is done on {vm.name}: nothing to start")
    for job, state in zip(jobs, states, strict=True):
        session.console.print(f"{job.name}: done already (finished {clock(state.finished)}, outputs present)")
    with Board(session.console) as board:
        Watcher(session, jobs, board).finish()  # the eval table and the run's result, from the record
    return True


def _watch(session: Session, watcher: Watcher, stream, task: str) -> None:
    """Feed the watcher until the pipeline ends; a driver that died is started again and watched on."""
    revivals = 0
    try:
        while True:
            for item in stream:
                if item.get("event") == "driver-lost":
                    break
                if item.get("event") == "replaced":
                    raise UserError(
                        f"another fab command started a new pipeline on {session.vm.name}: {describe(item['record'])}"
                    )
                watcher.feed(item)
                if watcher.outcome is not None:
                    return
            else:
                raise UserError(
                    f"{session.vm.name}: the pipeline's events ended before it did; watch again: {session.hint(task)}"
                )
            revivals += 1
            if revivals > MAX_REVIVALS:
                raise UserError(
                    f"{session.vm.name}: the pipeline driver keeps stopping; see {session.plan.layout.pipeline}/driver.err on the VM"
                )
            session.console.print("the pipeline's driver stopped; starting it again (it adopts what runs)")
            session.vm.install()  # wakes it
            stream = session.vm.drive(None, on_idle=watcher.tick)
    except ConnectionLost:
        raise VmUnavailable(
            f"lost the connection to {session.vm.name} while watching",
            f". The pipeline goes on on the VM without this laptop; watch it again: {session.hint(task)}",
        ) from None
    except KeyboardInterrupt:
        raise StoppedWatching(
            f"stopped watching; the pipeline goes on on the VM without this laptop. Watch it again: {session.hint(task)}"
        ) from None
