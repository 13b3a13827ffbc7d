"""The gke pipeline, driven from this machine by the VM driver's own graph (driver.Graph).

Each job is a JobSet; the same Graph decides start, attach, skip and block from the
JobSets' states, and its events and the head pods' log lines reach the same Watcher as
a VM's stream. A JobSet runs on without this machine; the pipeline's next JobSet is
created only while fab runs (the unattended gke pipeline is not built yet).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from ..errors import UserError
from ..jobs.plan import PlannedJob
from ..remote.driver import Graph
from ..remote.jobrunner import JobState
from ..session import Session
from ..vm.progress import Board
from ..vm.watch import Watcher

POLL_SECONDS = 5


def items(session: Session, jobs: list[PlannedJob], on_idle) -> Iterator[dict]:
    """What the VM's driver would stream for `jobs`: events, and log lines that come before their job's end."""
    cluster, out = session.vm, queue.Queue()
    known = {job.name: job for job in (*session.plan.jobs, *jobs)}
    wanted = [job.name for job in jobs]
    needed = [n for name in wanted for n in known[name].needs if n not in wanted]
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

    entries = [{"name": n, "needs": list(known[n].needs), "start": n in wanted} for n in dict.fromkeys(needed + wanted)]
    graph = Graph(entries, state_of, launch, lambda: [], out.put)
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


def run(session: Session, jobs: list[PlannedJob], detach: bool, prepare) -> None:
    """Bring `jobs` to done through the cluster, shown as a VM's pipeline is."""
    if detach:
        raise UserError("--detach: the gke backend's pipeline is driven from this machine (not unattended yet)")
    prepare(session)
    with Board(session.console) as board:
        watcher = Watcher(session, jobs, board)
        for item in items(session, jobs, watcher.tick):
            watcher.feed(item)
    watcher.finish()
