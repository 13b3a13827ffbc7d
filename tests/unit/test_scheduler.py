"""The stage decision table and the job graph, through a fake VM: milliseconds, no SSH."""

from __future__ import annotations

import io
import threading

import pytest
from rich.console import Console

from bootstrap.errors import UserError
from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from bootstrap.remote.jobrunner import JobState
from bootstrap.results.runs import RunRecord
from bootstrap.vm.machine import JobStatus, LockLost
from bootstrap.vm.scheduler import Action, Session, decide, run_jobs

PLAN = build(load.read(REPO / "jobs"), [], "run-1")


class FakeVm:
    """Records what the scheduler asks of the VM and answers with scripted job states."""

    name = "vm"

    def __init__(self, states: dict[str, JobState], after_launch=JobState.DONE, follow_gate=None):
        self.state = {job.job_dir: JobStatus(states.get(job.name, JobState.PENDING)) for job in PLAN.jobs}
        self.names = {job.job_dir: job.name for job in PLAN.jobs}
        self.after_launch, self.follow_gate = after_launch, follow_gate
        self.calls: list[str] = []
        self.lost = threading.Event()
        self.lock = threading.Lock()

    def _call(self, text: str) -> None:
        with self.lock:
            self.calls.append(text)

    def states(self, job_dirs):
        self.check_lock()
        return [self.state[d] for d in job_dirs]

    def launch(self, job):
        """As jobrunner's launch: a running job is left to its runner (or adopted), never started twice."""
        self.check_lock()
        if self.state[job.job_dir].state is JobState.RUNNING:
            self._call(f"attach {job.name}")
        else:
            self._call(f"launch {job.name}")
            self.state[job.job_dir] = JobStatus(self.after_launch, error="exited with 1")
        return self.state[job.job_dir]

    def follow(self, job_dir, on_line, on_idle=lambda: None, tail=False):
        self._call(f"follow {self.names[job_dir]}")
        if self.follow_gate:
            self.follow_gate(self, job_dir)
        on_line(f"log of {self.names[job_dir]}")

    def check_lock(self):
        if self.lost.is_set():
            raise LockLost("lost the VM's lock")

    def preflight(self, request):
        self._call("preflight")
        return [{"check": "chips", "ok": True, "message": "8 chips"}]

    def tail(self, job_dir, count, name="log"):
        return [f"last line of {self.names[job_dir]} {name}"]


def session(vm: FakeVm, tmp_path, monkeypatch) -> tuple[Session, io.StringIO]:
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path))
    out = io.StringIO()
    return Session(PLAN, vm, Console(file=out, width=300), RunRecord("run-1"), overrides=["vars.x=1"]), out


@pytest.mark.parametrize(
    ("state", "action", "message"),
    [
        (JobState.DONE, Action.SKIP, "train: done already (finished ?, outputs present), skipping"),
        (JobState.RUNNING, Action.ATTACH, "train: already running since ?, re-attaching"),
        (JobState.PENDING, Action.START, "train: starting"),
        (JobState.FAILED, Action.START, "train: last attempt failed (exited with 1), retrying"),
        (JobState.INTERRUPTED, Action.START, "train: last attempt was interrupted, starting it again"),
        (JobState.LOST, Action.START, "train: was done but its outputs are gone (VM restarted?), running it again"),
    ],
)
def test_decision_table(state, action, message):
    assert decide("train", JobStatus(state, error="exited with 1" if state is JobState.FAILED else None)) == (
        action,
        message,
    )


def test_a_fresh_vm_runs_setup_and_prefetch_together_then_the_chain(tmp_path, monkeypatch):
    vm = FakeVm({})
    s, _ = session(vm, tmp_path, monkeypatch)
    run_jobs(s, list(PLAN.jobs))
    launches = [c for c in vm.calls if c.startswith(("launch", "preflight"))]
    assert launches == [
        "launch setup",
        "launch prefetch",
        "launch validate",  # MaxText's check of every job, while prefetch downloads and then convert runs
        "preflight",  # once, before the first TPU job
        "launch convert",
        "launch train",
        "launch export",
    ]
    assert set(s.record.jobs) == {"setup", "validate", "prefetch", "convert", "train", "export"}


