"""A process on the VM, known by its pid and the kernel's start time (a reused pid is another process): whether it
still runs, waiting until one ends, and starting one detached that outlives whoever started it.

Standard library only: beside jobrunner.py and driver.py in the VM's tools folder.
"""

from __future__ import annotations

import os
import select
import time

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
    deadline = time.monotonic() + wait
    while not (answer := ready(process.pid)):
        if process.poll() is not None or time.monotonic() > deadline:
            with open(err_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace").strip()
            raise RuntimeError(f"{what} did not start: {text[-2000:] or 'no output'}")
        time.sleep(0.01)
    return answer
