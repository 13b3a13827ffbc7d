"""`fab demo`: the real pipeline on this machine's CPU, before paying for a VM (bootstrap/demo/ says how).

The same commands a VM runs, driven by the same driver and shown by the same display; only the machine differs
(vm/here.py) and what a CPU needs in the jobs (demo/rehearsal.py).
"""

from __future__ import annotations

import shutil
import sys
from datetime import UTC, datetime

from fabric import task

from ..errors import UserError
from .common import console, open_session, prepare, reports_errors

HELP = {
    "control": "train with a learning rate that changes no weight: the same run, no better, which the gate holds back",
    "run_name": "watch this demo run again (after Ctrl-C) instead of starting a new one",
    "clean": "stop what the demo runs and remove its folder",
}


@task(help=HELP)
@reports_errors
def demo(c, control=False, run_name=None, clean=False):
    """Try it before paying: the whole pipeline on this machine's CPU, a tiny model made visibly better, in minutes."""
    from ..demo import rehearsal

    if not sys.platform.startswith("linux"):
        raise UserError(
            f"fab demo runs the VM's own tools, which need Linux (this is {sys.platform}): run it in a Linux "
            "container or VM, e.g. docker run -it -v $PWD:/w -w /w python:3.12 bash"
        )
    folder = rehearsal.Folder.default()
    if clean:
        _clean(folder)
        return
    from ..paths import jobs_dir

    console.print(
        f"fab demo: your pipeline on this machine's CPU (no VM, no SSH, no token); everything in {folder.root}"
    )
    changes = rehearsal.write_jobs(jobs_dir(), folder)
    console.print(f"the jobs are yours ({jobs_dir()}), with what a CPU needs changed:")
    for change in changes:
        console.print(f"  {change}", markup=False, highlight=False)
    here = rehearsal.use(folder)
    kind = "control" if control else "grpo"
    name = run_name or f"demo-{kind}-{datetime.now(UTC).strftime('%Y-%m-%d-%H-%M-%S')}"
    args = rehearsal.overrides(folder, rehearsal.CONTROL_LEARNING_RATE if control else rehearsal.LEARNING_RATE)
    named = "given with --run-name" if run_name else f"a new demo run{' (the control)' if control else ''}"
    session = open_session(c, args, name, here=here, named=named, reads_states=True)
    session.command = ("fab", "demo", *(["--control"] if control else []))
    outside = [word for job in session.plan.rendered for word in [*job.argv, *job.env.values()] if "gs://" in word]
    if outside:  # a path the jobs' own files set beside the demo's folder: nothing leaves this machine
        raise UserError(f"the demo's jobs would use a bucket ({outside[0][:200]}): set that path with a ${{work_dir}}")
    _drive(session)
    _judge(session)
    from .results_tasks import show_runs, write_metrics

    write_metrics(session)
    show_runs(c, here=here, shared=tuple(rehearsal.shared_overrides(folder)))
    console.print(
        f"everything the demo made is in {folder.root}; fab demo --clean removes it. See its runs again: "
        "fab runs --demo, fab metrics --demo [--run-name RUN], fab tensorboard --demo"
    )


def demo_session(c, run_name: str | None):
    """A session on a demo run (`fab metrics --demo`, `fab tensorboard --demo`): this machine as the VM, the demo's
    jobs and runs, its current run unless `run_name` names another."""
    from ..demo import rehearsal

    folder = rehearsal.Folder.ran()
    return open_session(c, rehearsal.overrides(folder), run_name, here=rehearsal.use(folder), runs_jobs=False)


def demo_runs(c, json_: bool) -> None:
    """`fab runs --demo`: the demo's runs, as the demo's last table shows them."""
    from ..demo import rehearsal
    from .results_tasks import show_runs

    folder = rehearsal.Folder.ran()
    show_runs(c, json_, here=rehearsal.use(folder), shared=tuple(rehearsal.shared_overrides(folder)))


def _drive(session) -> None:
    """Every job of the demo's plan to done, watched as fab train watches a VM."""
    from ..vm import pipeline

    plan = session.plan
    pipeline.run(session, [plan.job(name) for name in plan.names], "demo", False, prepare)


def _judge(session) -> None:
    """The publish gate's verdict on the run, as results.publish_if would decide a Hub upload."""
    from ..remote import evals

    publish_if = session.plan.spec.results.publish_if
    held = evals.held_back(session.record.evals, publish_if)
    if held:
        console.print(f"the publish gate would hold this model back: {held}", markup=False, highlight=False)
    else:
        console.print(f"the publish gate (publish_if: {publish_if}) would publish this model", highlight=False)


def _clean(folder) -> None:
    from ..demo import rehearsal

    if not folder.root.exists():
        console.print(f"{folder.root}: nothing to remove")
        return
    if not (folder.root / rehearsal.MARKER).exists():
        raise UserError(f"{folder.root} is not a demo folder (no {rehearsal.MARKER} in it): left as it is")
    stopped = rehearsal.stop(folder)
    shutil.rmtree(folder.root)
    console.print(f"removed {folder.root}{f' (stopped {stopped} processes)' if stopped else ''}")
