"""This machine as the VM: what `fab demo` drives, with no SSH server.

vm/machine.py's Vm talks to a VM through the two things fabric's Connection gives it: command channels and SFTP.
`Here` gives the same two on this machine, so every step of a run (the install, the driver, following it,
downloads) is the very code a real VM runs, started as local processes instead of over SSH. Commands see what an
SSH session would: a plain environment (never this shell's secrets), and the home folder as their working folder.
"""

from __future__ import annotations

import getpass
import os
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

NAME = "this machine"
# What an SSH session's environment holds (sshd passes no more): nothing of this shell's secrets reaches a job.
PASSED = ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "XDG_CACHE_HOME")
# The machine's own network settings (CA bundle, proxy), as a VM has its own; and uv's and pip's (an index).
NETWORK_ENV = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
INSTALLERS = ("UV_", "PIP_")
CREDENTIALS = ("TOKEN", "PASSWORD", "USERNAME", "SECRET", "KEY", "PUBLISH", "AUTH")  # an installer's: never passed


def session_env(extra: dict[str, str]) -> dict[str, str]:
    """A command's environment: the session's plain variables, the network's and installers' settings, fab's own
    bin folder (uv) on PATH, and `extra` (its PATH, if any, first on PATH)."""
    first = [extra["PATH"]] if extra.get("PATH") else []
    path = os.pathsep.join([*first, str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    installer = lambda k: k.startswith(INSTALLERS) and not any(word in k for word in CREDENTIALS)  # noqa: E731
    passed = {
        k: v for k, v in os.environ.items()
        if k in PASSED or k in NETWORK_ENV or installer(k) and "@" not in v  # an index URL with user:token@ too
    }  # fmt: skip
    return {**passed, **extra, "PATH": path}


class _Exited:
    """The channel's `status_event`: set once the command has exited."""

    def __init__(self, process: subprocess.Popen):
        self._process = process

    def wait(self, timeout: float | None = None) -> bool:
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def is_set(self) -> bool:
        return self._process.poll() is not None


class Channel:
    """One command run here, with the part of paramiko's Channel that Vm uses. Its stderr goes to a file, read
    when asked for, so a command that writes much of it never blocks on a full pipe."""

    def __init__(self, env: dict[str, str]):
        self._env, self._timeout = env, None
        self._process: subprocess.Popen | None = None
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the channel
        self.closed = False

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def exec_command(self, command: str) -> None:
        self._process = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=Path.home(),
            env=self._env,
            start_new_session=True,  # as over SSH: the driver it starts outlives it
        )
        self.status_event = _Exited(self._process)

    def sendall(self, data: bytes) -> None:
        self._process.stdin.write(data)
        self._process.stdin.flush()

    def shutdown_write(self) -> None:
        self._process.stdin.close()

    def recv(self, size: int) -> bytes:
        """What the command wrote since, at most `size` bytes; b"" at its end; TimeoutError after a quiet timeout."""
        ready, _, _ = select.select([self._process.stdout], [], [], self._timeout)
        if not ready:
            raise TimeoutError
        return os.read(self._process.stdout.fileno(), size)

    def makefile(self, mode: str = "rb") -> IO[bytes]:
        return self._process.stdout

    def makefile_stderr(self, mode: str = "rb") -> IO[bytes]:
        self._process.wait()
        self._stderr.seek(0)
        return self._stderr

    def recv_exit_status(self) -> int:
        return self._process.wait()

    def exit_status_ready(self) -> bool:
        return self._process.poll() is not None

    @property
    def exit_status(self) -> int:
        code = self._process.poll()
        return -1 if code is None else code

    def close(self) -> None:
        """As a closed SSH channel: the command is hung up on if it still runs (what it started goes on)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait()
        self._stderr.close()
        self.closed = True


class _Transport:
    def __init__(self, env: dict[str, str]):
        self._env = env

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float | None = None) -> Channel:
        return Channel(self._env)


class _Client:
    def __init__(self, env: dict[str, str]):
        self._transport = _Transport(env)

    def get_transport(self) -> _Transport:
        return self._transport


class _File:
    """A file SFTP opened: paramiko's SFTPFile methods Vm uses."""

    def __init__(self, path: Path, mode: str):
        self._path, self._file = path, open(path, mode + ("" if "b" in mode else "b"))  # noqa: SIM115 - closed on exit

    def chmod(self, mode: int) -> None:
        os.chmod(self._path, mode)

    def write(self, data: bytes) -> None:
        self._file.write(data)

    def read(self) -> bytes:
        return self._file.read()

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


class _Sftp:
    """SFTP on this machine: paths relative to the home folder, as SFTP's are."""

    @staticmethod
    def _at(path: str) -> Path:
        return Path.home() / path

    def put(self, local: str, remote: str) -> None:
        shutil.copyfile(local, self._at(remote))

    def get(self, remote: str, local: str) -> None:
        shutil.copyfile(self._at(remote), local)

    def posix_rename(self, old: str, new: str) -> None:
        os.replace(self._at(old), self._at(new))

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._at(path), mode)

    def open(self, path: str, mode: str = "r") -> _File:
        return _File(self._at(path), mode)


class Here:
    """This machine, in the shape of fabric's Connection as Vm uses it. `env`: what every command also sees."""

    is_connected = True
    port = 0

    def __init__(self, env: dict[str, str]):
        self.host, self.user = NAME, getpass.getuser()
        self.client = _Client(session_env(env))

    def sftp(self) -> _Sftp:
        return _Sftp()

    def close(self) -> None:
        """Nothing to close: each command is its own process."""


class HereDial:
    """vm/dial.py's Dial for this machine: no stack to read, nothing to reach, nothing to say about it."""

    def __init__(self, env: dict[str, str]):
        self._conn = Here(env)

    def outputs(self) -> None:
        return None

    def host(self) -> str:
        return ""

    def connection(self) -> tuple[Here, None]:
        return self._conn, None
