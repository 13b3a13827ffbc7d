"""What fab asks the VM before it acts, answered in one Python process: a command's first round trip.

Sent with the command itself (`python3 -I -c`, the request as JSON on stdin, the answer as one JSON line
on stdout), so it works on a VM that has none of tpu-rl's tools yet; a shell doing the same starts a
dozen processes, which cost a fab command more than the Python. fab starts it while it still checks its
jobs (vm/dial.py): it loads the tools' slowest standard library (WARMED) and waits for the request, and a
command that stopped before asking leaves it nothing to do (an empty request). Isolated (-I): nothing in the
SSH user's home or environment shadows the standard library. Paths are as SFTP reads them: relative ones in
the home folder. Every part of the request is optional:

    state       the state folder (jobrunner.Layout's paths, from the laptop: `root`, `private`, `bin`,
                `current_run`): its private folders made (mode 700), the cached bytecode of the tools the
                laptop just put (`put`) removed, and answered with the `tools`' digests and the current
                run; only when every tool is the laptop's, the pipeline woken (driver.wake), with the job
                folders `read_ahead` names read in the same process, and with `runs`, every run
    secrets     paths: each one's SHA-256 and mode, for those that can be read
    startup     the startup script's marker and failure record: vm/startup.py's one line
    log         {"path", "offset"}: the startup log from that byte on (at most LOG_CHUNK; its last
                bytes once the script failed), and the offset where that ends

With `startup`, also `booted`: when the VM booted (the kernel's btime), where goodput's paid time begins.

Standard library only, and nothing else of tpu-rl's until the tools were found current.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import sys

LOG_CHUNK = 1024 * 1024  # of the startup log, a look
# The tools' slowest standard-library imports (retry's typing, notify's urllib.parse), loaded while the request is on
# its way. Nothing of tpu-rl's, and nothing on the VM changes.
WARMED = ("typing", "urllib.parse")


def read(path: str, size: int = -1) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None


def digest(path: str) -> str | None:
    data = read(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def state_folder(state: dict, tools: dict[str, str], read_ahead: list[str], runs: dict | None) -> dict:
    for folder in state["private"]:
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o700)
    for name in state.get("put", []):  # a new tool of the same size, put within the second, would look cached
        for cached in glob.glob(os.path.join(state["bin"], "__pycache__", f"{name.removesuffix('.py')}.*.pyc")):
            os.remove(cached)
    found = {name: digest(os.path.join(state["bin"], name)) for name in tools}
    current = (read(state["current_run"]) or b"").decode(errors="replace").strip()
    answer = {"tools": {name: value for name, value in found.items() if value}, "current_run": current or None}
    if found != tools:  # an old driver is never woken: the laptop puts the new tools first
        return answer
    sys.path.insert(0, state["bin"])
    try:
        import driver  # the tools just found current
        import inventory
        import jobrunner

        layout = jobrunner.Layout(state["root"])
        answer["pipeline"] = driver.wake(layout)
    except Exception as err:  # noqa: BLE001 - what the driver said instead: fab status shows it
        return {**answer, "pipeline": {"error": f"{type(err).__name__}: {err}"}}
    # What cannot be read here is left out: fab reads it in a round trip of its own, which says why.
    with contextlib.suppress(Exception), jobrunner.gcs.quick():
        answer["states"] = [jobrunner.job_state(os.path.expanduser(job_dir)) for job_dir in read_ahead]
    if runs is not None:
        with contextlib.suppress(Exception):
            answer["runs"] = inventory.runs(layout, runs)
    return answer


def first_bytes(path: str, size: int) -> str:
    """The first `size` bytes of a file as one line; "" when it cannot be read."""
    return (read(path, size) or b"").decode(errors="replace").replace("\n", "")


def startup_line(marker: str, failure_record: str) -> str:
    """`startup done WHEN`, `startup failed RECORD` or `startup running` (vm/startup.py parses it)."""
    if os.path.isfile(marker):
        return f"startup done {first_bytes(marker, 100)}"
    if os.path.isfile(failure_record):
        return f"startup failed {first_bytes(failure_record, 1000)}"
    return "startup running"


def booted() -> int | None:
    """When this machine booted, in seconds since the epoch (/proc/stat's btime); None where it cannot be read."""
    for line in (read("/proc/stat") or b"").decode(errors="replace").splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    return None


def log_from(path: str, offset: int, last: bool) -> dict:
    """The log's text from byte `offset` (or, `last`, its last LOG_CHUNK bytes) and where that ends."""
    try:
        with open(path, "rb") as f:
            start = max(offset, f.seek(0, os.SEEK_END) - LOG_CHUNK) if last else offset
            f.seek(start)
            data = f.read(LOG_CHUNK)
    except OSError:
        return {"text": "", "end": offset}
    return {"text": data.decode(errors="replace"), "end": start + len(data)}


def answer(request: dict) -> dict:
    os.umask(0o077)
    os.chdir(os.path.expanduser("~"))
    found: dict = {"secrets": {}}
    if "state" in request:
        found |= state_folder(request["state"], request["tools"], request.get("read_ahead", []), request.get("runs"))
    for path in request.get("secrets", []):
        with contextlib.suppress(OSError):
            mode = f"{os.stat(path).st_mode & 0o777:o}"
            if (value := digest(path)) is not None:
                found["secrets"][path] = {"digest": value, "mode": mode}
    if "startup" in request:
        marker, record = (os.path.expanduser(request["startup"][key]) for key in ("marker", "failure_record"))
        found["startup"] = startup_line(marker, record)
        found["booted"] = booted()
    if "log" in request:
        failed = found.get("startup", "").startswith("startup failed")
        found["log"] = log_from(os.path.expanduser(request["log"]["path"]), request["log"]["offset"], failed)
    return found


if __name__ == "__main__":
    for module in WARMED:
        __import__(module)
    if not (request := sys.stdin.read()):  # started ahead (vm/dial.py), and fab stopped before asking: nothing to do
        sys.exit(0)
    try:
        print(json.dumps(answer(json.loads(request))))
    except Exception as err:  # noqa: BLE001 - one line for fab to show, not a traceback
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(1)
