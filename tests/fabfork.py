"""`fab` for the tests: each command a child forked from a Python that has imported what every `fab` imports first.

A `fab` command spends 0.5-0.6 CPU-s importing Fabric, Invoke, Paramiko, rich, pydantic and PyYAML before it reads
its first argument: most of what a refused command costs, and the suite runs about 400 of them. Each process of the
tests (an xdist worker) starts one server, `python tests/fabfork.py`, which imports them once, with the interpreter
the `fab` script names. Each `run()` is then a child forked from it: its own process, with the call's argv,
environment, working folder and standard streams, running the console script's `program.run()`. Those packages read
nothing from the environment as they are imported (invoke's INVOKE_DEBUG aside, compared below); tpu-rl's modules,
which do, are imported in each child as in a new `fab`.

A call a forked child would not run as a new process runs as one (subprocess.run): one whose environment differs
from the server's in what Python or invoke read as they start (PYTHON*, the locale, INVOKE_DEBUG), or that passes a
keyword beyond run()'s. Where a test measures fab's own start (its CPU time and memory: test_bad_inputs.py), it
starts fab itself.
"""

from __future__ import annotations

import contextlib
import json
import locale
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# What `fab` imports before a task runs: the console script's module, then what the fabfile and the tasks use.
PRELOADED = ("fabric.main", "rich.console", "rich.table", "rich.progress", "pydantic", "pydantic.main", "yaml")
READ_AT_START = ("LANG", "LC_ALL", "LC_CTYPE", "INVOKE_DEBUG")  # with every PYTHON* variable
START_SECONDS = 120  # its imports, on a busy machine
HANDLED = {"env", "cwd", "input", "stdin", "timeout", "text", "capture_output", "stdout", "stderr", "check"}


def run(args: list[str], **options) -> subprocess.CompletedProcess:
    """subprocess.run(args, **options) for a `fab` command (args[0], the venv's fab), forked from the server."""
    env = options.get("env") or os.environ
    server_env = _server().env
    fresh_start = any(
        env.get(k) != server_env.get(k) for k in {*env, *server_env} if k.startswith("PYTHON") or k in READ_AT_START
    )
    plain = HANDLED.issuperset(options) and options.get("stdin") in (None, subprocess.DEVNULL)
    if fresh_start or not plain or str(args[0]) != _server().fab:
        return subprocess.run(args, **options)
    return _server().run(list(map(str, args)), {**options, "env": dict(env)})


class _Server:
    """One process's fork server: started on first use, gone when that process ends (its lifeline closes)."""

    def __init__(self, fab: str):
        self.fab = fab
        self.folder = tempfile.mkdtemp(prefix="fabfork-")
        self.path = os.path.join(self.folder, "socket")
        self.env = dict(os.environ)
        interpreter = Path(fab).read_text().splitlines()[0].removeprefix("#!").strip()  # the script's own python
        lifeline, self._lifeline = os.pipe()
        self.process = subprocess.Popen(
            [interpreter, __file__, self.path, str(lifeline)],
            pass_fds=[lifeline],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=self.env,
        )
        os.close(lifeline)
        started, _, _ = select.select([self.process.stdout], [], [], START_SECONDS)
        ready = self.process.stdout.readline() if started else b""
        assert ready == b"ready\n", f"the fab fork server did not start in {START_SECONDS} s: {ready!r}"

    def run(self, args: list[str], options: dict) -> subprocess.CompletedProcess:
        text = options.get("text", False)
        pipe = options.get("capture_output") or options.get("stdout") == subprocess.PIPE
        merged = options.get("stderr") == subprocess.STDOUT
        with contextlib.ExitStack() as files:
            stdin = files.enter_context(tempfile.TemporaryFile()) if "input" in options else None
            if stdin is not None:
                data = options["input"] or b""
                stdin.write(data.encode() if isinstance(data, str) else data)
                stdin.seek(0)
            elif options.get("stdin") == subprocess.DEVNULL:
                stdin = files.enter_context(open(os.devnull, "rb"))
            out = files.enter_context(tempfile.TemporaryFile()) if pipe else None
            err = out if merged else files.enter_context(tempfile.TemporaryFile()) if pipe else None
            fds = [(f.fileno() if f else fd) for f, fd in ((stdin, 0), (out, 1), (err, 2))]
            request = {"argv": args, "env": options["env"], "cwd": str(options.get("cwd") or os.getcwd())}
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.connect(self.path)
                socket.send_fds(conn, [json.dumps(request).encode()], fds)
                pid = int(conn.recv(64))
                conn.settimeout(options.get("timeout"))
                try:
                    code = int(conn.recv(64))
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    conn.settimeout(None)
                    conn.recv(64)
                    raise subprocess.TimeoutExpired(
                        args, options["timeout"], _read(out, text), _read(err, text)
                    ) from None
            result = subprocess.CompletedProcess(args, code, _read(out, text), None if merged else _read(err, text))
        if options.get("check"):
            result.check_returncode()
        return result


def _read(file, text: bool) -> str | bytes | None:
    if file is None:
        return None
    file.seek(0)
    data = file.read()
    if not text:
        return data
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")  # as run's


_servers: dict[int, _Server] = {}
_lock = threading.Lock()


def _server() -> _Server:
    with _lock:
        if os.getpid() not in _servers:
            _servers[os.getpid()] = _Server(str(Path(sys.executable).with_name("fab")))
        return _servers[os.getpid()]


# --- the server --------------------------------------------------------------------------------------------------


def serve(path: str, lifeline: int) -> dict | None:
    """Fork a `fab` child for each request until the lifeline closes. In the child, returns its request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:  # the waiters that have reported
                pass
        ready, _, _ = select.select([listener, lifeline], [], [], 1.0)
        if lifeline in ready:
            return None
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if os.fork() == 0:  # the waiter: forks the child, says its pid, then how it ended
            listener.close()
            os.close(lifeline)
            child = os.fork()
            if child == 0:
                conn.close()
                return _become(json.loads(data), fds)
            for fd in fds:
                os.close(fd)
            conn.send(str(child).encode())
            _, status = os.waitpid(child, 0)
            conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            os._exit(0)
        for fd in fds:
            os.close(fd)
        conn.close()


def _become(request: dict, fds: list[int]) -> dict:
    """The child's streams, folder, environment (os.environ changed in place: modules hold it) and argv."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    return request


if __name__ == "__main__":
    import gc
    import importlib

    sys.path[0] = str(Path(sys.executable).parent)  # the console script's folder, as for `fab` itself
    for module in PRELOADED:
        importlib.import_module(module)
    assert threading.active_count() == 1, "a preloaded module started a thread: forking would copy it stopped"
    gc.freeze()  # what the children share stays shared
    if serve(sys.argv[1], int(sys.argv[2])) is None:  # the tests' process has ended
        os.unlink(sys.argv[1])
        os.rmdir(os.path.dirname(sys.argv[1]))
        sys.exit(0)
    from fabric.main import program

    sys.exit(program.run())
