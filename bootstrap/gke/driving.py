"""The gke pipeline: driven in the cluster by the VM driver's own graph, watched from this machine.

Each job is a JobSet. fab hands the plan it rendered and checked to a driver in the
cluster (remote/gke_driver.py, in a JobSet of its own, jobsets.driver_jobset), which
makes graph.Graph's decisions (start, attach, skip, block) from the JobSets' states:
the pipeline needs no laptop. `fab train` then watches it: the driver's events (its
pod's log) and the log lines of each job it runs (its head pod's) reach the same
Watcher as a VM's stream; `--detach` returns at once. One driver per run: the same plan
again attaches to it, another one is refused while it runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Iterator

from ..errors import StoppedWatching, UserError
from ..jobs.plan import PlannedJob
from ..remote.graph import Action, clock
from ..remote.jobrunner import JobState
from ..session import Session
from ..vm.machine import ConnectionLost
from ..vm.progress import Board
from ..vm.watch import LOG_TAIL_LINES, Watcher
from . import jobsets
from .session import target_of

POLL_SECONDS = float(os.environ.get("TPU_RL_GKE_POLL_SECONDS", "5"))  # the tests' cluster answers at once
FINISH_SECONDS = 60  # after the driver's last event: how long its pod, and the jobs' logs, may take to end
LOST_SECONDS = 10  # the API lost: how long the other readers may take to see it too before fab exits


def entries(session: Session, jobs: list[PlannedJob]) -> list[dict]:
    """The Graph's jobs, each with the JobSet fab checked: `jobs` to bring to done, and the jobs they need,
    which must be done already."""
    known = {job.name: job for job in (*session.plan.jobs, *jobs)}
    wanted = [job.name for job in jobs]
    needed = [n for name in wanted for n in known[name].needs if n not in wanted]
    return [
        {"name": n, "needs": list(known[n].needs), "start": n in wanted, "manifest": dict(known[n].runner_spec)}
        for n in dict.fromkeys(needed + wanted)
    ]


def driver(session: Session, planned: list[dict]) -> dict:
    """The JobSet of the pipeline's driver in the cluster, for `entries(...)`. The plan's digest covers every
    job and JobSet, so the same command again attaches to it and another is refused."""
    digest = hashlib.sha256(json.dumps([session.plan.run_name, planned], sort_keys=True).encode()).hexdigest()
    plan = {"run": session.plan.run_name, "digest": digest[:16], "jobs": planned}
    return jobsets.driver_jobset(plan, target_of(session.stack, session.plan.spec), session.plan.run_name)


def items(session: Session, driver_name: str, keys: dict[str, str], on_idle) -> Iterator[dict]:
    """The driver's events, and the log lines of each job it runs (`keys`: its JobSet) before that job's end
    event, until the driver's `finished` (or its JobSet's end without one)."""
    cluster, out = session.vm, queue.Queue()
    followers: dict[str, threading.Thread] = {}
    ends: dict[str, dict] = {}  # a job's end event, held until its log is read to its end
    decided: set[float] = set()  # the decisions followed (a re-read driver log sends them again)
    finished, deadline = None, 0.0

    def follow(key: str, on_line, then: dict) -> None:
        read = ""
        try:
            while True:  # a dropped watch or a restarted pod while the JobSet runs: follow again
                read = cluster.follow(key, on_line, lambda: out.put({"idle": True}), read)
                if cluster.states([key])[0].state is not JobState.RUNNING:
                    return out.put(then)
        except UserError as err:  # the API did not answer: the watching ends, not the pipeline
            out.put({"lost": str(err)})

    def start(job: str) -> None:
        def line(text: str) -> None:
            out.put({"job": job, "line": text})

        followers[job] = threading.Thread(target=follow, args=(keys[job], line, {"read": job}), daemon=True)
        followers[job].start()

    def reading(job: str) -> bool:
        return job in followers and followers[job].is_alive()

    def event(text: str) -> None:
        out.put(_event(text))

    watcher = threading.Thread(target=follow, args=(driver_name, event, {"over": True}), daemon=True)
    watcher.start()
    while True:
        try:
            item = out.get(timeout=POLL_SECONDS)
        except queue.Empty:
            item = {"idle": True}
        if "idle" in item:
            on_idle()
        elif "lost" in item:
            # None left inside a request when fab exits: a daemon thread in the TLS library while the
            # interpreter shuts down can abort the process (seen: exit -6 after the one-line error).
            given_up = time.monotonic() + LOST_SECONDS
            for thread in (watcher, *followers.values()):
                thread.join(max(0.0, given_up - time.monotonic()))
            raise ConnectionLost(item["lost"])
        elif "over" in item:  # the driver's JobSet has ended (and its log has been read)
            break
        elif "read" in item:
            if item["read"] in ends:
                yield ends.pop(item["read"])
        elif item.get("event") == "decide" and item["action"] != Action.SKIP.value and item["t"] not in decided:
            decided.add(item["t"])
            if not reading(item["job"]):
                start(item["job"])
            yield item
        elif item.get("event") == "end" and reading(item["job"]):
            ends[item["job"]] = item
        elif item.get("event") == "finished":
            finished, deadline = item, time.monotonic() + FINISH_SECONDS
        else:
            yield item
        if finished is not None and time.monotonic() > deadline:  # its pod is slow to end: stop waiting
            break
    for follower in followers.values():  # nothing left reading when fab exits
        follower.join(max(0.0, deadline - time.monotonic()) if finished else FINISH_SECONDS)
    while not out.empty():  # what they read last, each job's lines before its end
        item = out.get()
        if "line" in item:
            yield item
        elif "read" in item and item["read"] in ends:
            yield ends.pop(item["read"])
    yield from ends.values()
    if finished is not None:
        yield finished


def _event(line: str) -> dict:
    """One line of the driver's log: its event, or (a Python traceback, a message of the image) a note."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    return (
        event if isinstance(event, dict) and "event" in event else {"event": "note", "job": "driver", "message": line}
    )


