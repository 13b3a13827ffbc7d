"""Run the pipeline on the VM: setup, then each job, skipping what is done.

Each job runs detached on every worker (vm.Worker.launch), so closing the laptop
loses nothing: the next command re-attaches to a running job, skips a done one
(its outputs re-checked), and retries a failed or interrupted one. One command
at a time holds the VM's lock.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shlex
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.console import Console

from . import environment, jobcheck, runs, secrets
from .errors import UserError
from .jobs import Pipeline, RenderedJob, load_pipeline, render
from .progress import JobProgress, eval_table
from .spec import PipelineSpec
from .vm import Worker

STARTUP_WAIT_SECONDS = 30 * 60
LOG_TAIL_LINES = 30


@dataclass
class Session:
    """Everything one fab command needs: the checked jobs, the workers, the run."""

    directory: Path
    overrides: list[str]
    spec: PipelineSpec
    workers: list[Worker]
    run: runs.RunRecord
    console: Console
    secrets: dict[str, str]
    base_model: str | None = None  # the Hugging Face repo the model is converted from
    preflight_done: bool = False

    @property
    def state_dir(self) -> str:
        return self.workers[0].state_dir

    @property
    def secrets_dir(self) -> str:
        return f"{self.state_dir}/secrets"

    def runner_spec(self, module: str, argv: list[str], outputs: list[str], env=None, secrets=(), **extra) -> dict:
        """What jobrunner.py reads from spec.json: the command, its environment, what decides done."""
        return {
            "module": module,
            "argv": argv,
            "env": env or {},
            "secrets": list(secrets),
            "secrets_dir": self.secrets_dir,
            "outputs": outputs,
            "cwd": "~",
            **extra,
        }

    def job_dir(self, job: RenderedJob) -> str:
        """A job that depends on the run lives in the run; one that does not (convert) is shared
        by runs with the same command, so a new run never converts, or overwrites, it again."""
        spec = json.dumps([job.argv, job.env, job.outputs])
        if self.run.name in spec:
            return f"{self.state_dir}/runs/{self.run.name}/{job.name}"
        return f"{self.state_dir}/shared/{job.name}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"

    def rendered(self, worker: Worker) -> dict[str, RenderedJob]:
        hostnames = ",".join(w.name for w in self.workers) if len(self.workers) > 1 else "localhost"
        provided = {"run_name": self.run.name, "worker_id": str(worker.index), "worker_hostnames": hostnames}
        return {job.name: job for job in render(load_pipeline(self.directory, self.overrides, provided))}


def load_checked(directory: Path, overrides: list[str], run_name: str | None = None) -> Pipeline:
    """Load jobs/ and run the local MaxText check: every problem, before anything is contacted."""
    pipeline = load_pipeline(directory, overrides, {"run_name": run_name} if run_name else None)
    problems = jobcheck.check_pipeline(pipeline)
    if problems:
        raise UserError(problems)
    return pipeline


def owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since {datetime.now().strftime('%H:%M:%S')}"


def choose_run(workers: list[Worker], requested: str | None, new: bool) -> tuple[str, str]:
    """The run to work on and why: asked for, the VM's current one, or a new one."""
    if requested:
        return requested, "given with --run-name"
    if not new:
        current = workers[0].run(f"cat {shlex.quote(workers[0].state_dir)}/current-run 2>/dev/null").stdout.strip()
        if current:
            return current, "the VM's current run"
    return runs.new_run_name(), "a new run"


def record_current_run(session: Session) -> None:
    for worker in session.workers:
        worker.check(
            f"mkdir -p {shlex.quote(worker.state_dir)} && printf '%s\\n' {shlex.quote(session.run.name)} > {shlex.quote(worker.state_dir)}/current-run",
            "recording the run",
        )


def wait_for_startup(session: Session) -> None:
    """Wait for the startup script's marker on every worker, showing its log meanwhile."""
    vm = session.spec.vm
    for worker in session.workers:
        offset, deadline = 0, time.monotonic() + STARTUP_WAIT_SECONDS
        while worker.run(f"test -f {shlex.quote(vm.startup_marker)}").failed:
            if offset == 0:
                session.console.print(f"{worker.name}: waiting for the startup script ({vm.startup_marker})")
            output = worker.run(f"tail -c +{offset + 1} {shlex.quote(vm.startup_log)} 2>/dev/null").stdout
            offset += len(output.encode())
            for line in output.splitlines():
                session.console.print(f"  startup | {line}", markup=False, highlight=False)
            if time.monotonic() > deadline:
                raise UserError(
                    f"{worker.name}: the startup script did not finish in {STARTUP_WAIT_SECONDS // 60} min; see {vm.startup_log}"
                )
            time.sleep(5)


def setup_spec(session: Session) -> tuple[str, dict]:
    env = session.spec.environment
    job_dir = f"{session.state_dir}/setup/{environment.digest(env)}"
    ready = f"{job_dir}/ready"
    argv = ["bash", "-c", environment.setup_script(env, ready)]
    return job_dir, session.runner_spec("setup", argv, [ready, f"{env.venv_path}/bin/python"])


def job_spec(session: Session, job: RenderedJob) -> dict:
    validate = [f"{session.state_dir}/bin/maxtext_check.py", job.module] if session.spec.vm.validate_args else None
    return session.runner_spec(
        job.module, job.argv, job.outputs, job.env, job.secrets, cwd=job.cwd, validate=validate, progress=job.progress
    )


