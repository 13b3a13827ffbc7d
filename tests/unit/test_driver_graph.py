"""The VM driver's graph decisions and how fab shows them, with fake jobs: milliseconds, no SSH, no processes."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from bootstrap.errors import UserError
from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from bootstrap.remote.graph import Action, Graph, PipelineState, decide
from bootstrap.remote.jobrunner import JobState
from bootstrap.results.runs import RunRecord
from bootstrap.session import Session
from bootstrap.vm.pipeline import driver_plan
from bootstrap.vm.progress import Board
from bootstrap.vm.watch import Watcher

PLAN = build(load.read(REPO / "jobs"), [], "run-1")
CHAIN = ["setup", "prefetch", "validate", "convert", "train", "export"]


class FakeJobs:
    """Job states by name; a launched job becomes `after[name]` (done by default) when next looked at."""

    def __init__(self, states: dict[str, JobState] | None = None, after: dict[str, list[JobState]] | None = None):
        self.states = {name: (states or {}).get(name, JobState.PENDING) for name in CHAIN}
        self.after = after or {}
        self.calls: list[str] = []
        self.events: list[dict] = []
        self.checks = [{"check": "chips", "ok": True, "message": "8 chips"}]
        self.folder_checks = [{"check": "folder", "ok": True, "message": "vars.work_dir /dev/shm/tpu-rl-u/m is ours"}]

    def state_of(self, job: dict) -> dict:
        name = job["name"]
        return {
            "state": self.states[name].value,
            "error": "exited with 1" if self.states[name] is JobState.FAILED else None,
        }

    def launch(self, job: dict) -> None:
        name = job["name"]
        self.calls.append(f"launch {name}")
        if self.states[name] is JobState.RUNNING:
            return  # adopted: it goes on as it was
        script = self.after.get(name) or [JobState.DONE]
        self.states[name] = script.pop(0) if len(script) > 1 else script[0]

    def preflight(self, tpu: bool) -> list[dict]:
        self.calls.append("preflight" if tpu else "folders")
        return self.checks if tpu else self.folder_checks

    def graph(self, starts: list[str] | None = None) -> Graph:
        needed = {n for name in starts or [] for n in PLAN.job(name).needs}  # as driver_plan sends them
        entries = [
            {
                "name": j.name,
                "needs": list(j.needs),
                "uses_tpu": j.uses_tpu,
                "start": starts is None or j.name in starts,
            }
            for j in PLAN.jobs
            if starts is None or j.name in starts or j.name in needed
        ]
        return Graph(entries, self.state_of, self.launch, self.preflight, self.events.append)

    def drive(self, starts: list[str] | None = None, limit: int = 100) -> Graph:
        graph = self.graph(starts)
        for _ in range(limit):
            if not graph.step():
                return graph
        raise AssertionError("the graph never ended")


@pytest.mark.parametrize(
    ("state", "action", "message"),
    [
        (JobState.DONE, Action.SKIP, "train: done already (finished ?, outputs present), skipping"),
        (JobState.RUNNING, Action.ATTACH, "train: already running since ?, re-attaching"),
        (JobState.PENDING, Action.START, "train: starting"),
        (JobState.FAILED, Action.START, "train: last attempt failed (exited with 1), retrying"),
        (JobState.INTERRUPTED, Action.START, "train: last attempt was interrupted, starting it again"),
        (JobState.LOST, Action.START, "train: was done but its outputs are gone (VM restarted?), running it again"),
        (
            JobState.STALE,
            Action.START,
            "train: was done for inputs that have changed since (x changed), running it again",
        ),
    ],
)
def test_decision_table(state, action, message):
    error = {JobState.FAILED: "exited with 1", JobState.STALE: "x changed"}.get(state)
    assert decide("train", {"state": state.value, "error": error}) == (action, message)


def test_a_fresh_vm_runs_setup_and_prefetch_together_then_the_chain():
    jobs = FakeJobs()
    assert jobs.drive().outcome is PipelineState.DONE
    assert jobs.calls == [
        "folders",  # once, before the first job: the run's folders are the SSH user's alone
        "launch setup",
        "launch prefetch",  # beside setup: both started before either was looked at again
        "launch validate",  # MaxText's check of every job, while convert runs
        "preflight",  # once, before the first TPU job
        "launch convert",
        "launch train",
        "launch export",
    ]
    ends = [e["job"] for e in jobs.events if e["event"] == "end"]
    assert sorted(ends) == sorted(CHAIN)


def test_everything_done_is_a_no_op():
    jobs = FakeJobs({name: JobState.DONE for name in CHAIN})
    assert jobs.drive().outcome is PipelineState.DONE
    assert jobs.calls == ["folders"]  # every pass: a done job's outputs are trusted only in the user's own folders
    assert [e["action"] for e in jobs.events if e["event"] == "decide"] == ["skip"] * 6


def test_a_job_only_done_jobs_need_is_not_run():
    """A new VM whose converted model is kept in the bucket: prefetch (32 GB) is not needed, setup still is."""
    jobs = FakeJobs({"convert": JobState.DONE})
    assert jobs.drive().outcome is PipelineState.DONE
    assert jobs.calls == ["folders", "launch setup", "launch validate", "preflight", "launch train", "launch export"]
    skipped = [e for e in jobs.events if e.get("job") == "prefetch"]
    assert skipped == [
        {
            "event": "decide",
            "job": "prefetch",
            "action": "skip",
            "message": "prefetch: not needed, convert done already",
        }
    ]


def test_a_job_run_alone_on_a_new_vm_finds_itself_in_the_bucket_before_its_needs_are_asked_for():
    """`fab convert` on a new VM whose converted model is kept: prefetch, which it needs, is not needed."""
    jobs = FakeJobs({"setup": JobState.DONE, "convert": JobState.DONE})
    graph = jobs.drive(starts=["convert"])
    assert graph.outcome is PipelineState.DONE and jobs.calls == ["folders"]
    assert [e["message"] for e in jobs.events if e.get("job") == "prefetch"] == [
        "prefetch: not needed, convert done already"
    ]


def test_a_job_restored_from_the_bucket_says_so():
    state = {"state": JobState.DONE.value, "restored_from": "gs://b/m/tpu-rl/shared/convert-k.json"}
    assert decide("convert", state) == (Action.SKIP, "convert: done already, kept in the bucket (finished ?), skipping")


def test_a_running_job_is_adopted_never_started_twice():
    jobs = FakeJobs({n: JobState.DONE for n in CHAIN[:4]} | {"train": JobState.RUNNING})
    graph = jobs.graph()
    graph.step()
    assert [e["action"] for e in jobs.events if e.get("job") == "train"] == [Action.ATTACH.value]
    for _ in range(3):  # it keeps running: nothing else happens
        graph.step()
    assert jobs.calls == ["folders", "launch train"]  # a launch of a running job adopts it (jobrunner.launch)
    jobs.states["train"] = JobState.DONE
    while graph.step():
        pass
    # the folders' check first, on every pass; the TPU's preflight before a job it starts: an adopted one was
    # checked when it started
    assert jobs.calls == ["folders", "launch train", "preflight", "launch export"]


def test_a_runner_that_died_is_relaunched_once_to_adopt_its_job():
    jobs = FakeJobs({n: JobState.DONE for n in CHAIN[:4]}, after={"train": [JobState.INTERRUPTED, JobState.DONE]})
    assert jobs.drive().outcome is PipelineState.DONE
    assert jobs.calls == ["folders", "preflight", "launch train", "launch train", "launch export"]
    assert [e["event"] for e in jobs.events if e.get("job") == "train"] == ["decide", "relaunch", "end"]


def test_a_failed_job_stops_its_dependants_and_what_does_not_need_it_runs_on():
    jobs = FakeJobs(after={"prefetch": [JobState.FAILED]})
    graph = jobs.drive()
    assert graph.outcome is PipelineState.FAILED
    assert "launch setup" in jobs.calls and "launch validate" in jobs.calls  # validate needs only setup
    assert not any(c in jobs.calls for c in ("launch convert", "launch train", "launch export"))
    assert graph.failed == {
        "prefetch": "exited with 1",
        "convert": "needs prefetch, which failed",
        "train": "needs convert, which failed",
        "export": "needs train, which failed",
    }


def test_a_done_job_whose_outputs_vanished_runs_again_while_something_needs_them():
    jobs = FakeJobs({n: JobState.DONE for n in CHAIN[:3]} | {"convert": JobState.LOST})  # a new run after a restart
    jobs.drive()
    assert jobs.calls == ["folders", "preflight", "launch convert", "launch train", "launch export"]
    everything_after_done = FakeJobs({n: JobState.DONE for n in CHAIN} | {"convert": JobState.LOST})
    everything_after_done.drive()
    assert everything_after_done.calls == [
        "folders"
    ]  # train and export are done: the model need not be converted again


def test_a_failed_preflight_starts_no_tpu_job():
    jobs = FakeJobs({"setup": JobState.DONE, "prefetch": JobState.DONE, "validate": JobState.DONE})
    jobs.checks = [{"check": "tpu_free", "ok": False, "message": "the TPU is in use by pid 7"}]
    graph = jobs.drive()
    assert graph.outcome is PipelineState.FAILED and jobs.calls == ["folders", "preflight"]
    assert graph.failed["convert"] == "the VM's preflight failed"


def test_a_folder_someone_else_owns_starts_no_job_at_all():
    """The folders are checked before the first job of any kind: setup builds nothing in a folder another account
    could change, and prefetch downloads nothing."""
    jobs = FakeJobs()
    jobs.folder_checks = [{"check": "folder", "ok": False, "message": "vars.work_dir /dev/shm/m: belongs to mallory"}]
    graph = jobs.drive()
    assert graph.outcome is PipelineState.FAILED and jobs.calls == ["folders"]
    assert graph.failed == {"preflight": "the run's folders are not the SSH user's alone"}


def test_a_folder_someone_else_made_after_a_restart_vouches_for_no_done_job():
    """Every job done and its outputs there, but the work folder is another account's now (a restart emptied
    /dev/shm and it made the folder again, an export of its own inside): nothing is taken as done or skipped,
    nothing runs, and the pass fails on the folder."""
    jobs = FakeJobs({name: JobState.DONE for name in CHAIN})
    jobs.folder_checks = [{"check": "folder", "ok": False, "message": "vars.work_dir /dev/shm/m: belongs to mallory"}]
    graph = jobs.drive()
    assert graph.outcome is PipelineState.FAILED and jobs.calls == ["folders"] and not graph.done
    assert [e["event"] for e in jobs.events] == ["preflight"]


def test_a_needed_job_that_is_not_done_blocks_before_anything_starts():
    jobs = FakeJobs(
        {"setup": JobState.DONE, "validate": JobState.DONE, "prefetch": JobState.DONE, "convert": JobState.FAILED}
    )
    graph = jobs.drive(starts=["setup", "train"])
    assert jobs.calls == ["folders"] and graph.outcome is PipelineState.FAILED  # not even setup, which needs nothing
    assert [e["event"] for e in jobs.events if e.get("job") == "convert"] == ["needed"]


# --- what fab makes of the events ------------------------------------------------------------------


class FakeVm:
    name = "vm"

    def tail(self, job_dir, count, name="log"):
        job = next(j.name for j in PLAN.jobs if j.job_dir == job_dir)
        return [f"last line of {job} {name}"]


def watcher(tmp_path, monkeypatch) -> tuple[Watcher, io.StringIO]:
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path))
    out = io.StringIO()
    console = Console(file=out, width=300)
    session = Session(PLAN, FakeVm(), console, RunRecord("run-1"), overrides=["vars.x=1"])
    return Watcher(session, list(PLAN.jobs), Board(console)), out


def feed_all(w: Watcher, jobs: FakeJobs, graph: Graph) -> None:
    for event in jobs.events:
        w.feed(event)
    w.feed({"event": "finished", "state": graph.outcome.value})


def convert_ends(state: JobState, tmp_path, monkeypatch) -> tuple[Watcher, io.StringIO]:
    """The pipeline with convert ending `state`, as fab's watcher saw it."""
    jobs = FakeJobs(
        {"setup": JobState.DONE, "validate": JobState.DONE, "prefetch": JobState.DONE}, after={"convert": [state]}
    )
    graph = jobs.drive()
    w, out = watcher(tmp_path, monkeypatch)
    feed_all(w, jobs, graph)
    return w, out