def status_lines(session: Session) -> list[str]:
    """fab status's line on the run's driver in the cluster."""
    name = jobsets.driver_name(session.plan.run_name)
    state = session.vm.states([name])[0]
    where = f"the JobSet {jobsets.NAMESPACE}/{name}"
    if state.state is JobState.PENDING:
        return ["pipeline: none has run for this run in the cluster yet"]
    if state.state is JobState.RUNNING:
        return [f"pipeline: running in the cluster, driven by {where} since {clock(state.started)}"]
    if state.state is JobState.DONE:
        return [f"pipeline: done in the cluster by {where} at {clock(state.finished)}"]
    return [f"pipeline: failed in the cluster ({where}: {state.error or 'see its pod'}); fab train retries"]


def run(session: Session, jobs: list[PlannedJob], task: str, detach: bool, prepare) -> None:
    """Hand `jobs` to the run's driver in the cluster (or attach to it), then watch it as a VM's pipeline."""
    planned = entries(session, jobs)
    handed = driver(session, planned)
    name, where = handed["metadata"]["name"], f"the JobSet {jobsets.NAMESPACE}/{handed['metadata']['name']}"
    if session.vm.driving(handed):  # its Secret and tools are left as they are
        session.console.print(f"attached to the pipeline in the cluster: its driver is {where}")
    else:
        prepare(session)
        session.vm.hand_over(handed)
        session.console.print(f"pipeline started in the cluster, driven by {where}; it goes on without this machine")
    session.record.save()
    if detach:
        session.console.print(f"watch it: {session.hint(task)}, or fab status")
        return
    keys = {job["name"]: job["manifest"]["metadata"]["name"] for job in planned}
    with Board(session.console) as board:
        watcher = Watcher(session, jobs, board)
        try:
            for item in items(session, name, keys, watcher.tick):
                watcher.feed(item)
        except ConnectionLost as lost:
            raise UserError(
                f"{lost}: stopped watching; the pipeline goes on in the cluster. Watch it again: {session.hint(task)}"
            ) from None
        except KeyboardInterrupt:
            raise StoppedWatching(
                f"stopped watching; the pipeline goes on in the cluster. Watch it again: {session.hint(task)}"
            ) from None
    if watcher.outcome is None:
        tail = "\n".join(session.vm.tail(name, LOG_TAIL_LINES))
        raise UserError(f"the pipeline's driver {jobsets.NAMESPACE}/{name} ended without finishing:\n{tail}")
    watcher.finish()
