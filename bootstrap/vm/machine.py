"""The VM as fab sees it: a narrow interface over one SSH connection.

install, prepare, drive, states and follow are all a command needs; each is one call
to the VM's side (bootstrap/remote/: facts.py answers a command's first look, jobrunner.py
owns the job protocol, driver.py the pipeline), which goes on without fab. Commands run on raw SSH channels (one round trip
each, output read in full only for short commands; a followed log or a pipeline's
events stream in chunks, so memory stays bounded).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from fabric import Connection
from rich.console import Console

from ..errors import UserError, VmUnavailable
from ..remote import gcs, jobrunner, manifest
from ..remote.jobrunner import JobState, Layout
from ..results import transfer
from . import startup
from .output import Cleaner, lines

REMOTE_SCRIPTS = Path(jobrunner.__file__).parent
TOOLS = (
    "jobrunner.py",
    "joblog.py",
    "processes.py",
    "preflight.py",
    "graph.py",
    "gcs.py",
    "retry.py",
    "faults.py",
    "driver.py",
    "folders.py",
    "notify.py",
    "inventory.py",
    "evals.py",
    "maxtext_check.py",
    "envcheck.py",
    "attempts.py",
    "eval_recorder.py",
    "maxtext_run.py",
    "wandb_run.py",
    "preempted.py",
    "hub_upload.py",
    "gcs_upload.py",
    "export_config.py",
    "envcache.py",
    "manifest.py",
    "task_processor.py",
    "task_rewards.py",
    "health.py",
    "health_hooks.py",
    "eval_sample.py",
    "grader_worker.py",
)
FACTS_COMMAND = shlex.join(["python3", "-I", "-c", (REMOTE_SCRIPTS / "facts.py").read_text()])  # answers `ask`
CHUNK = 64 * 1024
IDLE_SECONDS = 5
COMMAND_TIMEOUT_SECONDS = 120
STARTUP_WAIT_SECONDS = 30 * 60
STARTUP_UNREAD_SECONDS = 60  # how long the startup script's state may fail to be read before that is the error


class ConnectionLost(VmUnavailable):
    """The SSH connection broke in the middle of a command."""


@dataclass(frozen=True)
class JobStatus:
    """A job's state on the VM and the facts behind it."""

    state: JobState
    log: str = ""
    started: float | None = None
    finished: float | None = None
    exit_code: int | None = None
    error: str | None = None
    outputs: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """As jobrunner.job_state writes it."""
        return {
            "state": self.state.value,
            "log": self.log,
            "started": self.started,
            "finished": self.finished,
            "exit_code": self.exit_code,
            "error": self.error,
            "outputs": self.outputs,
            "missing": self.missing,
        }

    @classmethod
    def from_json(cls, data: dict) -> JobStatus:
        return cls(
            JobState(data["state"]),
            data.get("log", ""),
            data.get("started"),
            data.get("finished"),
            data.get("exit_code"),
            data.get("error"),
            data.get("outputs") or [],
            data.get("missing") or [],
        )


def _exec(conn: Connection, command: str, timeout: float) -> paramiko.Channel:
    """`command` started on a channel of its own (closed again when it could not start)."""
    transport = conn.client.get_transport() if conn.is_connected else None
    if transport is None or not transport.is_active():
        raise EOFError("the SSH transport is closed")
    channel = transport.open_session(timeout=timeout)
    try:
        channel.settimeout(timeout)
        channel.exec_command(command)
    except BaseException:
        channel.close()
        raise
    return channel


def start_asking(conn: Connection) -> paramiko.Channel | None:
    """facts.py started before its request is known (vm/dial.py): it waits on stdin, and changes nothing on
    the VM until the request comes. None when that failed: the first `ask` then starts it and says why."""
    try:
        return _exec(conn, FACTS_COMMAND, COMMAND_TIMEOUT_SECONDS)
    except (OSError, EOFError, paramiko.SSHException):
        return None