def test_a_failed_job_is_reported_with_its_log_and_a_hint_that_works_as_printed(tmp_path, monkeypatch):
    w, out = convert_ends(JobState.FAILED, tmp_path, monkeypatch)
    with pytest.raises(UserError) as raised:
        w.finish()
    assert str(raised.value) == (
        "convert failed on vm: exited with 1. Full log: fab logs --job convert --run-name run-1 --arg vars.x=1. "
        "Fix the cause, then run fab train again to retry it"
    )
    assert "last line of convert log" in out.getvalue()
    assert "train: not started, it needs convert, which failed" in out.getvalue()


def test_an_interrupted_runner_shows_its_own_errors(tmp_path, monkeypatch):
    w, out = convert_ends(JobState.INTERRUPTED, tmp_path, monkeypatch)
    with pytest.raises(UserError, match="convert interrupted on vm"):
        w.finish()
    assert "runner | last line of convert runner.err" in out.getvalue()


def test_a_needed_job_not_done_says_what_to_run(tmp_path, monkeypatch):
    jobs = FakeJobs(
        {"setup": JobState.DONE, "validate": JobState.DONE, "prefetch": JobState.DONE, "convert": JobState.FAILED}
    )
    graph = jobs.drive(starts=["setup", "train"])
    w, _ = watcher(tmp_path, monkeypatch)
    feed_all(w, jobs, graph)
    with pytest.raises(UserError, match="^train needs convert, which is failed: run fab train first$"):
        w.finish()


