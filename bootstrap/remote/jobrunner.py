"""The VM side of the pipeline: run a job detached, report state, hold the lock, preflight.

Copied to the VM and run with its system python3 (standard library only), so it
works before any environment exists. Subcommands:

    run JOB_DIR                 run JOB_DIR/spec.json; survives the SSH session
    status JOB_DIR...           JSON state of each job (done, running, failed, ...)
    lock STATE_DIR OWNER [S]    hold STATE_DIR/lock until stdin closes or is silent S seconds
    preflight                   check the VM against the JSON request on stdin

A job counts as done only when it exited 0 and every declared output exists;
`done` is written after that check and never before.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

DEFERRED = re.compile(r"\$\{(hostname|latest_step:([^{}]+))\}")
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
LOCK_SILENCE_SECONDS = 90


def _write_json(path: str, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def latest_step(directory: str) -> str:
    """The highest finished step under a checkpoint directory (Orbax temp dirs are ignored)."""
    steps = [int(n) for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(directory) else []
    if not steps:
        raise LookupError(f"no checkpoint step under {directory}")
    return str(max(steps))


def resolve_runtime(text: str) -> str:
    def replace(match: re.Match) -> str:
        if match.group(1) == "hostname":
            return socket.gethostname()
        return latest_step(os.path.expanduser(match.group(2)))

    return DEFERRED.sub(replace, text)


def missing_outputs(patterns: list[str]) -> list[str]:
    """Outputs (globs) with no match, or whose only matches are empty directories."""
    missing = []
    for pattern in patterns:
        matches = glob.glob(os.path.expanduser(pattern))
        if not any(os.path.isfile(m) or (os.path.isdir(m) and os.listdir(m)) for m in matches):
            missing.append(pattern)
    return missing


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"jobrunner" in f.read()
    except OSError:
        return False


def job_state(job_dir: str) -> dict:
    spec = _read_json(os.path.join(job_dir, "spec.json")) or {}
    runner = _read_json(os.path.join(job_dir, "runner.json"))
    result = _read_json(os.path.join(job_dir, "result.json"))
    done = _read_json(os.path.join(job_dir, "done"))
    log = os.path.join(job_dir, "log")
    state = {"job_dir": job_dir, "log": log, "log_bytes": os.path.getsize(log) if os.path.exists(log) else 0}
    if runner:
        state.update(started=runner["started"], pid=runner["pid"])
    if result:
        state.update(finished=result["finished"], exit_code=result["exit_code"], error=result.get("error"))
    if done:
        missing = missing_outputs(spec.get("outputs", []))
        state.update(state="lost" if missing else "done", outputs=done["outputs"], missing=missing)
    elif result:
        state["state"] = "failed"
    elif runner:
        state["state"] = "running" if _alive(runner["pid"]) else "interrupted"
    else:
        state["state"] = "pending"
    return state


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return result, pos
        shift += 7


def event_steps(path: str) -> list[int]:
    """The `step` of every record in a TensorBoard event file (TFRecord of Event protos)."""
    steps = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos : pos + 8], "little")
        record = data[pos + 12 : pos + 12 + length]
        if len(record) < length:
            break  # the writer is mid-record
        pos += 12 + length + 4
        i = 0
        while i < len(record):
            key, i = _varint(record, i)
            field, wire = key >> 3, key & 7
            if wire == 0:
                value, i = _varint(record, i)
                if field == 2:
                    steps.append(value)
            elif wire == 1:
                i += 8
            elif wire == 2:
                size, i = _varint(record, i)
                i += size
            elif wire == 5:
                i += 4
            else:
                break
    return steps


def max_event_step(directory: str) -> int | None:
    files = glob.glob(os.path.join(directory, "**", "*tfevents*"), recursive=True)
    steps = [s for f in files for s in event_steps(f)]
    return max(steps) if steps else None


def _watch_steps(progress: dict, log, stop: threading.Event) -> None:
    """Write `[tpu-rl] step k/N` to the log whenever the trainer's event files advance."""
    last = None
    directory = os.path.expanduser(progress["tensorboard_dir"])
    while not stop.wait(float(os.environ.get("TPU_RL_POLL_SECONDS", "10"))):
        try:
            step = max_event_step(directory)
        except OSError:
            continue
        if step is not None and step != last:
            last = step
            log.write(f"[tpu-rl] step {step}/{progress['total_steps']}\n".encode())


def _secret_env(spec: dict) -> dict:
    env = {}
    for name in spec.get("secrets", []):
        path = os.path.join(os.path.expanduser(spec["secrets_dir"]), name)
        with open(path) as f:
            env[name] = f.read().strip()
    return env


def _run_step(argv: list[str], env: dict, cwd: str, log) -> int:
    log.flush()
    child = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    return child.wait()


