"""Offline tasks: show and check the pipeline without contacting anything."""

from __future__ import annotations

import json
import subprocess
import sys

from fabric import task

from ..jobs import load
from ..jobs.load import DEFERRED
from ..jobs.plan import PLACEHOLDER_RUN, build, check_local, check_run_name
from ..jobs.show import plan_dict, plan_text
from ..paths import REPO, jobs_dir
from ..results import runs
from .common import ARG_HELP, RUN_HELP, console, reports_errors


@task(iterable=["arg"], help={"arg": ARG_HELP, "json": "print JSON for scripts", "run_name": RUN_HELP})
@reports_errors
def plan(c, arg=None, json_=False, run_name=None):
    """Print the whole pipeline as it would run (offline: no SSH, no cloud, no Pulumi)."""
    files = load.read(jobs_dir())
    check_local(files, arg or [])
    name = check_run_name(run_name) if run_name is not None else runs.current_run()
    built = build(files, arg or [], name or PLACEHOLDER_RUN)
    record = runs.RunRecord.load(name) if name else None
    print(json.dumps(plan_dict(built, record), indent=1) if json_ else plan_text(built, record))


@task(iterable=["arg"], help={"arg": ARG_HELP, "python": "a Python 3.12 with maxtext importable"})
@reports_errors
def check(c, arg=None, python="python3"):
    """Run MaxText's own validator on every job's arguments (needs maxtext, not a TPU)."""
    files = load.read(jobs_dir())
    check_local(files, arg or [])
    failed = 0
    for job in build(files, arg or [], runs.current_run() or "check").rendered:
        if job.module is None:
            continue
        args = [DEFERRED.sub("0", a) for a in job.argv[3:]]
        console.print(f"{job.name}: checking with MaxText's validator ...")
        result = subprocess.run(
            [python, str(REPO / "bootstrap" / "remote" / "maxtext_check.py"), job.module, *args],
            capture_output=True,
            text=True,
        )
        console.print(
            f"{job.name}: {result.stdout.strip() or result.stderr.strip()[-500:]}", markup=False, highlight=False
        )
        failed += result.returncode != 0
    if failed:
        sys.exit(2)
