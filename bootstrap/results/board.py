"""`fab tensorboard`: a real TensorBoard on this machine over the runs' events, the live one kept current.

The events are copied from the VM (or, with results.gcs, from the bucket through the VM) into runs/RUN/tensorboard,
and TensorBoard serves runs/ on 127.0.0.1: every run this machine holds, side by side. The VM opens no port. An
event file only grows: what is new is appended to the copy here, so TensorBoard, which keeps each file open,
reads it as it reads a file being written.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError
from .transfer import Source, inside

READY_SECONDS = 120
STOP_SECONDS = 5  # TensorBoard's own exit after SIGTERM, before it is killed


def serve(server: subprocess.Popen, copy: Callable[[], None], every: float) -> None:
    """Call `copy` every `every` s while `server` runs; returns when it ends, raises KeyboardInterrupt at Ctrl-C. The
    copies run in a daemon thread: one in flight (an SFTP read from a VM that stopped answering) never holds fab's
    exit."""
    stopped = threading.Event()

    def copying() -> None:
        while not stopped.wait(every):
            copy()

    threading.Thread(target=copying, daemon=True).start()
    try:
        while server.poll() is None:  # not a blocking wait(): a Ctrl-C the kernel hands to another thread (the copy's,
            time.sleep(0.2)  # paramiko's) is run by this one only once it is back in Python, which waitpid never is
    finally:
        stopped.set()


def sync(source: Source, directory: str, local: Path) -> int:
    """Bring `local` up to `directory`'s event files; the bytes that were new. A file that is not the copy here
    grown (another run's, rewritten) replaces it whole."""
    new = 0
    for path, size in sorted(source.list_files(directory).items()):
        target = inside(local, path, f"{source.name}:{directory}")
        have = target.stat().st_size if target.exists() else 0
        if size == have:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:  # outside the served folder: TensorBoard never sees it
            fetched = Path(tmp) / target.name
            source.fetch(f"{directory}/{path}", fetched)
            data = fetched.read_bytes()
        if have and size > have and data[:have] == target.read_bytes():
            with target.open("ab") as f:  # the same inode: TensorBoard's open reader sees the new records
                f.write(data[have:])
            new += len(data) - have
        else:
            target.write_bytes(data)
            new += len(data)
    return new


class TensorBoard:
    """TensorBoard serving `logdir` on 127.0.0.1:`port` (0: a free one it picks), until stopped."""

    def __init__(self, logdir: Path, port: int = 0, reload_seconds: int = 5):
        self.logdir = logdir
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process
        argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                "--port", str(port), "--reload_interval", str(reload_seconds)]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self.url = self._wait_for_url()

    def _wait_for_url(self) -> str:
        """TensorBoard's own line `TensorBoard ... at http://127.0.0.1:PORT/`, once it serves."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            self._log.seek(0)
            said = self._log.read().decode(errors="replace")
            if "http://127.0.0.1:" in said:
                url = said.split("http://127.0.0.1:", 1)[1].split()[0].rstrip("/ ")
                return f"http://127.0.0.1:{url}/"
            if self.process.poll() is not None:
                raise UserError(f"TensorBoard did not start (exit {self.process.returncode}): {said.strip()[-500:]}")
            time.sleep(0.2)
        self.stop()
        raise UserError(f"TensorBoard did not say where it serves within {READY_SECONDS} s")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=30) as answer:
            return answer.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
