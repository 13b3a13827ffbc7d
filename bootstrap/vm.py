"""One worker of the TPU VM, seen over SSH: files, the job runner, the lock, log streams.

Every command here is short and returns little output, except `stream`, which reads
a remote command's output in fixed-size chunks so that following a log of any
length uses bounded memory (a Fabric `run` would keep all of it).
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fabric import Connection
from invoke.runners import Result

from .errors import UserError

REMOTE_SCRIPTS = Path(__file__).with_name("remote")
CHUNK = 64 * 1024
MAX_LINE = 1024 * 1024
IDLE_SECONDS = 5
LOCK_PING_SECONDS = 20  # the VM side lets go after 90 s without one


class Worker:
    def __init__(self, conn: Connection, index: int, state_dir: str):
        self.conn = conn
        self.index = index
        self.state_dir = state_dir.rstrip("/")
        self.runner = f"{self.state_dir}/bin/jobrunner.py"

    @property
    def name(self) -> str:
        return self.conn.host

    def run(self, command: str, **kwargs) -> Result:
        """A short remote command; its output is captured, never shown."""
        return self.conn.run(command, hide=True, warn=True, in_stream=False, **kwargs)

    def check(self, command: str, what: str) -> str:
        result = self.run(command)
        if not result.ok:
            raise UserError(f"{self.name}: {what} failed (exit {result.exited}): {result.stderr.strip()[-500:]}")
        return result.stdout

    def put_text(self, path: str, text: str) -> None:
        self.conn.put(io.BytesIO(text.encode()), remote=path)

    def install_scripts(self) -> None:
        """Copy the VM-side scripts (small; done on every command so they always match)."""
        self.check(f"mkdir -p {shlex.quote(self.state_dir)}/bin", "creating the state directory")
        for script in ("jobrunner.py", "maxtext_check.py", "hub_upload.py", "gcs_upload.py"):
            self.conn.put(str(REMOTE_SCRIPTS / script), remote=f"{self.state_dir}/bin/{script}")

    def runner_command(self, *args: str) -> str:
        """A jobrunner.py subcommand, run by the VM's system python3."""
        return shlex.join(["python3", self.runner, *args])

    def tool(self, *args: str, stdin: str | None = None) -> Result:
        command = self.runner_command(*args)
        if stdin is not None:
            command = f"printf %s {shlex.quote(stdin)} | {command}"
        return self.run(command)

    def put_secret(self, name: str, value: str) -> bool:
        """Store a secret in a file only the SSH user can read; True if it changed.

        The value travels inside the SFTP stream, never on a command line.
        """
        directory = f"{self.state_dir}/secrets"
        path = f"{directory}/{name}"
        digest = hashlib.sha256(value.encode()).hexdigest()
        current = self.run(f"sha256sum {shlex.quote(path)} 2>/dev/null").stdout.split()
        if current[:1] == [digest]:
            return False
        self.check(
            f"umask 077 && mkdir -p {shlex.quote(directory)} && chmod 700 {shlex.quote(directory)} && : > {shlex.quote(path)} && chmod 600 {shlex.quote(path)}",
            f"preparing the {name} file",
        )
        self.conn.put(io.BytesIO(value.encode()), remote=path)
        return True

    def job_states(self, job_dirs: list[str]) -> list[dict]:
        return json.loads(self.check(self.runner_command("status", *job_dirs), "reading job state"))

    def launch(self, job_dir: str, spec: dict) -> None:
        """Start a job detached from this SSH session: it survives a dropped connection."""
        quoted = shlex.quote(job_dir)
        self.check(
            f"mkdir -p {quoted} && cd {quoted} && rm -f result.json done runner.json"
            f" && if [ -s log ]; then mv log log.$(date +%s); fi",
            "preparing the job directory",
        )
        self.put_text(f"{job_dir}/spec.json", json.dumps(spec, indent=1))
        self.check(
            f"setsid nohup {self.runner_command('run', job_dir)} </dev/null >>{quoted}/runner.err 2>&1 &",
            "starting the job",
        )

    def stream(self, command: str, on_line: Callable[[str], None], on_idle: Callable[[], None] = lambda: None) -> int:
        """Run `command`, handing each output line to `on_line`; memory stays bounded.

        `on_idle` runs whenever no output came for IDLE_SECONDS (a silent step still shows it is alive).
        """
        self.conn.open()
        channel = self.conn.client.get_transport().open_session()
        channel.settimeout(IDLE_SECONDS)

        def chunks() -> Iterator[bytes]:
            while True:
                try:
                    data = channel.recv(CHUNK)
                except TimeoutError:
                    on_idle()
                    continue
                if not data:
                    return
                yield data

        try:
            channel.exec_command(command)
            for line in _lines(chunks()):
                on_line(line)
            return channel.recv_exit_status()
        finally:
            channel.close()

    def follow(
        self,
        job_dir: str,
        on_line: Callable[[str], None],
        on_idle: Callable[[], None] = lambda: None,
        from_start: bool = True,
    ) -> int:
        """Stream a job's log until the job ends (tail stops when the runner exits)."""
        q = shlex.quote(job_dir)
        start = "-c +1" if from_start else "-n 20"
        return self.stream(
            f"cd {q} && if [ -f result.json ] || [ ! -f runner.json ]; then cat log 2>/dev/null; "
            f'else tail {start} -F --pid=$(python3 -c \'import json;print(json.load(open("runner.json"))["pid"])\') log 2>/dev/null; fi',
            on_line,
            on_idle,
        )

    def list_files(self, directory: str) -> dict[str, int]:
        """Files below `directory` (relative path -> size); empty if it does not exist."""
        output = self.run(f"cd {shlex.quote(directory)} 2>/dev/null && find . -type f -printf '%s\\t%P\\n'").stdout
        return {path: int(size) for size, path in (line.split("\t", 1) for line in output.splitlines())}

    def download(
        self, directory: str, local: Path, on_file: Callable[[str, int], None] = lambda p, s: None
    ) -> dict[str, int]:
        """Copy a remote folder file by file; files already here at the same size are kept (resumable).

        Each file lands under a .part name and is renamed only when complete.
        """
        files = self.list_files(directory)
        if not files:
            raise UserError(f"{self.name}: nothing to download in {directory}")
        for path, size in sorted(files.items()):
            target = local / path
            if target.exists() and target.stat().st_size == size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".part")
            self.conn.get(f"{directory}/{path}", local=str(partial))
            partial.replace(target)
            on_file(path, size)
        wrong = [p for p, size in files.items() if (local / p).stat().st_size != size]
        if wrong:
            raise UserError(f"downloaded sizes differ from the VM for {', '.join(wrong)}; run the command again")
        return files

    def log_tail(self, job_dir: str, lines: int = 30) -> str:
        return self.run(f"tail -n {lines} {shlex.quote(job_dir)}/log").stdout

    @contextmanager
    def lock(self, owner: str) -> Iterator[None]:
        """Hold the VM's lock for as long as this SSH connection lives.

        The remote holder exits when the channel closes, so a killed `fab` or a dropped
        connection releases the lock by itself.
        """
        self.conn.open()
        channel = self.conn.client.get_transport().open_session()
        channel.exec_command(self.runner_command("lock", self.state_dir, owner))
        answer = b""
        while not answer.endswith(b"\n"):
            data = channel.recv(1024)
            if not data:
                break
            answer += data
        text = answer.decode().strip()
        if text != "locked":
            channel.close()
            holder = text.removeprefix("busy: ") or f"exit {channel.recv_exit_status()}"
            raise UserError(f"{self.name}: another fab command holds the VM ({holder}); wait for it or stop it first")
        stop = threading.Event()

        def ping() -> None:  # proves to the holder that this fab is still there
            while not stop.wait(LOCK_PING_SECONDS):
                try:
                    channel.sendall(b"\n")
                except OSError:
                    return

        threading.Thread(target=ping, daemon=True).start()
        try:
            yield
        finally:
            stop.set()
            channel.shutdown_write()
            channel.close()


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Split a byte stream into text lines; a runaway line is cut at MAX_LINE."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace").rstrip("\r")
        if len(pending) > MAX_LINE:
            yield pending.decode(errors="replace")
            pending = b""
    if pending:
        yield pending.decode(errors="replace")
