"""What every task shares: the --arg option, turning problems into a clean exit, sessions."""

from __future__ import annotations

import functools
from collections.abc import Callable

from invoke import Context, Exit
from rich.console import Console

from .. import hosts, hub, pipeline_run, runs, secrets
from ..errors import UserError
from ..paths import jobs_dir
from ..pipeline_run import Session

ARG_HELP = "override a job setting: JOB.KEY=VALUE (repeatable), e.g. train.num_batches=100, vars.num_batches=100, convert.--lazy_load_tensors=True"
RUN_HELP = "work on this run (MaxText resumes a run name it has seen); default: the VM's current run"
console = Console()


def reports_errors(body: Callable) -> Callable:
    """Show a UserError as its message and exit 2; Ctrl-C says what goes on, without a traceback."""

    @functools.wraps(body)
    def wrapper(*args, **kwargs):
        try:
            return body(*args, **kwargs)
        except UserError as err:
            raise Exit(f"error: {err}".replace("\n", "\nerror: "), code=2) from None
        except KeyboardInterrupt:
            raise Exit(
                "\ninterrupted: anything started on the VM goes on. Run the same command again to carry on.", code=130
            ) from None

    return wrapper


def open_session(
    c: Context, overrides: list[str], run_name: str | None = None, new_run: bool = False, runs_jobs: bool = True
) -> Session:
    """Check everything local first, then connect; the run is chosen from the VM's record.

    Commands that start jobs (`runs_jobs`) also need the jobs' secrets, checked before connecting.
    """
    directory = jobs_dir()
    pipeline = pipeline_run.load_checked(directory, overrides)
    sources = {str(job.doc.path): job.spec.secrets for job in pipeline.jobs.values()}
    values = secrets.require(sources) if runs_jobs else {}
    if "HF_TOKEN" in values:
        console.print("checking the Hugging Face token")
        for line in hub.preflight(values["HF_TOKEN"], hub.base_model_of(pipeline), pipeline.spec.results.hub_repo):
            console.print(f"  {line}")
    console.print(f"connecting to the VM ({'-H' if hasattr(c, 'host') else 'Pulumi stack outputs'})")
    workers = hosts.workers(c, pipeline.spec.vm.state_dir)
    for worker in workers:
        worker.install_scripts()
    name, why = pipeline_run.choose_run(workers, run_name, new_run)
    console.print(f"run {name} ({why}) on {', '.join(w.name for w in workers)}")
    record = runs.RunRecord.load(name)
    return Session(directory, overrides, pipeline.spec, workers, record, console, values, hub.base_model_of(pipeline))


def prepare(session: Session) -> None:
    """Inside the lock: the run and secrets on every worker, and the VM ready."""
    pipeline_run.record_current_run(session)
    for worker in session.workers:
        for name, value in session.secrets.items():
            if worker.put_secret(name, value):
                console.print(f"{worker.name}: stored {name} (readable only by the SSH user)")
    pipeline_run.wait_for_startup(session)
