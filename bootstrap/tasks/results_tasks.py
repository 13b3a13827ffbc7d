"""Tasks that bring results home: metrics, plots and the exported model.

Each imports what it needs inside it (tasks/common.py says why).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fabric import Connection, task

from .. import secrets
from ..errors import UserError
from .common import ARG_HELP, RUN_HELP, console, number, open_session, prepare, reports_errors

if TYPE_CHECKING:
    from ..jobs import load
    from ..jobs.plan import Plan
    from ..session import Session


DEMO_HELP = "fab demo's runs, on this machine, instead of the VM's"


def _session(c, arg, run_name, demo: bool) -> Session:
    """The session of a command that reads a run: the VM's, or with `demo` fab demo's on this machine."""
    if demo:
        if arg:
            raise UserError("--demo reads the demo's runs as fab demo ran them: leave out --arg")
        from .demo_tasks import demo_session

        return demo_session(c, run_name)
    return open_session(c, arg or [], run_name, runs_jobs=False)


@task(name="metrics", iterable=["arg"], help={"arg": ARG_HELP, "run_name": RUN_HELP, "demo": DEMO_HELP})
@reports_errors
def fetch_metrics(c, arg=None, run_name=None, demo=False):
    """Copy the run's training metrics from the VM; write CSV, a PNG plot and a summary locally."""
    write_metrics(_session(c, arg, run_name, demo))


def write_metrics(session: Session) -> None:
    """fab metrics of the session's run: its events and records copied here, then CSV, PNG and a summary."""
    from ..remote import attempts, preempted
    from ..results import goodput, metrics, runs  # matplotlib and TensorBoard take half a second to import: only here

    train = next((job for job in session.plan.rendered if job.progress), None)
    if train is None:
        raise UserError("the pipeline has no job with progress.tensorboard_dir: nothing to read")
    record, folder = session.record, session.record.folder
    events, source = folder / "tensorboard", train.progress["tensorboard_dir"]
    console.print(f"copying event files from {session.vm.where(source)}")
    session.vm.download(source, events)
    starts, identity = [], None
    if records := train.env.get(attempts.DIR_ENV):
        console.print(f"reading the records of train's starts in {session.vm.where(records)}")
        session.vm.download(records, folder / "attempts", required=False)
        starts = attempts.parse([path.read_text(errors="replace") for path in (folder / "attempts").glob("*.json")])
        identity = attempts.run_identity([path.name for path in (folder / "attempts").glob("*.json")])
    preemptions = []
    if records := preempted.folder_of(train.env):
        session.vm.download(records, folder / "preemptions", required=False)
        preemptions = [json.loads(path.read_text()) for path in sorted((folder / "preemptions").glob("*.json"))]
    series = metrics.read_events(events)
    metrics.write_csv(series, folder / "metrics.csv")
    metrics.write_evals_csv(record.evals, folder / "evals.csv")
    (folder / "jobs.json").write_text(json.dumps([job.to_dict() for job in session.plan.rendered], indent=1))
    losses = metrics.loss_cost(metrics.attempts(events, starts))
    costed = metrics.preemption_cost(preemptions, losses, record.chips or session.plan.accelerator.chips)
    counted = {"attempts": max(1, losses["attempts"]), "steps_redone": losses["steps_redone"]}
    if record.timing is None or costed != record.preemptions or counted != record.train_losses:
        record.preemptions, record.train_losses = costed, counted
        if record.timing is None:  # a run no fab command watched to its end: from train's log on the VM
            record.timing = _timing(session, train)
        record.save()
    ledger = goodput.measured(record, goodput.boot_of(record, runs.all_records([])))
    summary = metrics.summarize(record, folder / "summary.json", losses, series, ledger)
    metrics.plot(series, record.evals, folder / "metrics.png", f"run {record.name}", ledger)
    steps = max((max(v) for v in series.values() if v), default=0)
    console.print(f"{len(series)} metrics over {steps} steps, {len(record.evals)} evals")
    if losses["attempts"] > 1:
        resumed = ", ".join(f"step {step}" for step in losses["resumed_from"][1:] if step is not None)
        console.print(
            f"train started {losses['attempts']} times{f' (resumed from {resumed})' if resumed else ''}: the losses "
            f"cost at least {losses['steps_redone']} steps trained again ({losses['minutes_redone']:.1f} min) and "
            f"{losses['minutes_restarting']:.1f} min of starting again"
        )
    if record.preemptions:
        console.print(metrics.preemption_line(record.preemptions), markup=False, highlight=False)
    if summary["time_split"]:
        console.print(f"train's time: {metrics.split_line(summary['time_split'])}", markup=False, highlight=False)
    if ledger is not None:
        console.print(ledger.line(), markup=False, highlight=False)
    if summary["result"]:
        console.print(f"result: {summary['result']['line']}", markup=False, highlight=False)
    for warning in summary["warnings"]:
        console.print(f"warning: {warning}", markup=False, highlight=False)
    for name in ("metrics.csv", "evals.csv", "metrics.png", "summary.json", "jobs.json"):
        console.print(f"  {folder / name}")
    if uri := session.plan.spec.results.mlflow:
        _log_to_mlflow(uri, session, train, identity, series, summary)