def test_the_summary_gives_minutes_and_chip_hours_and_the_span_for_jobs_side_by_side(tmp_path, monkeypatch):
    w, out = watcher(tmp_path, monkeypatch)
    for name, started, finished in (
        ("setup", 1e9, 1e9 + 600),
        ("prefetch", 1e9, 1e9 + 1200),
        ("train", 1e9 + 1200, 1e9 + 4800),
    ):
        w.feed({"event": "end", "job": name, "state": {"state": "done", "started": started, "finished": finished}})
    w.feed({"event": "finished", "state": "done"})
    w.finish()
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in out.getvalue().splitlines()
        if line.startswith("│")
    }
    assert rows["setup"] == ["done", "10.0", "1.33"]  # 8 chips for a sixth of an hour
    assert rows["train"] == ["done", "60.0", "8.00"]
    assert rows["pipeline (first start to last end)"] == ["", "80.0", "10.67"]  # not the 90 minutes of the sum


# --- the plan fab sends ----------------------------------------------------------------------------


def session_for(plan, overrides=()) -> Session:
    return Session(plan, FakeVm(), Console(file=io.StringIO()), RunRecord(plan.run_name), overrides=list(overrides))


def test_the_same_command_sends_the_same_plan_and_another_run_or_override_another():
    files = load.read(REPO / "jobs")
    digest = lambda plan, overrides=(): driver_plan(session_for(plan, overrides), list(plan.jobs), "train")["digest"]  # noqa: E731
    assert digest(PLAN) == digest(build(files, [], "run-1"))
    assert digest(PLAN) != digest(build(files, [], "run-2"))
    assert digest(PLAN) != digest(build(files, ["vars.num_batches=7"], "run-1"), ["vars.num_batches=7"])


def test_a_single_job_sends_what_it_needs_as_jobs_that_must_be_done_already():
    plan = driver_plan(session_for(PLAN), [PLAN.job("setup"), PLAN.job("export")], "export")
    assert [(j["name"], j["start"]) for j in plan["jobs"]] == [
        ("train", False),
        ("validate", False),
        ("setup", True),
        ("export", True),
    ]
    assert plan["hint"] == "fab export --run-name run-1"


def test_a_stream_sent_again_after_a_driver_restart_is_shown_once(tmp_path, monkeypatch):
    w, out = watcher(tmp_path, monkeypatch)
    stream = [
        {"t": 1.0, "event": "decide", "job": "train", "action": "start", "message": "train: starting", "state": {}},
        {"job": "train", "log": 7, "n": 1, "line": "[tpu-rl] starting train"},
    ]
    for item in stream + stream:  # the first driver's stream, then the revived one's replay of it
        w.feed(item)
    w.feed({"job": "train", "log": 8, "n": 1, "line": "[tpu-rl] starting train"})  # a fresh attempt's log
    assert out.getvalue().count("train: starting") == 1
    assert out.getvalue().count("[train] [tpu-rl] starting train") == 2
