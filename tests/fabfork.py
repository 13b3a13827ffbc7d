"""`fab` for the tests: each command a child forked from a Python that has imported what every `fab` imports first.

A `fab` command spends 0.5-0.6 CPU-s importing Fabric, Invoke, Paramiko, rich, pydantic and PyYAML before it reads
its first argument: most of what a refused command costs, and the suite runs about 400 of them. Each process of the
tests (an xdist worker) starts one server, `python tests/fabfork.py`, which imports them once, with the interpreter
the `fab` script names. Each `run()` is then a child forked from it: its own process, with the call's argv,
environment, working folder and standard streams, running the console script's `program.run()`. The server also imports
those of tpu-rl's modules that read no variable, folder or file as they load (PRELOADED_TPU_RL), so it forks only a
fab that loads this tree's fabfile; the others read theirs, so each child imports them as a new `fab` would.

What the child keeps from the server: what its packages read as they loaded (Python's and invoke's variables, the
locale, the time zone, OpenSSL's), its umask and limits (but the address space a call gives), its hash seed, and its
command line in /proc. So a call
whose environment differs from the server's in one of those variables starts fab anew (subprocess.run), as does a
call with a keyword or a stream run() does not take. The output goes to files, not pipes: a process fab leaves
holding them does not hold the call. A test that stops fab midway starts it itself. A forked call's result carries
the child's usage; test_bad_inputs.py, which bounds fab's CPU and memory, adds the server's (start_usage()) to it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import locale
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# What `fab` imports before a task runs: the console script's module, then what the fabfile and the tasks use; then
# tpu-rl's modules that commands import and that read no variable, folder or file and print nothing as they load
# (test_fabfork.py proves it), a third to a half of what a command spends in a child. The others read theirs
# (faults.py, the timeouts, the console's width), so each child imports them as a new `fab` would.
PRELOADED = ("fabric.main", "rich.console", "rich.table", "rich.progress", "pydantic", "pydantic.main", "yaml")
PRELOADED_TPU_RL = tuple(
    f"bootstrap.{module}"
    for module in (
        "jobs.spec",
        "jobs.schedule",
        "jobs.accelerator",
        "jobs.yamlfile",
        "results.runs",
        "results.rates",
        "results.goodput",
        "results.prices",
        "results.timing",
        "remote.envcheck",
        "remote.evals",
        "vm.compute",
        "vm.connect",
        "vm.hostkeys",
        "vm.progress",
        "vm.startup",
    )
)
# and every variable with a prefix below; PYDANTIC_DISABLE_PLUGINS: read as the preloaded schemas were built
READ_AT_START = ("LANG", "TZ", "INVOKE_DEBUG", "PYDANTIC_DISABLE_PLUGINS")
READ_AT_START_PREFIXES = ("PYTHON", "LC_", "OPENSSL", "CRYPTOGRAPHY")
START_SECONDS = 120  # its imports, on a busy machine
REPORT_BYTES = 256  # a waiter's "code cpu rss" (about 35), with room: a longer datagram is cut without a word
HANDLED = {"env", "cwd", "input", "stdin", "timeout", "text", "capture_output", "stdout", "stderr", "check"}
FAB = str(Path(sys.executable).with_name("fab"))
REPO = Path(__file__).resolve().parents[1]
ENABLED = False  # tests/conftest.py turns it on; the benchmarks, which time fab, start each one anew


def run(args: list[str], address_space: int | None = None, **options) -> subprocess.CompletedProcess:
    """subprocess.run(args, **options) for a `fab` command (args[0], the venv's fab), forked from the server; with
    `address_space`, the command's RLIMIT_AS."""
    if not ENABLED or not _forkable(args, options):
        return _new(args, address_space, options)
    env = os.environ if options.get("env") is None else options["env"]
    server = _server()
    if any(env.get(k) != server.env.get(k) for k in {*env, *server.env} if _read_at_start(k)):
        return _new(args, address_space, options)
    return server.run(list(map(str, args)), {**options, "env": dict(env), "address_space": address_space})


def _new(args: list[str], address_space: int | None, options: dict) -> subprocess.CompletedProcess:
    if address_space is not None:
        if "preexec_fn" in options:
            raise ValueError("fabfork.run: address_space and preexec_fn both given")
        options["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    return subprocess.run(args, **options)


def start_usage() -> tuple[float, int]:
    """What this process's server used to import fab's modules, which a new fab uses too and a forked child does not
    count: its CPU-s, and its resident KiB of files (code a child runs but has not touched is not in the child's)."""
    return _server().start_usage


def forks() -> int:
    """How many calls of this process a forked child ran."""
    return _servers[os.getpid()].forked if os.getpid() in _servers else 0


def last_exit() -> int | None:
    """How the last forked child of this process ended, as its waiter saw it (-9: killed)."""
    return _servers[os.getpid()].last_exit if os.getpid() in _servers else None


def _forkable(args: list[str], options: dict) -> bool:
    """fab, with keywords run() takes: both streams captured (or neither), stdin /dev/null, `input` or inherited."""
    captured = options.get("capture_output") and not {"stdout", "stderr"} & set(options)
    piped = options.get("stdout") == subprocess.PIPE and options.get("stderr") in (subprocess.PIPE, subprocess.STDOUT)
    neither = not ({"capture_output", "stdout", "stderr"} & set(options))
    stdin = options.get("stdin") is None or (options["stdin"] == subprocess.DEVNULL and options.get("input") is None)
    text_input = not isinstance(options.get("input"), str) or options.get("text")
    folder = options.get("cwd") is None or os.path.isdir(options["cwd"])  # run raises where it is not
    streams = bool(captured or piped or neither)
    fab = str(args[0]) == FAB and _this_trees(args, options.get("cwd"))
    return fab and HANDLED.issuperset(options) and streams and stdin and text_input and folder


def _this_trees(args: list[str], cwd: str | Path | None) -> bool:
    """Whether the fab command surely loads this tree's fabfile (the server's tpu-rl modules are this tree's): `-r`
    first, naming a folder in it (relative to the working folder), or no search root and a working folder in it.
    Another way to name a search root (--search-root, -r=X, -dr X) starts fab anew."""
    here, words = Path(cwd or os.getcwd()), [str(arg) for arg in args[1:]]
    if words[:1] == ["-r"] and len(words) > 1:
        here, words = here / words[1], words[2:]
    other_root = [w for w in words if w.startswith("--search-root") or (w[:1] == "-" and w[1:2] != "-" and "r" in w)]
    return not other_root and here.resolve().is_relative_to(REPO)


def _read_at_start(name: str) -> bool:
    return name in READ_AT_START or name.startswith(READ_AT_START_PREFIXES)


class _Server:
    """One process's fork server: started on first use, gone when that process ends (its lifeline closes)."""

    def __init__(self, forked: int = 0):
        self.forked, self.last_exit = forked, None
        self.path = os.path.join(tempfile.mkdtemp(prefix="fabfork-"), "socket")
        self.env = dict(os.environ)
        shebang = Path(FAB).read_text().splitlines()[0].removeprefix("#!").strip()
        interpreter = shebang if Path(shebang).name.startswith("python") else sys.executable  # not pip's sh trampoline
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
        if not ready.startswith(b"ready "):
            self.stop()
            raise RuntimeError(f"the fab fork server did not start in {START_SECONDS} s: {ready!r}")
        _, cpu, files = ready.split()
        self.start_usage = float(cpu), int(files)
        atexit.register(self.stop)

    def stop(self) -> None:
        """Close its lifeline, and wait for it to go (it removes its socket)."""
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def run(self, args: list[str], options: dict) -> subprocess.CompletedProcess:
        text = options.get("text", False)
        pipe = options.get("capture_output") or options.get("stdout") == subprocess.PIPE
        merged = options.get("stderr") == subprocess.STDOUT
        with contextlib.ExitStack() as files:
            stdin = files.enter_context(tempfile.TemporaryFile()) if options.get("input") is not None else None
            if stdin is not None:
                data = options["input"]
                stdin.write(data.encode(locale.getpreferredencoding(False)) if isinstance(data, str) else data)
                stdin.seek(0)
            elif options.get("stdin") == subprocess.DEVNULL:
                stdin = files.enter_context(open(os.devnull, "rb"))
            out = files.enter_context(tempfile.TemporaryFile()) if pipe else None
            err = out if merged else files.enter_context(tempfile.TemporaryFile()) if pipe else None
            fds = [(f.fileno() if f else fd) for f, fd in ((stdin, 0), (out, 1), (err, 2))]
            request = {
                "argv": args,
                "env": options["env"],
                "cwd": os.path.abspath(options.get("cwd") or os.getcwd()),
                "address_space": options["address_space"],
            }
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.connect(self.path)
                socket.send_fds(conn, [json.dumps(request).encode()], fds)
                code, usage = self._wait(conn, args, options.get("timeout"), out, None if merged else err)
            result = subprocess.CompletedProcess(args, code, _read(out, text), None if merged else _read(err, text))
            result.usage = usage
        if options.get("check"):
            result.check_returncode()
        return result

    def _wait(self, conn: socket.socket, args: list[str], timeout: float | None, out, err) -> tuple[int, tuple]:
        """The child's exit code, CPU-s and peak resident KiB. At the timeout, or any other end of the wait, the child
        is killed first."""
        pid = 0
        try:
            pid = int(conn.recv(64) or b"0")
            if not pid:
                raise RuntimeError(f"the fab fork server could not start {args}: see its stderr")
            self.forked += 1
            conn.settimeout(None if timeout is None else max(timeout, 0.001))
            ended = conn.recv(REPORT_BYTES)
        except BaseException as stopped:  # the timeout, or the test's own end: fab goes too, as with run
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                conn.settimeout(None)
                self.last_exit = self._report(conn.recv(REPORT_BYTES))[0]
            if isinstance(stopped, TimeoutError) and pid:
                raise subprocess.TimeoutExpired(
                    args, timeout, _read(out, False) or None, _read(err, False) or None
                ) from None
            raise
        if not ended:
            raise RuntimeError(f"the fab fork server's waiter for {args} ended without its exit code")
        self.last_exit, cpu, rss = self._report(ended)
        return self.last_exit, (cpu, rss)

    @staticmethod
    def _report(report: bytes) -> tuple[int | None, float | None, int | None]:
        """The waiter's report: the child's exit code, CPU-s and peak resident KiB (none if the waiter died)."""
        if not report:
            return None, None, None
        code, cpu, rss = report.split()
        return int(code), float(cpu), int(rss)


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
    """This process's server; a new one if it has none, or if its own ended."""
    with _lock:
        server = _servers.get(os.getpid())
        if server is None or server.process.poll() is not None:
            if server is not None:  # it died: its lifeline and folder go
                server.stop()
                shutil.rmtree(os.path.dirname(server.path), ignore_errors=True)
            server = _servers[os.getpid()] = _Server(server.forked if server else 0)
        return server


# --- the server --------------------------------------------------------------------------------------------------


def serve(path: str, lifeline: int) -> dict | None:
    """Fork a `fab` child for each request until the lifeline closes. In the child, returns its request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    used = resource.getrusage(resource.RUSAGE_SELF)
    status = Path("/proc/self/status").read_text().splitlines()
    files = next((line.split()[1] for line in status if line.startswith("RssFile:")), "0")  # 0: a kernel before 4.5
    print(f"ready {used.ru_utime + used.ru_stime} {files}", flush=True)
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:  # the waiters that have reported
                pass
        ready, _, _ = select.select([listener, lifeline], [], [], 1.0)
        if lifeline in ready:
            return None
        if listener not in ready:
            continue
        conn, fds, waiter = None, [], None
        try:  # one request that fails (a fork refused on a busy machine) fails its call only
            conn = listener.accept()[0]
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            waiter = os.fork()
        except OSError as error:
            print(f"fabfork: {error}", file=sys.stderr)
        if waiter == 0:
            listener.close()
            os.close(lifeline)
            return _wait_for_child(conn, json.loads(data), fds)
        for fd in fds:
            os.close(fd)
        if conn is not None:
            conn.close()


def _wait_for_child(conn: socket.socket, request: dict, fds: list[int]) -> dict:
    """The waiter: forks the child, says its pid, then how it ended. In the child, returns its request."""
    child = os.fork()
    if child == 0:
        conn.close()
        return _become(request, fds)
    for fd in fds:
        os.close(fd)
    try:
        conn.send(str(child).encode())
    except OSError:  # the caller has gone: so does its command
        os.kill(child, signal.SIGKILL)
    _, status, usage = os.wait4(child, 0)
    conn.send(f"{os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime} {usage.ru_maxrss}".encode())
    os._exit(0)


def _become(request: dict, fds: list[int]) -> dict:
    """The child's streams, folder, environment (os.environ changed in place: modules hold it) and argv."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    if request["address_space"] is not None:
        resource.setrlimit(resource.RLIMIT_AS, (request["address_space"],) * 2)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    signal.signal(signal.SIGINT, _SIGINT_AT_START)  # Ctrl-C is fab's again, as the server's Python found it
    return request


def preload_fab() -> None:
    """The server's first imports: PRELOADED."""
    for module in PRELOADED:
        importlib.import_module(module)


def preload_tpu_rl() -> None:
    """The server's next imports: PRELOADED_TPU_RL, found as `fab -r REPO` finds them."""
    sys.path.insert(1, str(REPO))
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")  # as fabfile.py sets it before its imports
    for module in PRELOADED_TPU_RL:
        importlib.import_module(module)


if __name__ == "__main__":
    import gc

    sys.path[0] = str(Path(sys.executable).parent)  # the console script's folder, as for `fab` itself
    preload_fab()
    preload_tpu_rl()
    assert threading.active_count() == 1, "a preloaded module started a thread: forking would copy it stopped"
    gc.freeze()  # what the children share stays shared
    _SIGINT_AT_START = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tests' Ctrl-C ends them, which closes the lifeline
    server = os.getpid()
    try:
        request = serve(sys.argv[1], int(sys.argv[2]))
    finally:
        if os.getpid() == server:
            os.unlink(sys.argv[1])
            os.rmdir(os.path.dirname(sys.argv[1]))
    if request is None:  # the tests' process has ended
        sys.exit(0)
    from fabric.main import program

    sys.exit(program.run())