def _log_to_mlflow(
    uri: str, session: Session, train: load.RenderedJob, identity: str | None, series: dict, summary: dict
) -> None:
    """The numbers just written, logged to results.mlflow as the run `identity` names (none before train's first
    start); a server that fails is said, and fab metrics tries again."""
    from ..results import mlflow_log

    plan = session.plan
    if identity is None:
        console.print("MLflow: not logged (train has not started yet); fab metrics logs it", highlight=False)
        return
    params = {"run": plan.run_name, "model": plan.base_model or "", "maxtext": plan.maxtext_version}
    params |= {f"train.{k}": v for k, _, v in (word.partition("=") for word in train.argv[3:]) if v}
    try:
        page = mlflow_log.log_run(uri, plan.run_name, identity, params, series, summary)
    except mlflow_log.MlflowError as err:
        console.print(f"MLflow: not logged ({err}); fab metrics logs it again", markup=False, highlight=False)
        return
    console.print(f"MLflow: run {plan.run_name} logged, {page}", markup=False, highlight=False)


@task(
    iterable=["arg"],
    help={
        "arg": ARG_HELP,
        "run_name": RUN_HELP,
        "port": "the port on 127.0.0.1 (default: a free one)",
        "every": "seconds between copies of the run's new events (default 30)",
        "demo": DEMO_HELP,
    },
)
@reports_errors
def tensorboard(c, arg=None, run_name=None, port=None, every=None, demo=False):
    """TensorBoard here over every run's events, the run's copied from the VM as train writes them; Ctrl-C ends it."""
    every, port = number(every, "--every", 30, float, 0.1, 24 * 3600), number(port, "--port", 0, most=65535)
    session = _session(c, arg, run_name, demo)
    from ..paths import runs_dir
    from ..results import board
    from ..vm.machine import Vm

    if not isinstance(session.vm, Vm):
        raise UserError(
            "fab tensorboard reads the vm backend's VM; on gke, fab metrics copies the events from the bucket"
        )

    train = next((job for job in session.plan.rendered if job.progress), None)
    if train is None:
        raise UserError("the pipeline has no job with progress.tensorboard_dir: nothing to read")
    source, local = train.progress["tensorboard_dir"], session.record.folder / "tensorboard"

    def copy() -> None:
        try:
            board.sync(session.vm, session.vm.readable(source), local)
        except UserError as err:  # a VM that stopped or went: what was copied is still served
            console.print(f"not copied this time ({secrets.redact(str(err))}); serving what is here", highlight=False)

    copy()
    served = board.TensorBoard(runs_dir(), port)
    console.print(f"TensorBoard at {served.url} over every run in {runs_dir()}", highlight=False)
    console.print(f"copying {session.vm.where(source)} every {every} s; Ctrl-C ends it", highlight=False)
    try:
        board.serve(served.process, copy, every)
        raise UserError(f"TensorBoard stopped (exit {served.process.returncode})")
    except KeyboardInterrupt:
        console.print("\nTensorBoard stopped")
    finally:
        served.stop()


@task(iterable=["arg"], help={"dest": "local folder (default runs/<run>/model)", "arg": ARG_HELP, "run_name": RUN_HELP})
@reports_errors
def download(c, dest=None, arg=None, run_name=None):
    """Copy the exported model from the VM to this machine (resumable; every file verified by SHA-256)."""
    session = open_session(c, arg or [], run_name, runs_jobs=False)
    remote = session.plan.export_folder()
    local = Path(dest) if dest else session.record.folder / "model"
    console.print(f"downloading {session.vm.where(remote)} to {local}")
    files = session.vm.download_verified(
        remote,
        local,
        lambda path, size: console.print(f"  {path} ({size / 2**20:.1f} MiB)"),
        made_by=session.plan.job("export").job_dir,
    )
    console.print(f"{len(files)} files, {sum(files.values()) / 2**30:.2f} GiB, SHA-256 verified: {local}")


