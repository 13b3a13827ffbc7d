"""Offline tasks: show and check the pipeline without contacting anything."""

from __future__ import annotations

import json
import subprocess
import sys

from fabric import task

from .. import runs
from ..jobs import DEFERRED, render
from ..paths import REPO, jobs_dir
from ..pipeline_run import load_checked
from ..plan import plan_dict, plan_text
from .common import ARG_HELP, RUN_HELP, console, reports_errors


@task(iterable=["arg"], help={"arg": ARG_HELP, "json": "print JSON for scripts", "run_name": RUN_HELP})
@reports_errors
def plan(c, arg=None, json_=False, run_name=None):
    """Print the whole pipeline as it would run (offline: no SSH, no cloud, no Pulumi)."""
    name = run_name or runs.current_run()
    rendered = render(load_checked(jobs_dir(), arg or [], name))
    record = runs.RunRecord.load(name) if name else None
    if json_:
        print(json.dumps(plan_dict(rendered, name, record), indent=1))
    else:
        print(plan_text(rendered, name, record))


@task(iterable=["arg"], help={"arg": ARG_HELP, "python": "a Python 3.12 with maxtext importable"})
@reports_errors
def check(c, arg=None, python="python3"):
    """Run MaxText's own validator on every job's arguments (needs maxtext, not a TPU)."""
    rendered = render(load_checked(jobs_dir(), arg or [], runs.current_run() or "check"))
    failed = 0
    for job in rendered:
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
