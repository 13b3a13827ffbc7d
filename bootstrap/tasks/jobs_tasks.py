"""Offline tasks: show and check the pipeline without contacting anything.

Each imports what it needs inside it (tasks/common.py says why).
"""

from __future__ import annotations

import json
import subprocess
import sys

from fabric import Connection, task

from ..errors import UserError
from ..paths import REPO, jobs_dir
from .common import ARG_HELP, RUN_HELP, console, gke_session, reports_errors

NEW_RUN = "new-run"  # the run name `fab plan --stack` shows before a run exists


@task(
    iterable=["arg"],
    help={
        "arg": ARG_HELP,
        "json": "print JSON for scripts",
        "run_name": RUN_HELP,
        "stack": "render for this Pulumi stack's backend, read from Pulumi.STACK.yaml (a gke stack: JobSets)",
    },
)
@reports_errors
def plan(c, arg=None, json_=False, run_name=None, stack=None):
    """Print the whole pipeline as it would run (offline: no SSH, no cloud, no Pulumi CLI)."""
    import yaml

    from .. import secrets
    from ..jobs import before, load, task_check
    from ..jobs.load import DEFAULT_USER
    from ..jobs.plan import PLACEHOLDER_RUN, build, check_local, check_run_name
    from ..jobs.show import plan_dict, plan_text
    from ..results import runs
    from ..results.publish import durable_overrides

    files = load.read(jobs_dir())
    pipeline = check_local(files, arg or [])
    task_check.check(pipeline.task)  # its local rows and rewards: offline, as the rest of the plan
    name = check_run_name(run_name) if run_name is not None else runs.current_run()
    # -H's user (a Connection's); else the stack's; else tpu-rl:sshUser's default (never this laptop's login)
    user = c.user if isinstance(c, Connection) else None
    whose = (
        f"{user}, -H's" if user else f"{DEFAULT_USER}, tpu-rl:sshUser's default (--stack STACK or -H USER@HOST: theirs)"
    )
    machine_type = provisioning = zone = None
    if stack:
        from ..gke.stack import read, slice_of  # the Pulumi SDK takes a tenth of a second to import: only here

        settings = read(stack)
        if pipeline.spec.results.gcs == "stack" and not settings.results_bucket:
            why = f"'stack', but Pulumi.{stack}.yaml sets no tpu-rl:resultsBucket: set one, or give gs://BUCKET/PREFIX"
            raise UserError([pipeline.doc.origin("results", "gcs").problem("results.gcs", why)])
        target = slice_of(settings, pipeline.spec)
        if target:
            merged = gke_session().overrides(files, target, arg or [])
            manifests = [
                dict(job.runner_spec) for job in gke_session().plan(files, merged, name or NEW_RUN, target).jobs
            ]
            if json_:
                print(json.dumps(manifests, indent=1))
            else:
                note = f"# a new run: {NEW_RUN!r} stands for the name fab train gives it\n" if not name else ""
                print(note + yaml.safe_dump_all(manifests, sort_keys=False))
            return
        if not user:
            user, whose = settings.ssh_user, f"{settings.ssh_user}, Pulumi.{stack}.yaml's tpu-rl:sshUser"
        machine_type, provisioning, zone = settings.machine_type, settings.provisioning_model, settings.zone
    durable = durable_overrides(pipeline.spec, None, offline=True)
    built = build(files, [*durable, *(arg or [])], name or PLACEHOLDER_RUN, user, machine_type)
    record = runs.RunRecord.load(name) if name else None
    from ..results.estimate import estimate

    kept = bool(built.spec.results.hub_repo or built.spec.results.gcs)
    unknown = before.GIVEN_HOST if isinstance(c, Connection) else "no stack read: pass --stack STACK"
    idle = before.autostop_of(built.spec.vm.autostop, provisioning, kept, unknown)
    expected = estimate(built, provisioning, zone, idle)
    present = set(secrets.here(pipeline.spec.results.notify))
    notes = before.notes(built, whose, provisioning, present, given_host=isinstance(c, Connection))
    notes += task_check.size_notes(built)
    print(
        json.dumps(plan_dict(built, record, expected.to_dict(), notes, present), indent=1)
        if json_
        else plan_text(built, record, expected.lines(), notes, present)
    )


@task(iterable=["arg"], help={"arg": ARG_HELP, "python": "a Python 3.12 with maxtext importable"})
@reports_errors
def check(c, arg=None, python="python3"):
    """Run MaxText's own validator on every job's arguments (needs maxtext, not a TPU)."""
    from ..jobs import load
    from ..jobs.plan import build, check_local, validation_args
    from ..results import runs

    files = load.read(jobs_dir())
    check_local(files, arg or [])
    built = build(files, arg or [], runs.current_run() or "check")
    _require_maxtext(python, built.maxtext_version)
    words = validation_args(built.rendered)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    script = REPO / "bootstrap" / "remote" / "maxtext_check.py"
    columns = (SpinnerColumn(), TextColumn("checking every job with MaxText's own validator"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        progress.add_task("validate", total=None)
        result = subprocess.run([python, str(script), *words], capture_output=True, text=True)
    console.print(result.stdout.strip() or result.stderr.strip()[-500:], markup=False, highlight=False)
    if result.returncode != 0:
        sys.exit(2)


def _require_maxtext(python: str, version: str) -> None:
    """The validator's Python has the maxtext the jobs install (found in milliseconds, before MaxText's
    import, half a minute on 2 cores): another version's validator would judge the jobs by other keys."""
    build_one = (
        f'a Python 3.12 with maxtext {version} is built by: fab check --python "$(python '
        f'scripts/maxtext_config_env.py {version})"'
    )
    if not python:
        raise UserError(f"--python is empty (did the command that should give it fail?); {build_one}")
    probe = (
        "import importlib.metadata as m, importlib.util as u; print(u.find_spec('maxtext') and m.version('maxtext'))"
    )
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError as err:
        raise UserError(f"--python {python}: {err.strerror or err}; {build_one}") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"--python {python}: did not answer in 60 s; {build_one}") from None
    if found in ("", "None"):
        raise UserError(f"--python {python}: cannot import maxtext; {build_one}")
    if found != version:
        raise UserError(f"--python {python}: has maxtext {found}, the jobs install {version}; {build_one}")


@task(name="token")
@reports_errors
def check_token(c):
    """Check the Hugging Face token with the Hub now, no VM needed: valid, can read the base model, can write
    results.hub_repo (what fab train checks before it starts anything); with a task of your own, cache the base
    model's tokenizer, which fab plan counts the task's prompts with."""
    from .. import secrets
    from ..jobs import load
    from ..jobs.check import base_model_of
    from ..jobs.plan import check_local
    from ..results import hub

    pipeline = check_local(load.read(jobs_dir()), [])
    token = secrets.require({"this machine": ["HF_TOKEN"]})["HF_TOKEN"]
    base_model = base_model_of(pipeline)
    for line in hub.preflight(token, base_model, pipeline.spec.results.hub_repo):
        console.print(line, markup=False, highlight=False)
    if not pipeline.task.builtin:  # fab plan counts the task's prompts with it (offline, from the cache)
        console.print(hub.fetch_tokenizer(token, base_model), markup=False, highlight=False)