@task(iterable=["arg"], help={"arg": ARG_HELP, "run_name": RUN_HELP})
@reports_errors
def publish(c, arg=None, run_name=None):
    """Upload the run's model to results.hub_repo although results.publish_if held it back (the Hub check first)."""
    session = open_session(c, arg or [], run_name)
    from ..results.publish import hub_job, report
    from ..vm import pipeline
    from ..vm.machine import Vm

    plan = session.plan
    if not plan.spec.results.hub_repo:
        raise UserError("results.hub_repo is not set in jobs/pipeline.yaml: there is no Hub repository to publish to")
    if not isinstance(session.vm, Vm):
        raise UserError("fab publish drives a VM; on gke set results.publish_if: always and run fab train")
    job = hub_job(plan, plan.export_folder(), publish_if="always")
    marker = job.runner_spec["outputs"][0]
    if held := session.vm.read_json(marker).get("held"):
        console.print(f"publishing {plan.run_name} to {plan.spec.results.hub_repo} although it was held back ({held})")
        session.vm.check(f"rm -f {shlex.quote(marker)}", "forgetting that the upload was held back")
    pipeline.run(session, [job], "publish", False, prepare)
    session.record.results.update(report(plan, [job], console.print, session.vm.read_json))
    session.record.save()


@task(name="runs", help={"json_": "print JSON (one object a run) instead of a table", "demo": DEMO_HELP})
@reports_errors
def list_runs(c, json_=False, demo=False):
    """This stack's runs side by side, from this machine's records, the VM and its bucket: settings, before -> after
    accuracy, chip-hours, where the model is."""
    if demo:
        from .demo_tasks import demo_runs

        demo_runs(c, json_)
        return
    show_runs(c, json_)


def show_runs(c, json_: bool = False, here: dict[str, str] | None = None, shared: tuple[str, ...] = ()) -> None:
    """fab runs; with `here` (its commands' environment), of this machine as the VM, and the `shared` settings of
    its runs said once above the table rather than in each row (fab demo)."""
    from rich.table import Table

    from ..jobs import load
    from ..paths import jobs_dir, runs_dir
    from ..results import runs, side_by_side

    say = (lambda text: print(text, file=sys.stderr)) if json_ else console.print
    files = load.read(jobs_dir())
    try:
        found, host, now, chips = _listed(c, files, say, here)
    except UserError as err:  # no stack, a stopped VM, no connection: this machine's records still are a list
        say(f"the VM and its bucket were not read: {secrets.redact(str(err))}")
        found, host, now, chips = None, "", lambda run, settings: None, 0
    if found and found.get("bucket_error"):
        say(f"the bucket was not read: {found['bucket_error']}")
    damaged: list[str] = []
    rows = side_by_side.rows(runs.all_records(damaged), found, now, chips, host)
    for line in damaged:
        say(f"left out: {line}")
    if json_:
        print(json.dumps(rows, indent=1))
        return
    if not rows:
        console.print(f"no runs recorded in {runs_dir()}{f' or on {host}' if host else ''} yet: fab train starts one")
        return
    if shared:
        console.print(f"each run's settings below leave out the {len(shared)} that every one of them has")
    table = Table(title=f"runs recorded in {runs_dir()}{f', on {host} and in its bucket' if host else ''}")
    columns = (
        "run",
        "known",
        "started",
        "state",
        "settings",
        "measure",
        "format %",
        "reward",
        "took, chip-h (est.)",
        "model",
    )
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["run"],
            ", ".join(row["known"]),
            row["started"] or "-",
            row["state"] + (_stop_cell(row["stopped"]) if row.get("stopped") else ""),
            "(unknown)"
            if row["settings"] is None
            else "\n".join(s for s in row["settings"] if s not in shared) or "(defaults)",
            _pair(row["accuracy"], ".1f")
            + ("" if row["measure"] in (None, "GSM8K accuracy") else f"\n{row['measure']}"),
            _pair(row["format_accuracy"], ".0f"),
            f"{row['mean_reward']:.3f}" if row["mean_reward"] is not None else "-",
            _against_estimate(row),
            "\n".join(row["kept"].values()) or ("-" if found else "VM only"),
        )
    console.print(table)


