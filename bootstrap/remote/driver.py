"""The VM side's pipeline driver: brings every job of a plan to done on the VM, laptop or not.

Copied to the VM beside jobrunner.py and run by its system python3 (standard library only).
fab sends it the plan it has rendered and checked: data, each job's folder, runner spec
and needs, never code to render again. From then on the pipeline belongs to the VM: a job
starts as soon as its needs are done (independent jobs side by side), is done only by its
own verdict (jobrunner: exit 0 and outputs present), a running job is adopted, never
started twice, and a failed job stops its dependants. One driver runs at a time; it holds
the VM's lock for the whole pipeline. When every job is done and no fab command came for
the plan's autostop time, it shuts the VM down.

    start STATE_DIR [--follow]   the plan JSON on stdin: start a driver for it, or attach to the one
                                 running it (exit 75 and the running plan while another one runs;
                                 exit 76 and the jobs it would start, nothing started, for a plan
                                 marked check_first: fab checks the token first);
                                 with --follow, then stream as `follow` does
    follow STATE_DIR             the pipeline's events and its started jobs' log lines (secrets
                                 redacted) as JSON lines, until the pipeline has ended
    wake STATE_DIR               a fab command is here: restart a driver that died mid-pipeline or
                                 while it waited to autostop, put autostop back; print the
                                 pipeline's state as JSON (fab's own first look calls `wake` from
                                 facts.py, with the job states it reads ahead)
    revive STATE_DIR [--boot]    what the VM's crontab runs (every few minutes, and at boot), with
                                 no fab command: restart a driver that died (OOM, reboot) as wake
                                 does, without counting as a fab command, at most REVIVALS times a
                                 plan mid-pipeline
    hold STATE_DIR               a fab command uses the VM (a download): autostop waits until this
                                 command's stdin ends (fab is done, or its connection dropped);
                                 prints "held" once it holds
    run STATE_DIR [--autostop]   the driver itself, as wake and revive start it (start forks it);
                                 --autostop: only the wait to shut down of a pipeline that is done
    runs STATE_DIR REQUEST       every run the state folder and the bucket hold, as JSON (inventory.py;
                                 REQUEST: JSON, where fab's plan puts things, by run)

The files of the pipeline folder (Layout.pipeline): plan.json (the plan being driven),
driver.json (the driver's pid and the pipeline's state), events.jsonl (what the driver did,
one JSON object a line), seen (touched by every fab command and watcher: autostop's clock),
revived.json (how often `revive` restarted the driver of which plan), in-use.lock (held shared by
each fab command that uses the VM for long, such as a download: autostop waits for it), environment.json
(the environment of the fab command that started the plan: a driver restarted by the crontab, whose
PATH is /usr/bin:/bin, runs its jobs in it, as the first one did).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Iterator

try:
    from . import faults, folders, inventory, joblog, jobrunner, notify, preempted, preflight, processes
    from .graph import Action, Graph, PipelineState  # on the laptop: bootstrap.remote.driver
except ImportError:
    import faults  # on the VM: beside this script in the tools folder
    import folders
    import inventory
    import joblog
    import jobrunner
    import notify
    import preempted
    import preflight
    import processes
    from graph import Action, Graph, PipelineState

JobState, Layout, alive, identity = jobrunner.JobState, jobrunner.Layout, processes.alive, processes.identity
read_json, write_json = jobrunner.read_json, jobrunner.write_json
PLAN, DRIVER, EVENTS, SEEN, START_LOCK, DRIVER_ERR, REVIVED, IN_USE, ENVIRONMENT = (
    "plan.json",
    "driver.json",
    "events.jsonl",
    "seen",
    "start.lock",
    "driver.err",
    "revived.json",
    "in-use.lock",
    "environment.json",
)
REVIVALS = 3  # a driver that keeps dying mid-pipeline with no fab command is not started in a loop
# The VM's crontab line that revives a dead driver with no fab command (`{tool}` and `{state}` quoted).
CRON_LINE = "{when} python3 {tool} revive {state}{boot} >/dev/null 2>&1  # tpu-rl: revive the pipeline driver"
CRON_TIMES = (("*/5 * * * *", ""), ("@reboot", " --boot"))  # at boot, the idle time counts from then
POLL_SECONDS = 0.1  # the longest a look waits: a job's end is noticed at once (processes.wait_for_an_end)
SEEN_EVERY_SECONDS = 10  # a watcher marks itself seen this often
START_WAIT_SECONDS = 60
LINE_END = re.compile(rb"\r\n|\r|\n")
MAX_LINE = 64 * 1024
READ_EVENTS = 1024 * 1024  # events read per look: a long history streams in parts
BUSY = 75
CHECK_FIRST = 76  # `start` of a plan marked check_first that would start a job: nothing started, check the token


def _path(layout: Layout, name: str) -> str:
    return os.path.join(layout.pipeline, name)


def info(layout: Layout) -> dict | None:
    """The pipeline's state as its driver last wrote it; a dead driver's running pipeline is interrupted."""
    record = read_json(_path(layout, DRIVER))
    if record and record["state"] == PipelineState.RUNNING.value and not alive(record):
        record["state"] = PipelineState.INTERRUPTED.value
    if record:
        record["alive"] = alive(record)
        record["notifications"] = notify.recent(layout)
    return record


class Driver:
    """One pass over the plan, then autostop: the process `start` leaves running on the VM."""

    def __init__(self, layout: Layout, plan: dict, since: float | None = None):
        self.layout, self.plan = layout, plan
        self.record = {
            **identity(os.getpid()),
            "digest": plan["digest"],
            "run": plan["run"],
            "hint": plan.get("hint", ""),
            "started_by": plan.get("started_by", ""),
            "jobs": [job["name"] for job in plan["jobs"]],
            "state": PipelineState.RUNNING.value,
            "since": since or time.time(),
            "running": [],
            "failed": {},
            "autostop_at": None,
            "autostop_idle": (plan.get("autostop") or {}).get("idle_seconds"),
            "autostop_why": (plan.get("autostop") or {}).get("why", ""),
            "autostop_command": (plan.get("autostop") or {}).get("command"),
        }
        self.graph = Graph(plan["jobs"], self._state_of, self._launch, self._preflight, self.emit)
        self.written = False  # driver.json of this driver: `start` waits for it

    def emit(self, event: dict) -> None:
        with open(_path(self.layout, EVENTS), "a") as events:  # one whole line per write: a reader never sees half
            events.write(json.dumps({"t": time.time(), **event}) + "\n")

    def save(self, **changes) -> None:
        """driver.json, written when something changed (the graph is looked at ten times a second)."""
        before = json.dumps(self.record)
        self.record.update(changes, running=sorted(self.graph.running), failed=dict(self.graph.failed))
        if json.dumps(self.record) != before or not self.written:
            write_json(_path(self.layout, DRIVER), self.record)
            faults.point("driver.saved")
            self.written = True

    def _state_of(self, job: dict) -> dict:
        return jobrunner.job_state(os.path.expanduser(job["job_dir"]), job["spec"])

    def _launch(self, job: dict) -> str | None:
        """Start (or adopt) the job; why it could not start, or None."""
        try:
            jobrunner.launch(os.path.expanduser(job["job_dir"]), json.dumps(job["spec"]))
        except RuntimeError as err:  # its runner did not start
            return str(err)
        except OSError as err:  # its folder cannot be written (a full disk): this job fails, not the driver
            return f"could not start: {jobrunner.os_error_text(err)}"
        return None

    def _preflight(self, tpu: bool) -> list[dict]:
        """The VM's checks: the run's folders (folders.py); or the TPU's, where a TPU held by this pipeline's own
        running job (validate, which train waits for) is not in the way of convert, which runs on the CPU beside it."""
        request = self.plan["preflight"]
        if not tpu:
            return folders.checks(request.get("folders") or {})
        own = {process["pid"] for process in self._running(jobrunner.PROCESS) if isinstance(process.get("pid"), int)}
        return preflight.checks(request, own)

    def _running(self, name: str) -> list[dict]:
        """That record (RUNNER or PROCESS) of each running job; {} where it has none."""
        folders = [os.path.expanduser(self.graph.jobs[job]["job_dir"]) for job in sorted(self.graph.running)]
        return [read_json(os.path.join(folder, name)) or {} for folder in folders]

    def wait_to_autostop(self, state: str = PipelineState.DONE.value) -> int:
        """A done (or stopped) pipeline whose driver died while it waited to shut the VM down: the wait alone, its
        idle clock kept (`since`: when the pipeline ended)."""
        self.save(state=state)
        self.emit({"event": "revived", "for": "autostop"})
        self.autostop()
        return 0

    def run(self) -> int:
        try:
            self.emit({"event": "pass", "run": self.plan["run"], "digest": self.plan["digest"]})
            self.save()
            while self.graph.step():
                self.save()
                running = self._running(jobrunner.RUNNER) + self._running(jobrunner.PROCESS)
                processes.wait_for_an_end(running, POLL_SECONDS)  # a job's end is acted on at once
            outcome = self.graph.outcome
        except OSError as err:  # its own files cannot be written: end the pipeline failed, never restart in a loop
            self.graph.failed["driver"] = jobrunner.os_error_text(err)
            outcome = PipelineState.FAILED
        self.save(state=outcome.value, since=time.time())
        self.emit({"event": "finished", "state": outcome.value, "failed": self.graph.failed})
        notify.start(self.layout, {"kind": "finished", "state": outcome.value, "failed": self.graph.failed})
        ends = (PipelineState.DONE, PipelineState.STOPPED)  # stopped: its kept checkpoint must outlive the VM too
        if outcome in ends and (why := only_on_the_vm(self.plan)):
            self.save(autostop_idle=None, autostop_why=why)  # never revived to wait either
            self.emit({"event": "autostop-off", "why": why})
        elif outcome in ends:  # stopped: nothing more to pay for either
            self.autostop()
        return 0 if outcome is PipelineState.DONE else 1

    def autostop(self) -> None:
        """Shut the VM down once nothing has been seen for the plan's idle time (never with autostop off).

        The last look at `seen` and the shutdown happen under the start lock, so a fab command that
        arrives meanwhile is either seen (the wait starts again) or starts after the decision. A fab
        command that uses the VM for longer (a download: `hold`) holds in-use.lock, and the VM never
        shuts down under it. A shutdown command that fails is tried again after another idle time, and
        shown by fab status.
        """
        idle = (self.plan.get("autostop") or {}).get("idle_seconds")
        if not idle:
            return
        since = self.record["since"]
        while True:
            at = max(since, _seen(self.layout)) + idle
            if at != self.record["autostop_at"]:
                self.save(autostop_at=at)
            if time.time() < at:
                time.sleep(min(5, max(0.05, at - time.time())))
                continue
            with open(_path(self.layout, START_LOCK), "a+") as serial, open(_path(self.layout, IN_USE), "a+") as use:
                fcntl.flock(serial, fcntl.LOCK_EX)
                if max(since, _seen(self.layout)) + idle > time.time():
                    continue  # a fab command came just now
                try:
                    fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)  # kept until the shutdown: no new use begins
                except BlockingIOError:
                    self.emit({"event": "autostop-deferred", "why": "a fab command is using the VM"})
                    since = time.time()  # look again after another idle time (its end is `seen` too)
                    continue
                command = self.plan["autostop"]["command"]
                self.emit({"event": "shutdown", "command": command})
                faults.point("autostop.shutting-down")
                import subprocess  # here, not above: every fab command starts this tool, and few stop the VM

                try:
                    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
                    code, error = result.returncode, result.stderr.strip()[-500:]
                except OSError as err:
                    code, error = 127, f"{command[0]}: {err.strerror or err}"
                self.save(shutdown={"exit_code": code, "at": time.time(), "error": error})
                faults.point("autostop.recorded-shutdown")
                if code == 0:
                    return
                since = time.time()  # failed: try again after another idle time


def only_on_the_vm(plan: dict) -> str | None:
    """Why autostop must keep the VM up although the plan has durable copies: none of them holds the model (each
    held it back, results.publish_if, or left no marker of a verified copy), so the VM's copy, which a stop would
    wipe, is the only one. Read from the copies' markers on the VM's disk, as they stand now."""
    markers = (plan.get("autostop") or {}).get("kept_by") or []
    records = [read_json(os.path.expanduser(marker)) or {} for marker in markers]
    if not markers or any(record and not record.get("held") for record in records):
        return None
    why = next((record["held"] for record in records if record.get("held")), None)
    if why is None:
        return "off: no copy of the model was verified, so it is kept only on the VM"
    return f"off: the model was held back ({str(why)[:300]}) and is kept only on the VM"


def run(layout: Layout, autostop_only: bool = False) -> int:
    """The driver process: holds the VM's lock for the whole pipeline (and its autostop wait)."""
    with open(layout.lock, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("another driver holds the VM's lock", file=sys.stderr)
            return BUSY
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # replaced by a new plan while waiting to autostop
        plan = read_json(_path(layout, PLAN))
        if autostop_only:
            was = read_json(_path(layout, DRIVER)) or {}
            return Driver(layout, plan, since=was.get("since")).wait_to_autostop(was.get("state", "done"))
        return Driver(layout, plan).run()


def _spawn(layout: Layout, autostop_only: bool = False, fork: bool = False) -> dict:
    """Start the driver detached and return its record once it has written one: a new interpreter, in the
    environment of the fab command that started the plan (whoever restarts it: the crontab); with `fork` (start,
    in that environment), a copy of this process, its modules imported (a new one took 0.1 s of every fab train)."""
    command = ["run", layout.root, *(["--autostop"] if autostop_only else [])]
    argv, err = [sys.executable, os.path.abspath(__file__), *command], _path(layout, DRIVER_ERR)
    env, ready = read_json(_path(layout, ENVIRONMENT)), functools.partial(_record_of, layout)
    if fork:
        body = functools.partial(main, command)
        return processes.start(body, argv, err, ready, "the pipeline driver", START_WAIT_SECONDS, env)
    return processes.spawn(argv, err, ready, "the pipeline driver", START_WAIT_SECONDS, env)


def _record_of(layout: Layout, pid: int) -> dict | None:
    """driver.json once the driver `pid` wrote it (it may have ended since: a pass with nothing to do)."""
    record = read_json(_path(layout, DRIVER))
    return record if record and record.get("pid") == pid else None


def waiting_to_autostop(record: dict | None) -> bool:
    """A done (or stopped) pipeline that is to shut the VM down and has not yet (its driver waits, or died
    waiting)."""
    return bool(
        record
        and record["state"] in (PipelineState.DONE.value, PipelineState.STOPPED.value)
        and record.get("autostop_idle")
        and (record.get("shutdown") or {}).get("exit_code") != 0
    )


def _stop(record: dict) -> None:
    """End a driver whose pipeline is over (it only waits to autostop) so that a new plan can run."""
    os.kill(record["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 10
    while alive(record) and time.monotonic() < deadline:
        time.sleep(0.02)


def start(layout: Layout, plan_text: str) -> tuple[int, dict]:
    """Drive `plan`: attach to the driver running it, refuse while another one runs, else start one.

    Returns the exit code and what to print: {"started"|"attached"|"busy": the pipeline's record}, or for a
    plan marked check_first that would start a job, {"check-first": those jobs}, with nothing changed (a
    driver waiting to autostop goes on waiting).
    """
    plan = json.loads(plan_text)
    os.makedirs(layout.pipeline, mode=0o700, exist_ok=True)
    if plan.get("register_preemptions", True):
        with contextlib.suppress(OSError):  # a preemption then goes unrecorded; the pipeline is not stopped for it
            preempted.register(layout)
    with open(_path(layout, START_LOCK), "a+") as serial:
        fcntl.flock(serial, fcntl.LOCK_EX)  # one start at a time decides
        touch_seen(layout)
        current = info(layout)
        if current and current["alive"] and current["state"] == PipelineState.RUNNING.value:
            if current["digest"] == plan["digest"]:
                return 0, {"attached": current}
            return BUSY, {"busy": current}
        if plan.get("check_first") and (starting := would_start(plan)):
            return CHECK_FIRST, {"check-first": starting}
        if current and current["alive"]:
            _stop(current)
        write_json(_path(layout, PLAN), plan)
        faults.point("driver.wrote-plan")
        keep_run_plan(layout, plan)
        if os.path.exists(_path(layout, REVIVED)):  # a plan a fab command starts may be revived again
            os.remove(_path(layout, REVIVED))
            faults.point("start.forgot-revivals")
        events = _path(layout, EVENTS)
        if os.path.exists(events):
            os.replace(events, f"{events}.previous")
            faults.point("driver.rotated-events")
        jobrunner.record_run(layout, plan["run"])
        write_json(_path(layout, ENVIRONMENT), dict(os.environ))  # fab's: where uv and the user's tools are
        faults.point("driver.kept-environment")
        if (plan.get("autostop") or {}).get("idle_seconds"):
            keep_reviving(layout)  # the VM shuts down even if this driver dies (OOM, reboot) with no fab to come
        return 0, {"started": _spawn(layout, fork=True)}


def keep_run_plan(layout: Layout, plan: dict) -> None:
    """The run's plans, merged (a later command's jobs over an earlier one's): `fab runs` reads a run's
    settings, chips and durable copies from it after the next run's plan replaced plan.json."""
    path = layout.run_plan(plan["run"])
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    kept = read_json(path) or {}
    jobs = {job["name"]: job for job in [*kept.get("jobs", []), *plan["jobs"]]}
    copies = [*kept.get("kept_by", []), *((plan.get("autostop") or {}).get("kept_by") or [])]
    write_json(
        path,
        {
            "run": plan["run"],
            "settings": plan.get("settings", []),
            "chips": (plan.get("preflight") or {}).get("chips"),
            "jobs": list(jobs.values()),
            "kept_by": list(dict.fromkeys(copies)),
        },
    )
    faults.point("driver.kept-run-plan")


def would_start(plan: dict) -> list[str]:
    """The jobs a driver would start at its first look at this plan (none: everything is done or runs), read
    from their states as the driver reads them, nothing launched."""
    starting = []

    def state_of(job: dict) -> dict:
        return jobrunner.job_state(os.path.expanduser(job["job_dir"]), job["spec"])

    with jobrunner.gcs.quick():  # fab waits for the answer
        Graph(plan["jobs"], state_of, lambda job: starting.append(job["name"]), lambda tpu: [], lambda _: None).step()
    return list(dict.fromkeys(starting))


def wake(layout: Layout) -> dict | None:
    """Every fab command: seen now (autostop waits again); a driver that died starts again."""
    if not os.path.isdir(layout.pipeline):
        return None
    with open(_path(layout, START_LOCK), "a+") as serial:
        fcntl.flock(serial, fcntl.LOCK_EX)
        touch_seen(layout)
        return _revived(layout, info(layout))


def revive(layout: Layout, boot: bool = False) -> dict | None:
    """The crontab's look, with no fab command: a driver that died starts again, mid-pipeline at most
    REVIVALS times a plan (one that keeps dying is left for a fab command to show); `seen` is not touched,
    except at `boot`: a VM started again waits a whole idle time before autostop stops it again."""
    if not os.path.isdir(layout.pipeline):
        return None
    with open(_path(layout, START_LOCK), "a+") as serial:
        fcntl.flock(serial, fcntl.LOCK_EX)
        if boot:
            touch_seen(layout)
        current = info(layout)
        if current and not current["alive"] and current["state"] == PipelineState.INTERRUPTED.value:
            counted = read_json(_path(layout, REVIVED)) or {}
            count = counted.get("count", 0) if counted.get("digest") == current["digest"] else 0
            if count >= REVIVALS:
                if not counted.get("notified"):  # the user is told once that it needs them
                    write_json(_path(layout, REVIVED), {**counted, "notified": True})
                    faults.point("revive.notified")
                    why = f"revived {count} times since the last fab command"
                    notify.start(layout, {"kind": "gave-up", "state": "interrupted", "why": why})
                return current
            write_json(_path(layout, REVIVED), {"digest": current["digest"], "count": count + 1})
            faults.point("revive.counted")
        return _revived(layout, current)


def _revived(layout: Layout, current: dict | None) -> dict | None:
    """`current` with its dead driver started again where one is needed: a new pass for a pipeline it left
    mid-way, the wait alone for one that was done and waiting to shut the VM down."""
    if not current or current["alive"]:
        return current
    autostop_only = waiting_to_autostop(current)
    if not autostop_only and current["state"] != PipelineState.INTERRUPTED.value:
        return current
    try:
        return {**_spawn(layout, autostop_only), "alive": True, "revived": True}
    except RuntimeError as err:
        return {**current, "error": str(err)}


def keep_reviving(layout: Layout) -> None:
    """The crontab lines that run `revive` (added once, the user's own lines kept). Without cron (a host
    given with -H may have none), nothing: its fab commands still wake the driver."""
    tool, state = shlex.quote(os.path.abspath(__file__)), shlex.quote(os.path.abspath(layout.root))
    lines = [CRON_LINE.format(when=when, tool=tool, state=state, boot=boot) for when, boot in CRON_TIMES]
    import subprocess  # here, not above: every fab command starts this tool, and few start a pipeline

    ours = CRON_LINE.rsplit("#", 1)[1]
    try:
        listed = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
        have = listed.stdout if listed.returncode == 0 else ""
        if all(line in have.splitlines() for line in lines):
            return
        # this state folder's old lines replaced; the user's own, and another state folder's, kept
        kept = [line for line in have.splitlines() if not (line.endswith(ours) and f" revive {state}" in line)]
        text = "\n".join([*kept, *lines]) + "\n"
        subprocess.run(["crontab", "-"], input=text, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return


def hold(layout: Layout, until=None) -> int:
    """Autostop waits while a fab command uses the VM: in-use.lock held shared (the shutdown takes it alone)
    until `until` returns (stdin's end: fab closed it, or its connection dropped); the idle time counts from
    then."""
    os.makedirs(layout.pipeline, mode=0o700, exist_ok=True)
    with open(_path(layout, IN_USE), "a+") as use:
        fcntl.flock(use, fcntl.LOCK_SH)
        touch_seen(layout)
        print("held", flush=True)
        (until or sys.stdin.buffer.read)()
        touch_seen(layout)
    return 0


def _seen(layout: Layout) -> float:
    """When a fab command was last here (0: never)."""
    try:
        return os.path.getmtime(_path(layout, SEEN))
    except FileNotFoundError:
        return 0


def touch_seen(layout: Layout) -> None:
    with open(_path(layout, SEEN), "a"):
        pass
    os.utime(_path(layout, SEEN))


class _Lines:
    """One followed job's log as numbered lines: `(log, n)` names a line, so a watcher that is sent the
    same log again (after a driver restarted) shows each line once."""

    def __init__(self, job_dir: str):
        self.reader = joblog.LogReader(job_dir)
        self.pending, self.number, self.inode = b"", 0, None

    def items(self, job: str, final: bool = False) -> Iterator[dict]:
        """The lines of one more chunk (of all the rest, chunk by chunk, when `final`)."""
        for chunk in self.reader.rest() if final else [self.reader.read() or b""]:
            if self.reader.inode != self.inode:  # a fresh attempt's log: numbered from its start
                self.pending, self.number, self.inode = b"", 0, self.reader.inode
            *complete, self.pending = LINE_END.split(self.pending + chunk)
            if len(self.pending) > MAX_LINE:
                complete, self.pending = [*complete, self.pending], b""
            yield from (self._item(job, line) for line in complete)
        if final and self.pending:
            yield self._item(job, self.pending)
            self.pending = b""

    def _item(self, job: str, line: bytes) -> dict:
        self.number += 1
        return {"job": job, "log": self.inode, "n": self.number, "line": line.decode(errors="replace")}


def follow(layout: Layout, out=None) -> int:
    """Stream the pipeline's events, each started job's log lines interleaved, until the pipeline ends.

    A job's remaining lines come before its end event, so whoever reads sees its whole log
    first. Ends after the `finished` event (sent from driver.json when the driver died between
    saving the end and saying it), with `driver-lost` when the driver died mid-pipeline, or with
    `replaced` when another fab command started a new pass.
    """
    out = out or sys.stdout
    path, logs, last_seen = _path(layout, EVENTS), {}, 0.0
    plan = read_json(_path(layout, PLAN)) or {"jobs": []}
    folders = {job["name"]: os.path.expanduser(job["job_dir"]) for job in plan["jobs"]}
    events = None  # this pass's events file, held open: its identity cannot pass to a new file meanwhile

    def send(items) -> None:
        for item in items:  # one at a time: a long log is never held whole
            out.write(json.dumps(item) + "\n")

    with contextlib.ExitStack() as held:
        while True:
            if time.monotonic() - last_seen > SEEN_EVERY_SECONDS:
                touch_seen(layout)
                last_seen = time.monotonic()
            record = info(layout)
            if events is None and os.path.exists(path):
                events = held.enter_context(open(path, "rb"))
            if events is not None and not _same_file(events, path):  # another fab started a new pass
                send([{"event": "replaced", "record": record}])
                return 0
            text = events.read(READ_EVENTS) if events is not None else b""
            complete = text[: text.rfind(b"\n") + 1]
            if events is not None:
                events.seek(len(complete) - len(text), os.SEEK_CUR)  # a half-written line is read again, whole
            for line in complete.decode().splitlines():
                event = json.loads(line)
                job = event.get("job")
                if event["event"] == "decide" and event["action"] != Action.SKIP.value and job in folders:
                    logs[job] = _Lines(folders[job])
                if event["event"] == "end" and job in logs:
                    send(logs.pop(job).items(job, final=True))
                send([event])
                if event["event"] == "finished":
                    out.flush()
                    return 0
            busy = bool(complete)
            for job, log in logs.items():
                items = list(log.items(job))  # one chunk's lines
                busy |= bool(items)
                send(items)
            out.flush()
            if not busy and record and not record["alive"]:
                for job, log in logs.items():
                    send(log.items(job, final=True))
                if record["state"] == PipelineState.INTERRUPTED.value:
                    send([{"event": "driver-lost", "record": record}])
                else:  # it saved the pipeline's end and died before it said so: the end is known
                    send([{"event": "finished", "state": record["state"], "failed": record.get("failed", {})}])
                out.flush()
                return 0
            if not busy:  # the driver's end (its last event written) is read at once
                processes.wait_for_an_end([record], joblog.FOLLOW_POLL_SECONDS)


def _same_file(handle, path: str) -> bool:
    """`path` still names the file `handle` reads (not one that replaced it)."""
    try:
        now, held = os.stat(path), os.fstat(handle.fileno())
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def main(argv: list[str]) -> int:
    os.umask(0o077)
    command, args = (argv[0], argv[1:]) if argv else ("help", [])
    if command not in ("start", "follow", "wake", "revive", "hold", "run", "runs") or not args:
        print(__doc__, file=sys.stderr)
        return 64
    layout = Layout(os.path.expanduser(args[0]))
    try:
        if command == "run":
            return run(layout, "--autostop" in args[1:])
        if command == "hold":
            return hold(layout)
        if command == "runs":
            print(json.dumps(inventory.runs(layout, json.loads(args[1]))))
            return 0
        if command in ("wake", "revive"):
            record = wake(layout) if command == "wake" else revive(layout, "--boot" in args[1:])
            print(json.dumps(record))
            return 0
        if command == "start":
            code, answer = start(layout, sys.stdin.read())
            print(json.dumps(answer), flush=True)
            return follow(layout) if code == 0 and "--follow" in args else code
        return follow(layout)
    except BrokenPipeError:
        return 0  # the watcher went away: the pipeline goes on
    except RuntimeError as err:
        print(str(err), file=sys.stderr)
        return 1
    except OSError as err:
        return jobrunner.os_error(command, err)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