def preflight(session: Session) -> None:
    """Check every worker once per command, just before the first job starts."""
    if session.preflight_done:
        return
    vm = session.spec.vm
    request = {
        "chips": vm.chips,
        "chip_glob": vm.chip_glob,
        "min_memory_gb": vm.min_memory_gb,
        "min_shm_gb": vm.min_shm_gb,
        "shm_path": vm.shm_path,
        "secrets": {name: f"{session.secrets_dir}/{name}" for name in session.secrets},
    }
    failures = []
    for worker in session.workers:
        result = worker.tool("preflight", stdin=json.dumps(request))
        try:
            checks = json.loads(result.stdout)
        except json.JSONDecodeError:
            raise UserError(f"{worker.name}: preflight could not run: {result.stderr.strip()[-300:]}") from None
        for check in checks:
            if not check["ok"]:
                failures.append(f"{worker.name}: preflight {check['check']}: {check['message']}")
            elif "removed" in check["message"]:
                session.console.print(f"{worker.name}: {check['message']}")
    if failures:
        raise UserError(failures)
    session.preflight_done = True
    session.console.print(f"preflight ok on {len(session.workers)} worker(s)")


class Stage:
    """One job (or the setup) across all workers: its state, and how to run it to done."""

    def __init__(
        self, session: Session, name: str, job_dir: str, specs: list[dict], before_start=lambda: None, target=""
    ):
        self.session, self.name, self.job_dir, self.specs = session, name, job_dir, specs
        self.before_start = before_start  # runs only when the stage has to start (not when done or running)
        self.target = target  # where a publish stage puts the model

    def states(self) -> list[dict]:
        return [w.job_states([self.job_dir])[0] for w in self.session.workers]

    def run(self) -> dict:
        """Bring the stage to done; return worker 0's final state or raise UserError."""
        console = self.session.console
        states = self.states()
        kinds = {s["state"] for s in states}
        if kinds == {"done"}:
            console.print(f"{self.name}: done already ({_when(states[0])}), skipping")
            return states[0]
        if "running" in kinds:
            console.print(f"{self.name}: already running since {_clock(states[0].get('started'))}, re-attaching")
        else:
            if "lost" in kinds:
                console.print(f"{self.name}: was done but its outputs are gone (VM restarted?), running it again")
            elif kinds & {"failed", "interrupted"}:
                console.print(f"{self.name}: last attempt {'/'.join(sorted(kinds - {'pending'}))}, retrying")
            self.before_start()
            console.print(f"{self.name}: starting on {len(self.session.workers)} worker(s)")
            for worker, spec in zip(self.session.workers, self.specs, strict=True):
                worker.launch(self.job_dir, spec)
        with JobProgress(console, self.name) as progress:
            self.session.workers[0].follow(self.job_dir, progress.feed, progress.tick)
        if progress.evals:  # the log is read from its start, so this is the whole list
            self.session.run.evals = progress.evals
        return self.finish()

    def finish(self) -> dict:
        states = self.states()
        state = states[0]
        self.session.run.jobs[self.name] = {
            k: state.get(k) for k in ("state", "started", "finished", "exit_code", "outputs", "error")
        }
        self.session.run.save()
        bad = [(w, s) for w, s in zip(self.session.workers, states, strict=True) if s["state"] != "done"]
        if not bad:
            self.session.console.print(f"{self.name}: done in {runs.minutes(state) or 0:.1f} min")
            return state
        worker, failed = bad[0]
        tail = secrets.redact(worker.log_tail(self.job_dir, LOG_TAIL_LINES), self.session.secrets)
        self.session.console.print(f"--- last {LOG_TAIL_LINES} lines of {worker.name}:{failed['log']} ---")
        self.session.console.print(tail, markup=False, highlight=False)
        raise UserError(
            f"{self.name} {failed['state']} on {worker.name}: {failed.get('error') or 'see the log'}. "
            f"Full log: fab logs {self.name} (or ssh {worker.name} less {failed['log']}). Run fab train again to retry it."
        )


def _clock(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "?"


def _when(state: dict) -> str:
    return f"finished {_clock(state.get('finished'))}, outputs present"


def stages(session: Session, only: list[str] | None = None) -> list[Stage]:
    """The setup stage, then the named jobs (all of them by default), in run order."""
    per_worker = [session.rendered(w) for w in session.workers]
    names = list(per_worker[0])
    unknown = set(only or []) - set(names)
    if unknown:
        raise UserError(f"no job {', '.join(sorted(unknown))}; jobs are {', '.join(names)}")
    session.run.rendered = [job.to_dict() for job in per_worker[0].values()]
    job_dir, spec = setup_spec(session)
    result = [Stage(session, "setup", job_dir, [spec for _ in session.workers])]
    for name in names if only is None else [n for n in names if n in only]:
        specs = [job_spec(session, rendered[name]) for rendered in per_worker]
        result.append(Stage(session, name, session.job_dir(per_worker[0][name]), specs, lambda: preflight(session)))
    return result


def run_stages(session: Session, selected: list[Stage]) -> None:
    """Run stages in order, then show the eval results the train job printed."""
    for stage in selected:
        stage.run()
    if session.run.evals:
        session.console.print(eval_table(session.run.evals))
    session.run.save()
