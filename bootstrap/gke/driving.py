"""The gke pipeline, driven by the VM driver's own graph (driver.Graph): from this machine, or in the cluster.

Each job is a JobSet; the same Graph decides start, attach, skip and block from the
JobSets' states. `fab train` drives it from here, and its events and the head pods' log
lines reach the same Watcher as a VM's stream. `fab train --detach` hands the same plan
to a driver in the cluster (remote/gke_driver.py, in a JobSet of its own): the
pipeline then needs no laptop. One driver at a time: fab refuses to drive a run whose
driver runs in the cluster.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
from collections.abc import Iterator

from ..errors import UserError
from ..jobs.plan import PlannedJob
from ..remote.driver import Graph, clock
from ..remote.jobrunner import JobState
from ..session import Session
from ..vm.progress import Board
from ..vm.watch import Watcher
from . import jobsets
from .session import target_of

POLL_SECONDS = 5


def items(session: Session, jobs: list[PlannedJob], on_idle) -> Iterator[dict]:
    """What the VM's driver would stream for `jobs`: events, and log lines that come before their job's end."""
    cluster, out = session.vm, queue.Queue()
    known = {job.name: job for job in (*session.plan.jobs, *jobs)}
    followers: dict[str, threading.Thread] = {}

    def follow(name: str) -> None:
        key = known[name].job_dir
        while True:  # a dropped watch while the JobSet runs: follow again
            cluster.follow(key, lambda line: out.put({"job": name, "line": line}), lambda: out.put({"idle": True}))
            if cluster.states([key])[0].state is not JobState.RUNNING:
                return

    def state_of(entry: dict) -> dict:
        follower = followers.get(entry["name"])
        if follower is not None and follower.is_alive():  # its log is not all read yet: it still runs for the graph
            return {"state": JobState.RUNNING.value}
        return cluster.states([known[entry["name"]].job_dir])[0].to_json()

    def launch(entry: dict) -> None:
        cluster.launch(known[entry["name"]])
        followers[entry["name"]] = threading.Thread(target=follow, args=(entry["name"],), daemon=True)
        followers[entry["name"]].start()

    graph = Graph(entries(session, jobs), state_of, launch, lambda: [], out.put)
    while graph.step():
        try:
            item = out.get(timeout=POLL_SECONDS)
        except queue.Empty:
            on_idle()
            continue
        out.put(item)
        while not out.empty():
            item = out.get()
            if "idle" in item:
                on_idle()
            else:
                yield item
    while not out.empty():
        yield out.get()
    yield {"event": "finished", "state": graph.outcome.value}


def entries(session: Session, jobs: list[PlannedJob]) -> list[dict]:
    """The Graph's jobs: `jobs` to bring to done, and the jobs they need, which must be done already."""
    known = {job.name: job for job in (*session.plan.jobs, *jobs)}
    wanted = [job.name for job in jobs]
    needed = [n for name in wanted for n in known[name].needs if n not in wanted]
    return [{"name": n, "needs": list(known[n].needs), "start": n in wanted} for n in dict.fromkeys(needed + wanted)]


def driver(session: Session, jobs: list[PlannedJob]) -> dict:
    """The JobSet of the pipeline's driver in the cluster: the Graph's jobs, each with the JobSet fab checked.
    Its digest covers them all, so the same command again attaches to it and another is refused."""
    known = {job.name: job for job in (*session.plan.jobs, *jobs)}
    planned = [{**entry, "manifest": dict(known[entry["name"]].runner_spec)} for entry in entries(session, jobs)]
    digest = hashlib.sha256(json.dumps([session.plan.run_name, planned], sort_keys=True).encode()).hexdigest()
    plan = {"run": session.plan.run_name, "digest": digest[:16], "jobs": planned}
    return jobsets.driver_jobset(plan, target_of(session.stack, session.plan.spec), session.plan.run_name)


def status_lines(session: Session) -> list[str]:
    """fab status's line on who drives the run: its driver in the cluster, or fab."""
    name = jobsets.driver_name(session.plan.run_name)
    state = session.vm.states([name])[0]
    where = f"the JobSet {jobsets.NAMESPACE}/{name}"
    if state.state is JobState.PENDING:
        return ["pipeline: driven by fab train (no driver in the cluster for this run; fab train --detach starts one)"]
    if state.state is JobState.RUNNING:
        return [f"pipeline: running in the cluster, driven by {where} since {clock(state.started)}"]
    if state.state is JobState.DONE:
        return [f"pipeline: done in the cluster by {where} at {clock(state.finished)}"]
    return [f"pipeline: failed in the cluster ({where}: {state.error or 'see its pod'}); fab train retries"]


def run(session: Session, jobs: list[PlannedJob], detach: bool, prepare) -> None:
    """Bring `jobs` to done through the cluster: from here, shown as a VM's pipeline is, or (detach) by a driver
    in the cluster."""
    handed = driver(session, jobs)
    name = handed["metadata"]["name"]
    cluster = session.vm
    if not detach and cluster.states([name])[0].state is JobState.RUNNING:
        raise UserError(
            f"run {session.plan.run_name}: its pipeline is driven in the cluster by the JobSet {jobsets.NAMESPACE}/"
            f"{name}; see it with {session.hint('status')} and {session.hint('logs')}"
        )
    prepare(session)
    if detach:
        session.console.print(cluster.hand_over(handed))
        session.console.print(f"it runs without this machine: see it with {session.hint('status')}")
        return
    with Board(session.console) as board:
        watcher = Watcher(session, jobs, board)
        for item in items(session, jobs, watcher.tick):
            watcher.feed(item)
    watcher.finish()