def run(job_dir: str) -> int:
    spec = _read_json(os.path.join(job_dir, "spec.json"))
    _write_json(
        os.path.join(job_dir, "runner.json"), {"pid": os.getpid(), "started": time.time(), "host": socket.gethostname()}
    )
    exit_code, error = 1, None
    with open(os.path.join(job_dir, "log"), "ab", buffering=0) as log:
        try:
            env = {**os.environ, **{k: resolve_runtime(v) for k, v in spec["env"].items()}, **_secret_env(spec)}
            argv = [os.path.expanduser(spec["argv"][0])] + [resolve_runtime(a) for a in spec["argv"][1:]]
            cwd = os.path.expanduser(spec.get("cwd", "~"))
            exit_code = 0
            if spec.get("validate"):
                log.write(b"[tpu-rl] checking the arguments with MaxText's own validator\n")
                validate = [os.path.expanduser(a) for a in spec["validate"]] + argv[3:]
                exit_code = _run_step([argv[0], *validate], env, cwd, log)
                error = "MaxText rejected the arguments" if exit_code else None
            if exit_code == 0:
                log.write(f"[tpu-rl] starting {spec['module']}\n".encode())
                stop = threading.Event()
                if spec.get("progress"):
                    threading.Thread(target=_watch_steps, args=(spec["progress"], log, stop), daemon=True).start()
                exit_code = _run_step(argv, env, cwd, log)
                stop.set()
                error = f"exited with {exit_code}" if exit_code else None
        except (OSError, LookupError, KeyError) as err:
            exit_code, error = 1, f"could not start: {err}"
            log.write(f"[tpu-rl] {error}\n".encode())
        missing = missing_outputs(spec["outputs"]) if exit_code == 0 else []
        if missing:
            error = f"exited 0 but outputs are missing: {', '.join(missing)}"
            log.write(f"[tpu-rl] {error}\n".encode())
    _write_json(os.path.join(job_dir, "result.json"), {"exit_code": exit_code, "finished": time.time(), "error": error})
    if exit_code == 0 and not missing:
        outputs = sorted(m for p in spec["outputs"] for m in glob.glob(os.path.expanduser(p)))
        _write_json(os.path.join(job_dir, "done"), {"finished": time.time(), "outputs": outputs})
    return exit_code


def hold_lock(state_dir: str, owner: str, silence: float = LOCK_SILENCE_SECONDS) -> int:
    """Hold the lock while the owner's pings arrive on stdin.

    Ends when the channel closes (fab exited or was killed) or when no ping came for
    `silence` seconds (the laptop vanished without closing the connection).
    """
    os.makedirs(state_dir, exist_ok=True)
    with open(os.path.join(state_dir, "lock"), "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with open(os.path.join(state_dir, "lock.owner")) as f:
                print(f"busy: {f.read().strip()}", flush=True)
            return 75
        with open(os.path.join(state_dir, "lock.owner"), "w") as f:
            f.write(owner)
        print("locked", flush=True)
        stdin = sys.stdin.fileno()
        while select.select([stdin], [], [], silence)[0] and os.read(stdin, 4096):
            pass
    return 0


def _holders(paths: list[str]) -> list[tuple[int, str]]:
    """Processes that have any of `paths` open (what `fuser` would say)."""
    holders = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            targets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            if targets & set(paths):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    holders.append((int(pid), f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]))
        except OSError:
            continue
    return holders


def preflight(request: dict) -> list[dict]:
    checks = []

    def check(name: str, ok: bool, message: str) -> None:
        checks.append({"check": name, "ok": ok, "message": message})

    chips = sorted(glob.glob(request["chip_glob"]))
    check(
        "chips",
        len(chips) >= request["chips"],
        f"{len(chips)} TPU chips visible ({request['chip_glob']}), {request['chips']} expected",
    )
    with open("/proc/meminfo") as f:
        mem_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    check(
        "memory",
        mem_kb / 2**20 >= request["min_memory_gb"],
        f"{mem_kb / 2**20:.0f} GB RAM, {request['min_memory_gb']} GB needed",
    )
    shm = os.statvfs(request["shm_path"])
    free_gb = shm.f_bavail * shm.f_frsize / 2**30
    check(
        "shm",
        free_gb >= request["min_shm_gb"],
        f"{free_gb:.0f} GB free in {request['shm_path']}, {request['min_shm_gb']} GB needed",
    )
    lockfile = request.get("libtpu_lockfile", LIBTPU_LOCKFILE)
    holders = _holders([lockfile, *chips])
    if holders:
        names = "; ".join(f"pid {pid} ({cmd})" for pid, cmd in holders)
        check(
            "tpu_free",
            False,
            f"the TPU is in use by {names}; if it is left from a crashed run, stop it: kill {' '.join(str(p) for p, _ in holders)}",
        )
    elif os.path.exists(lockfile):
        os.remove(lockfile)
        check("tpu_free", True, f"removed stale {lockfile} (no process held it)")
    else:
        check("tpu_free", True, "no process holds the TPU")
    for name, path in request.get("secrets", {}).items():
        path = os.path.expanduser(path)
        present = os.path.isfile(path) and os.path.getsize(path) > 0
        private = present and (os.stat(path).st_mode & 0o077) == 0
        check(
            f"secret {name}",
            present and private,
            f"{name} {'is stored, readable only by you' if private else 'is missing or readable by others'} ({path})",
        )
    return checks


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("help", [])
    if command == "run":
        return run(args[0])
    if command == "status":
        print(json.dumps([job_state(os.path.expanduser(d)) for d in args]))
        return 0
    if command == "lock":
        return hold_lock(os.path.expanduser(args[0]), args[1], *(float(a) for a in args[2:3]))
    if command == "preflight":
        checks = preflight(json.load(sys.stdin))
        print(json.dumps(checks))
        return 0 if all(c["ok"] for c in checks) else 1
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