class Vm:
    """One VM over one SSH connection, in tpu-rl's terms."""

    def __init__(
        self, conn: Connection, layout: Layout, cleaner: Cleaner | None = None, asking: paramiko.Channel | None = None
    ):
        self.conn = conn
        self.layout = layout
        self.clean = cleaner or Cleaner()
        self.asking = asking  # facts.py started ahead of its request (start_asking): the first `ask`'s channel
        self.pipeline: dict | None = None  # the VM's pipeline as `install` found it (driver.py's record)
        self.read_ahead: tuple[tuple[str, ...], list[JobStatus]] | None = None  # job states `install` read
        self.runs_ahead: dict | None = None  # the runs `install` listed (driver.py runs)
        # what `install` found, for `prepare` and `fab status`
        self.facts: dict = {"digests": {}, "modes": {}, "startup": startup.Startup(startup.StartupState.RUNNING)}

    @property
    def name(self) -> str:
        return self.conn.host

    @property
    def identity(self) -> str:
        """This VM as a run record names it: its host and its state folder."""
        return f"{self.name}:{self.layout.root}"

    # --- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _io(self) -> Iterator[None]:
        """Turn a broken connection into one line."""
        try:
            yield
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise ConnectionLost(
                f"lost the connection to {self.name} ({err or type(err).__name__}). Anything started on the VM goes on; "
                "run the same command again"
            ) from None

    def _sftp(self) -> paramiko.SFTPClient:
        """The SFTP session that carries tpu-rl's tools, the token and downloads."""
        try:
            return self.conn.sftp()
        except (OSError, EOFError, paramiko.SSHException) as err:
            transport = self.conn.client.get_transport() if self.conn.is_connected else None
            if not isinstance(err, paramiko.SSHException) or transport is None or not transport.is_active():
                with self._io():  # the connection itself is gone: one line, as everywhere
                    raise
            raise UserError(
                f"{self.name} offers no SFTP ({err}); fab copies its tools and the token over SFTP: enable sshd's "
                "`Subsystem sftp` (on by default in Debian and Ubuntu's sshd_config)"
            ) from None

    def _open(self, command: str, timeout: float) -> paramiko.Channel:
        started, self.asking = self.asking, None
        if started is not None and command == FACTS_COMMAND and not (started.closed or started.exit_status_ready()):
            return started  # started ahead and still waiting for its request (a facts.py that ended: started again)
        if started is not None:
            started.close()
        with self._io():
            return _exec(self.conn, command, timeout)

    def execute(
        self, command: str, stdin: bytes | None = None, meanwhile: Callable[[], None] | None = None
    ) -> tuple[int, str, str]:
        """A short command: (exit code, stdout, stderr), in one round trip; `meanwhile` is called once the
        request is sent, while the VM answers (it must not raise: its error would read as the connection lost)."""
        channel = self._open(command, COMMAND_TIMEOUT_SECONDS)
        with self._io():
            try:
                if stdin is not None:
                    channel.sendall(stdin)
                channel.shutdown_write()
                if meanwhile is not None:
                    meanwhile()
                out = channel.makefile("rb").read()
                err = channel.makefile_stderr("rb").read()
                status = channel.recv_exit_status()
                if status == -1:  # closed without an exit status: the connection went, not the command
                    raise EOFError("the SSH channel closed before the command's exit status came")
                return status, out.decode(errors="replace"), err.decode(errors="replace")
            finally:
                channel.close()

    def check(
        self, command: str, what: str, stdin: bytes | None = None, meanwhile: Callable[[], None] | None = None
    ) -> str:
        code, out, err = self.execute(command, stdin, meanwhile)
        if code != 0:
            raise UserError(f"{self.name}: {what} failed (exit {code}): {self.clean(err.strip()[-500:])}")
        return out

    def runner(self, *args: str, tool: str = "jobrunner.py") -> str:
        """A subcommand of one of tpu-rl's tools on the VM (jobrunner.py by default), run by its system python3."""
        return shlex.join(["python3", self.layout.tool(tool), *args])

    # --- the interface ------------------------------------------------------------------------

    def ask(self, request: dict, what: str, meanwhile: Callable[[], None] | None = None) -> dict:
        """The VM's answer to `request` (remote/facts.py, sent with the command), in one round trip; `meanwhile`
        runs while the VM answers (execute)."""
        out = self.check(FACTS_COMMAND, what, json.dumps(request).encode(), meanwhile)
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            raise UserError(
                f"{self.name}: {what}: the VM's answer was not JSON: {self.clean(out.strip()[-300:])}"
            ) from None

    def install(
        self,
        secrets: dict[str, str] | None = None,
        startup_marker: str = "",
        read_ahead: tuple[str, ...] = (),
        runs: dict | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> str | None:
        """One round trip: the private state folder, tpu-rl's tools put only when they changed, the pipeline
        woken (a fab command is here: autostop waits again, a driver that died starts again), what `prepare`
        needs to know (the stored secrets' hashes and modes, the startup script's marker), the states of
        the job folders `read_ahead` names (the run this machine expects: `states` then needs no round trip),
        and with a `runs` request, every run the VM and its bucket hold (`runs` then needs none).

        Returns the VM's current run (the one later commands continue), if any; keeps the pipeline's state.
        `meanwhile` runs once the request is sent: the command's own work while the VM answers.
        """
        tools = {tool: hashlib.sha256((REMOTE_SCRIPTS / tool).read_bytes()).hexdigest() for tool in TOOLS}
        layout = self.layout
        private = [layout.root, layout.bin, layout.secrets]
        state = {"root": layout.root, "private": private, "bin": layout.bin, "current_run": layout.current_run}
        # woken only with these tools (never an old driver), and only then with the job states and the runs
        request = {"state": state, "tools": tools, "read_ahead": list(read_ahead)}
        if runs is not None:
            request["runs"] = runs
        secret_paths = [f"{layout.secrets}/{name}" for name in secrets or {}]
        found = self.ask(
            {**request, "secrets": secret_paths, **self._startup_request(startup_marker)},
            "preparing the state folder",
            meanwhile,
        )
        self.facts = {
            "digests": {path: fact["digest"] for path, fact in found["secrets"].items()},
            "modes": {path: fact["mode"] for path, fact in found["secrets"].items()},
            "startup": startup.parse(found.get("startup", "")),
            "booted": found.get("booted"),  # with a startup marker: a VM's boot, where goodput's paid time begins
        }
        if changed := [tool for tool in TOOLS if found["tools"].get(tool) != tools[tool]]:
            sftp = self._sftp()
            for tool in changed:  # beside, then renamed: a tool starting meanwhile reads the old or the new, whole
                target = self._sftp_path(f"{layout.bin}/{tool}")
                beside = f"{target}.{uuid.uuid4().hex[:12]}.new"  # its own: another fab may put one at once
                with self._io():
                    sftp.put(str(REMOTE_SCRIPTS / tool), beside)
                    sftp.posix_rename(beside, target)
            state["put"] = changed
            found |= self.ask(request, "waking the pipeline")  # the woken pipeline as these tools see it
            if found["tools"] != tools:
                raise UserError(
                    f"{self.name}: tpu-rl's tools in {layout.bin} changed again as they were put there (another fab "
                    "of another version at the same time?); run the command again"
                )
        self.pipeline = found.get("pipeline")
        if read_ahead and "states" in found:  # read with the wake
            self.read_ahead = (tuple(read_ahead), [JobStatus.from_json(item) for item in found["states"]])
        self.runs_ahead = found.get("runs")
        return found["current_run"]

    def _startup_request(self, marker: str) -> dict:
        """facts.py's request for the startup script's state (nothing without a marker)."""
        return {"startup": {"marker": marker, "failure_record": startup.failure_record(marker)}} if marker else {}

    def prepare(self, secrets: dict[str, str], startup_marker: str) -> tuple[list[str], bool]:
        """The secrets stored on the VM where `install` found them missing, changed or too widely readable.

        Returns what changed (one line each) and whether the startup script has finished. No round
        trip when nothing changed; secrets travel inside the SFTP stream, never on a command line.
        """
        done = []
        for name, value in secrets.items():
            path = f"{self.layout.secrets}/{name}"
            if self.facts["digests"].get(path) == hashlib.sha256(value.encode()).hexdigest():
                if self.facts["modes"].get(path) != "600":  # a file found with a wider mode is fixed, not refused
                    with self._io():
                        self._sftp().chmod(self._sftp_path(path), 0o600)
                continue
            with self._io(), self._sftp().open(self._sftp_path(path), "w") as f:
                f.chmod(0o600)
                f.write(value.encode())
            done.append(f"stored {name} (readable only by the SSH user)")
        return done, self.facts["startup"].state is startup.StartupState.DONE

    def put_task(self, folder: str, uploads: dict[str, Path], spec: dict, digest: str) -> list[str]:
        """A task's files in its folder on the VM (named by their digest: once there, never sent again), its
        task.json last, then the mark that it is whole; what was sent, in one line (none when it was there)."""
        marker = f"{folder}/.complete"
        q = shlex.quote
        made = self.check(
            f'umask 077; if [ "$(cat {q(marker)} 2>/dev/null)" = {q(digest)} ]; then echo there; else '
            f"mkdir -p {q(folder)}/data && echo made; fi",
            f"preparing the task's folder {folder}",
        ).strip()
        if made == "there":
            return []
        sent = 0
        with self._io():
            sftp = self._sftp()
            for name, local in uploads.items():
                sftp.put(str(local), self._sftp_path(f"{folder}/{name}"))
                sent += local.stat().st_size
            for name, text in (("task.json", json.dumps(spec, indent=1)), (".complete", digest)):
                with sftp.open(self._sftp_path(f"{folder}/{name}"), "w") as f:
                    f.write(text.encode())
        return [f"sent the task's {len(uploads)} files ({sent / 2**20:.1f} MiB) to {folder}"]

    def _sftp_path(self, path: str) -> str:
        """SFTP starts in the home folder; `~/x` and `x` both mean the same file there."""
        return path[2:] if path.startswith("~/") else path

    def states_read_ahead(self, job_dirs: list[str]) -> list[JobStatus] | None:
        """The jobs' states as `install` read them, if it read every one of these folders; no round trip.
        Read once: later states are read again."""
        ahead, self.read_ahead = self.read_ahead, None
        known = dict(zip(*ahead, strict=True)) if ahead else {}
        return [known[job_dir] for job_dir in job_dirs] if all(d in known for d in job_dirs) else None

    def states(self, job_dirs: list[str]) -> list[JobStatus]:
        """The jobs' states: read with `install` when it read these folders ahead, else in one round trip."""
        if (ahead := self.states_read_ahead(job_dirs)) is not None:
            return ahead
        out = self.check(self.runner("status", *job_dirs), "reading job state")
        return [JobStatus.from_json(item) for item in json.loads(out)]

    def runs_command(self, request: dict) -> str:
        return self.runner("runs", self.layout.root, json.dumps(request), tool="driver.py")

    def runs(self, request: dict) -> dict:
        """Every run the VM's state folder and its bucket hold (driver.py runs): read with `install` when it
        listed them, else in one round trip."""
        ahead, self.runs_ahead = self.runs_ahead, None
        if ahead is not None:
            return ahead
        return json.loads(self.check(self.runs_command(request), "listing the runs"))

    def follow(
        self, job_dir: str, on_line: Callable[[str], None], on_idle: Callable[[], None] = lambda: None, tail=False
    ) -> None:
        """Hand each log line (cleaned) to `on_line` until the job is no longer running."""
        channel = self._open(
            self.runner("follow", job_dir, *(["--tail"] if tail else []), tool="joblog.py"), IDLE_SECONDS
        )
        try:
            for line in lines(self._chunks(channel, on_idle)):
                on_line(self.clean(line))
        finally:
            channel.close()

    def _chunks(self, channel: paramiko.Channel, on_idle: Callable[[], None]) -> Iterator[bytes]:
        """What a streaming command writes, as it comes; `on_idle` whenever it was quiet for IDLE_SECONDS."""
        while True:
            with self._io():
                try:
                    data = channel.recv(CHUNK)
                except TimeoutError:
                    on_idle()
                    continue
            if not data:  # the end, or the connection gone: a channel closed without an exit status
                if channel.status_event.wait(IDLE_SECONDS) and channel.exit_status == -1:
                    with self._io():
                        raise EOFError("the SSH channel closed before the command's exit status came")
                return
            yield data

    def drive(
        self, plan: dict | None, follow: bool = True, on_idle: Callable[[], None] = lambda: None
    ) -> Iterator[dict]:
        """Hand the pipeline `plan` to the VM's driver (or, with None, watch the one that runs).

        Yields the driver's answer first ({"started"|"attached"|"busy": its record}), then, with
        `follow`, the pipeline's events and its jobs' log lines (cleaned) until the pipeline ends.
        """
        if plan is None:
            command = self.runner("follow", self.layout.root, tool="driver.py")
        else:
            command = self.runner("start", self.layout.root, *(["--follow"] if follow else []), tool="driver.py")
        channel = self._open(command, IDLE_SECONDS)
        try:
            if plan is not None:
                with self._io():
                    channel.sendall(json.dumps(plan).encode())
                    channel.shutdown_write()
            said = False
            for line in lines(self._chunks(channel, on_idle)):
                said = True
                try:
                    item = json.loads(self.clean(line))  # events too: an error the driver quotes is redacted
                except json.JSONDecodeError:
                    raise UserError(f"{self.name}: the pipeline driver said: {self.clean(line)[:500]}") from None
                if "line" in item:
                    item["line"] = self.clean(item["line"])
                yield item
            if not said:  # the driver could not even answer: its own one line says why
                with self._io():
                    why = channel.makefile_stderr("rb").read().decode(errors="replace").strip()
                raise UserError(f"{self.name}: the pipeline driver: {self.clean(why[-1500:]) or 'no answer'}")
        finally:
            channel.close()

    # --- reading results ------------------------------------------------------------------------

    def tail(self, job_dir: str, count: int, name: str = jobrunner.LOG) -> list[str]:
        """The last lines of a job's log (or another file of its folder), cleaned like followed output."""
        code, out, _ = self.execute(self.runner("tail", job_dir, str(count), name, tool="joblog.py"))
        return [self.clean(line) for line in lines([out.encode()])]

    def wait_for_startup(self, marker: str, log: str, console: Console) -> None:
        """Wait for the startup script's marker, showing its log meanwhile; a failure record ends the wait
        at once, in one line with the failed step and the log's last lines."""
        offset, deadline, last_lines = 0, time.monotonic() + STARTUP_WAIT_SECONDS, deque(maxlen=5)
        said, unread_since = False, None
        while True:
            request = {**self._startup_request(marker), "log": {"path": log, "offset": offset}}
            try:
                found = self.ask(request, "reading the startup script's state")
                unread_since = None
            except ConnectionLost:
                raise
            except UserError:  # the script's apt upgrade may be replacing python3 itself: looked at again, for a while
                unread_since = unread_since or time.monotonic()
                if time.monotonic() - unread_since > STARTUP_UNREAD_SECONDS:
                    raise
                found = {"startup": "startup running", "log": {"text": "", "end": offset}}
            state = startup.parse(found["startup"])
            if state.state is startup.StartupState.DONE:
                return
            if not said and state.state is startup.StartupState.RUNNING:
                console.print(f"{self.name}: waiting for the startup script ({marker})")
                said = True
            offset = found["log"]["end"]
            for line in lines([found["log"]["text"].encode()]):
                last_lines.append(self.clean(line))
                if state.state is startup.StartupState.RUNNING:
                    console.print(f"  startup | {last_lines[-1]}", markup=False, highlight=False)
            if state.state is startup.StartupState.FAILED:
                raise startup.failed(self.name, state, log, list(last_lines))
            if time.monotonic() > deadline:
                raise UserError(
                    f"{self.name}: the startup script did not finish in {STARTUP_WAIT_SECONDS // 60} min; see {log}"
                )
            time.sleep(2)

    def list_files(self, directory: str) -> dict[str, int]:
        """Files below `directory` (relative path -> size); empty if it does not exist."""
        code, out, _ = self.execute(f"cd {shlex.quote(directory)} 2>/dev/null && find . -type f -printf '%s\\t%P\\0'")
        return {path: int(size) for size, path in (entry.split("\t", 1) for entry in out.split("\0") if entry)}

    def where(self, path: str) -> str:
        """How fab names a path it reads: in the bucket, or on this VM."""
        return path if gcs.is_gcs(path) else f"{self.name}:{path}"

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """While fab uses the VM for long (a download), its autostop waits: driver.py's `hold` holds the VM's
        in-use lock until this channel closes (here, or with the connection)."""
        channel = self._open(self.runner("hold", self.layout.root, tool="driver.py"), COMMAND_TIMEOUT_SECONDS)
        try:
            with self._io():
                said = channel.makefile("rb").readline().strip()
            if said != b"held":
                with self._io():
                    why = channel.makefile_stderr("rb").read().decode(errors="replace").strip()
                raise UserError(
                    f"{self.name}: could not keep the VM from autostop: {self.clean(why[-500:]) or 'no answer'}"
                )
            yield
        finally:
            channel.close()

    def download(
        self, directory: str, local: Path, on_file: transfer.OnFile = lambda p, s: None, required: bool = True
    ) -> dict[str, int]:
        """Copy a folder that grows in place (TensorBoard events); one in the bucket is first copied onto the
        VM, which reads the bucket with its service account. The VM does not autostop meanwhile."""
        with self.in_use():
            readable = self.readable(directory)
            if readable != directory and not self.list_files(readable) and required:
                raise UserError(f"nothing to download in {directory}")
            return transfer.download(self, readable, local, on_file, required)

    def readable(self, directory: str) -> str:
        """Where fab reads `directory` on the VM: the folder itself once checked to be the SSH user's alone, or a
        bucket's folder copied onto the VM first (the VM reads the bucket with its service account)."""
        if not gcs.is_gcs(directory):
            self.trusted(directory)
            return directory
        staging = self.layout.from_bucket(directory)
        self.check(self.runner("copy-down", directory, staging), f"copying {directory} onto the VM")
        return staging

    def download_verified(
        self, directory: str, local: Path, on_file: transfer.OnFile = lambda p, s: None, made_by: str | None = None
    ) -> dict[str, int]:
        """Copy an export, every file verified against its SHA256SUMS (transfer.download_verified), that
        SHA256SUMS the one its job (`made_by`, a job folder) sealed when it verified the export, if it sealed one;
        the VM does not autostop meanwhile."""
        with self.in_use():
            seals = self.trusted(directory, made_by)
            # An export made before seals were kept has none: its files are still checked against its SHA256SUMS,
            # in a folder no other account can write.
            sealed = next((digest for path, digest in seals.items() if path.endswith(f"/{manifest.NAME}")), None)
            return transfer.download_verified(self, directory, local, on_file, sealed)

    def trusted(self, folder: str, made_by: str | None = None) -> dict[str, str]:
        """Refuse to read `folder` again unless it is the SSH user's alone and the job that made it (a job
        folder) is done with its sealed outputs unchanged (jobrunner's `trusted`); its seals."""
        args = [folder, made_by] if made_by else [folder]
        out = self.check(self.runner("trusted", *args), f"checking {folder} before reading it")
        return json.loads(out or "{}")

    def read_text(self, path: str) -> str | None:
        with self._io():
            try:
                with self._sftp().open(self._sftp_path(path)) as f:
                    return f.read().decode("utf-8", "replace")
            except FileNotFoundError:
                return None

    def fetch(self, path: str, target: Path) -> None:
        with self._io():
            try:
                self._sftp().get(self._sftp_path(path), str(target))
            except FileNotFoundError:
                raise UserError(f"{self.name}:{path}: not on the VM") from None

    def read_json(self, path: str) -> dict:
        """A small JSON file the VM wrote (a marker); {} if it is missing or unreadable."""
        code, out, _ = self.execute(f"cat {shlex.quote(path)}")
        try:
            return json.loads(out) if code == 0 else {}
        except json.JSONDecodeError:
            return {}