def _timing(session, train) -> dict | None:
    """Where train's time went (results/timing.py), from its log's last attempt on the VM; None before 2 steps."""
    from ..remote import jobrunner
    from ..results import estimate, timing

    planned = next(job for job in session.plan.jobs if job.name == train.name)
    text = session.vm.read_text(f"{planned.job_dir}/{jobrunner.LOG}")
    split = timing.from_log(text) if text else None
    return estimate.measured(split, train, session.plan) if split else None


def _stop_cell(stopped: dict) -> str:
    """fab runs' word on a run a health rule stopped: the rule, the step, what it saved."""
    saved = f"; saved {stopped['saved_chip_hours']:.2f} chip-h of the estimate" if stopped["saved_chip_hours"] else ""
    return f"\nstopped at step {stopped['step']} by health.{stopped['rule']}{saved}"


def _against_estimate(row: dict) -> str:
    """fab runs' time cell: what the run took and its chip-hours, and under them what fab estimated."""
    from ..results.estimate import duration, fell, span

    vms = f" on {row['vms']} VMs" if row.get("vms", 1) > 1 else ""  # each billed while it ran
    spent = row.get("goodput") or {}
    cell = "\n".join(
        [
            *([duration(row["took_s"]) + vms] if row["took_s"] is not None else []),
            *([f"{row['chip_hours']:.2f} chip-h paid"] if row["chip_hours"] is not None else []),
            *([f"goodput {spent['share']:.0%}"] if spent.get("share") is not None else []),
        ]
    )
    if preempted := row.get("preemptions"):
        steps = ", ".join(str(p["committed_step"]) if p.get("committed_step") is not None else "-" for p in preempted)
        costed = [p["lost_chip_hours"] for p in preempted if p.get("lost_chip_hours") is not None]
        lost = f"{sum(costed):.2f} chip-h lost" if len(costed) == len(preempted) else "fab metrics counts the cost"
        cell += f"\npreempted at step {steps}: {lost}"
    if expected := row["estimate"]:
        done = row["state"] == "done" and row["took_s"]  # a failed or unfinished run's span is no measure
        where = f": {fell(row['took_s'], expected['low_s'], expected['high_s'])}" if done else ""
        cell += f"\n(est. {span(expected['low_s'], expected['high_s'])}{where}"
        cell += (
            f"; goodput ~{expected['goodput']['share']:.0%})" if (expected.get("goodput") or {}).get("share") else ")"
        )
    return cell or "-"


def _listed(c, files: load.JobFiles, say, here: dict[str, str] | None) -> tuple[dict, str, Callable, int]:
    """What the VM (this machine, with `here`) and its bucket hold of every run, in one round trip (the install's,
    with current tools); the VM's name; what jobs/ renders now for a run and its --args (None: it no longer
    renders); its chips."""
    from ..jobs import load
    from ..jobs.plan import build
    from ..remote.jobrunner import Layout
    from ..results import side_by_side
    from ..results.publish import durable_overrides
    from ..vm import connect
    from ..vm.here import Here
    from ..vm.machine import Vm

    outputs = None if here is not None or isinstance(c, Connection) else connect.stack_outputs()
    if outputs and outputs.get("backend") == "gke":
        raise UserError("a gke stack: fab runs reads the vm backend's VM and bucket only")
    spec = load.resolve(files, []).spec
    durable = durable_overrides(spec, outputs)
    conn = Here(here) if here is not None else connect.connection(c, say, outputs)
    vm = Vm(conn if here is not None else connect.open_connection(conn, outputs), Layout(spec.vm.state_dir))
    machine_type = (outputs or {}).get("machine_type")
    placed = build(files, durable, user=conn.user, machine_type=machine_type)
    request = side_by_side.request(placed, outputs)
    vm.install(runs=request)

    def now(run: str, settings: list[str]) -> Plan | None:
        try:
            return build(files, [*durable, *settings], run, conn.user, machine_type)
        except UserError:
            return None

    return vm.runs(request), vm.name, now, placed.accelerator.chips


def _pair(values: list[float] | None, form: str) -> str:
    return f"{values[0]:{form}} -> {values[1]:{form}}" if values else "-"
