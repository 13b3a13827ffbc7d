"""A process on the VM, known by its pid and the kernel's start time (a reused pid is another process): whether it
still runs, waiting until one ends, and starting one detached that outlives whoever started it (anew, or as a copy).

Standard library only: beside jobrunner.py and driver.py in the VM's tools folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import sys
import time
from typing import NoReturn

LAUNCH_WAIT_SECONDS = 60


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/PID/stat): with the pid, a process identity.
    None for a process gone, or ended and not yet reaped (a zombie: state Z)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else fields[19]
    except (OSError, IndexError):
        return None


def identity(pid: int) -> dict:
    return {"pid": pid, "start": _start_time(pid)}


def alive(record: dict | None) -> bool:
    """The process recorded in `record` still runs (a reused pid has another start time)."""
    return bool(record) and record.get("start") is not None and _start_time(record["pid"]) == record["start"]


def wait_for_an_end(records: list[dict | None], seconds: float) -> None:
    """Sleep `seconds`, or less: until one of the live processes these records name ends (a pidfd each), so
    that what follows a process's end is done at once, not at the next look."""
    handles, ends = [], select.poll()
    try:
        for record in (r for r in records if r and isinstance(r.get("pid"), int) and alive(r)):
            try:
                handles.append(os.pidfd_open(record["pid"]))
            except ProcessLookupError:  # it ended just now
                return
            except (AttributeError, OSError):  # no pidfds (Linux before 5.3): those opened, or a plain sleep
                break
            if not alive(record):  # it ended, or its pid names another process now, since it was looked at
                return
            ends.register(handles[-1], select.POLLIN)
        if handles:
            ends.poll(seconds * 1000)
        else:
            time.sleep(seconds)
    finally:
        for handle in handles:
            os.close(handle)


def spawn(argv: list[str], err_path: str, ready, what: str, wait: float = LAUNCH_WAIT_SECONDS, env=None):
    """Start `argv` detached (its own session; its output appended to `err_path`; in `env`, else this process's
    environment) and return `ready(pid)`'s first true answer. Raises RuntimeError with what it wrote when it
    ended first or took over `wait` s."""
    import subprocess  # here, not above: every fab command starts a tool on the VM, and few start a process

    offset = os.path.getsize(err_path) if os.path.exists(err_path) else 0
    with open(err_path, "ab") as err:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True, env=env
        )
    return _await(process.pid, lambda: process.poll() is not None, err_path, offset, ready, what, wait)


def start(body, argv: list[str], err_path: str, ready, what: str, wait: float = LAUNCH_WAIT_SECONDS, env=None):
    """`fork(body)`, or where this process has threads, `spawn(argv)` in `env`."""
    forked = fork(body, err_path, ready, what, wait)
    return forked if forked is not None else spawn(argv, err_path, ready, what, wait, env)


def fork(body, err_path: str, ready, what: str, wait: float = LAUNCH_WAIT_SECONDS):
    """Run `body()` detached, as spawn starts a process, in a copy of this one: its modules already imported (a
    new interpreter would import them again), its environment. In the copy, every descriptor of this one (a lock
    it holds, the SSH channel) reads /dev/null under the same number, so that closing an inherited file object
    there closes nothing the copy opened itself. Only a single-threaded process forks (another thread's lock
    could stay held in the copy): None from one with threads."""
    if len(os.listdir("/proc/self/task")) > 1:  # Python's threads and any other
        return None
    for pid in list(_forked):  # the copies that ended are reaped: no zombies left
        _ended(pid)
    offset = os.path.getsize(err_path) if os.path.exists(err_path) else 0
    null = _above_2(os.open(os.devnull, os.O_RDWR))
    err = _above_2(os.open(err_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
    _flush()  # nothing this process buffered is written again by the copy
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # no handler of ours in the copy
    try:
        pid = os.fork()
        if pid == 0:
            _copy(body, null, err, blocked)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(null)
        os.close(err)
    _forked.add(pid)
    return _await(pid, lambda: _ended(pid), err_path, offset, ready, what, wait)


def _copy(body, null: int, err: int, blocked) -> NoReturn:
    """The forked copy: detached, then body(); it ends with os._exit, never back in its original's stack."""
    code = 1
    try:
        _forked.clear()  # the original's copies are not this one's children
        _detach(null, err)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        code = body() or 0
    except SystemExit as end:
        code = _exit_code(end)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:  # the flush may be interrupted (a SIGTERM's handler): os._exit all the same
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            _flush()
        finally:
            os._exit(code & 0xFF if isinstance(code, int) else 1)


def _above_2(fd: int) -> int:
    """`fd` moved to 3 or above (this process may have 0, 1 or 2 closed), closed on exec."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


_forked: set[int] = set()  # the copies this process made and has not reaped


def _detach(null: int, err: int) -> None:
    """The copy's own session, signal handlers and standard streams (stdin /dev/null, stdout and stderr appended to
    the err file), as a new interpreter's; every other descriptor /dev/null, not passed on to what it starts."""
    os.setsid()
    os.dup2(null, 0)
    os.dup2(err, 1)
    os.dup2(err, 2)
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd > 2 and fd != null:  # null is closed on exec already
            os.dup2(null, fd, inheritable=False)
    sys.stdin, sys.stdout = open(0, closefd=False), open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    for number in signal.valid_signals():  # the handlers this process set (a driver's SIGTERM): a new one's
        handler = signal.getsignal(number)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(number, signal.SIG_DFL)


def _exit_code(end: SystemExit) -> int:
    """The code `sys.exit(code)` gives, its message printed as the interpreter prints it."""
    if end.code is None or isinstance(end.code, int):
        return end.code or 0
    print(end.code, file=sys.stderr)
    return 1


def _ended(pid: int) -> bool:
    """The forked `pid` ended, and is reaped (here, or by the kernel where this process ignores SIGCHLD)."""
    try:
        ended = os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        ended = True
    if ended:
        _forked.discard(pid)  # its pid may be another child's later
    return ended


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream:
            with contextlib.suppress(Exception):
                stream.flush()


def _await(pid: int, ended, err_path: str, offset: int, ready, what: str, wait: float):
    """`ready(pid)`'s first true answer; RuntimeError with what the process wrote to `err_path` since `offset`
    when it `ended()` first or took over `wait` s."""
    deadline = time.monotonic() + wait
    while not (answer := ready(pid)):
        if ended() or time.monotonic() > deadline:
            if answer := ready(pid):  # it got ready, then ended, between the two looks
                return answer
            with open(err_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace").strip()
            raise RuntimeError(f"{what} did not start: {text[-2000:] or 'no output'}")
        time.sleep(0.01)
    return answer