def test_everything_done_is_a_no_op(tmp_path, monkeypatch):
    vm = FakeVm({job.name: JobState.DONE for job in PLAN.jobs})
    s, out = session(vm, tmp_path, monkeypatch)
    run_jobs(s, list(PLAN.jobs))
    assert vm.calls == []
    assert out.getvalue().count("done already") == 6


def test_a_running_job_is_followed_not_started_again(tmp_path, monkeypatch):
    vm = FakeVm(
        {"setup": JobState.DONE, "validate": JobState.DONE, "prefetch": JobState.DONE, "convert": JobState.DONE}
    )
    vm.state[PLAN.job("train").job_dir] = JobStatus(JobState.RUNNING)

    def finish(fake, job_dir):
        fake.state[job_dir] = JobStatus(JobState.DONE)

    vm.follow_gate = finish
    s, out = session(vm, tmp_path, monkeypatch)
    run_jobs(s, list(PLAN.jobs))
    assert "launch train" not in vm.calls and vm.calls[:2] == ["attach train", "follow train"]
    assert "train: already running since ?, re-attaching" in out.getvalue()


def test_a_log_stream_that_ends_while_the_job_runs_is_followed_again_never_failed(tmp_path, monkeypatch):
    vm = FakeVm(
        {"setup": JobState.DONE, "validate": JobState.DONE, "prefetch": JobState.DONE, "convert": JobState.DONE}
    )
    vm.state[PLAN.job("train").job_dir] = JobStatus(JobState.RUNNING)
    follows = []

    def flaky(fake, job_dir):  # the first two streams end early; the job is still running
        follows.append(job_dir)
        if len(follows) == 3:
            fake.state[job_dir] = JobStatus(JobState.DONE)

    vm.follow_gate = flaky
    s, out = session(vm, tmp_path, monkeypatch)
    run_jobs(s, [PLAN.job("train")])
    assert vm.calls.count("follow train") == 3
    assert "failed" not in out.getvalue() and "train: done in" in out.getvalue()


def test_a_failed_job_stops_the_graph_with_a_hint_that_works_as_printed(tmp_path, monkeypatch):
    vm = FakeVm(
        {"setup": JobState.DONE, "validate": JobState.DONE, "prefetch": JobState.DONE}, after_launch=JobState.FAILED
    )
    s, out = session(vm, tmp_path, monkeypatch)
    with pytest.raises(UserError) as raised:
        run_jobs(s, list(PLAN.jobs))
    assert str(raised.value) == (
        "convert failed on vm: exited with 1. Full log: fab logs --job convert --run-name run-1 --arg vars.x=1. "
        "Fix the cause, then run fab train again to retry it"
    )
    assert "launch train" not in vm.calls
    assert "last line of convert log" in out.getvalue()


def test_an_interrupted_runner_shows_its_own_errors(tmp_path, monkeypatch):
    vm = FakeVm(
        {"setup": JobState.DONE, "validate": JobState.DONE, "prefetch": JobState.DONE},
        after_launch=JobState.INTERRUPTED,
    )
    s, out = session(vm, tmp_path, monkeypatch)
    with pytest.raises(UserError, match="convert interrupted on vm"):
        run_jobs(s, [PLAN.job("convert")])
    assert "runner | last line of convert runner.err" in out.getvalue()


def test_a_lost_lock_stops_before_anything_else_is_started(tmp_path, monkeypatch):
    def lose_lock(fake, job_dir):
        fake.lost.set()  # the connection dropped while setup and prefetch were followed

    vm = FakeVm({}, follow_gate=lose_lock)
    s, _ = session(vm, tmp_path, monkeypatch)
    with pytest.raises(LockLost):
        run_jobs(s, list(PLAN.jobs))
    launched = [c for c in vm.calls if c.startswith("launch")]
    assert launched[0] == "launch setup" and set(launched) <= {"launch setup", "launch prefetch"}


def test_a_single_job_needs_its_dependencies_done(tmp_path, monkeypatch):
    vm = FakeVm(
        {"setup": JobState.DONE, "validate": JobState.DONE, "prefetch": JobState.DONE, "convert": JobState.FAILED}
    )
    s, _ = session(vm, tmp_path, monkeypatch)
    with pytest.raises(UserError, match="train needs convert, which is failed: run fab train first"):
        run_jobs(s, [PLAN.job("setup"), PLAN.job("train")])
    assert vm.calls == []
