"""The VM's checks before the first TPU job: its chips, memory and /dev/shm, a TPU no other process holds, the
secrets the jobs need, and a bucket the VM may use. Standard library only, beside driver.py in the tools folder."""

from __future__ import annotations

import glob
import os

try:
    from . import gcs  # on the laptop: bootstrap.remote
except ImportError:
    import gcs  # on the VM: beside this script in the tools folder

LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"


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


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def checks(request: dict, own_groups: set[int] = frozenset()) -> list[dict]:
    """The VM's checks before the first TPU job; `own_groups`: the process groups of the pipeline's own running
    jobs, whose hold on the TPU ends before a job that needs them starts."""
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
    found = _holders([lockfile, *chips])
    holders = [(pid, cmd) for pid, cmd in found if _group(pid) not in own_groups]
    if holders:
        names = "; ".join(f"pid {pid} ({cmd})" for pid, cmd in holders)
        check(
            "tpu_free",
            False,
            f"the TPU is in use by {names}; if it is left from a crashed run, stop it: kill {' '.join(str(p) for p, _ in holders)}",
        )
    elif found:
        check("tpu_free", True, "held only by this pipeline's own running job (the validator)")
    elif os.path.exists(lockfile):
        os.remove(lockfile)
        check("tpu_free", True, f"removed stale {lockfile} (no process held it)")
    else:
        check("tpu_free", True, "no process holds the TPU")
    for name, path in request.get("secrets", {}).items():
        path = os.path.expanduser(path)
        present = os.path.isfile(path) and os.path.getsize(path) > 0
        check(f"secret {name}", present, f"{name} {'is stored' if present else 'is missing'} ({path})")
    if request.get("bucket"):
        with gcs.quick():  # a check: an unreachable bucket is its answer, in seconds
            problem = gcs.probe(request["bucket"])
        check(
            "bucket",
            problem is None,
            f"the VM may read and write {request['bucket']}"
            if problem is None
            else f"the VM cannot use {request['bucket']} ({problem}): its service account needs "
            "roles/storage.objectAdmin and roles/storage.legacyBucketReader on that bucket (the stack's bucket has "
            "both), or set results.gcs to another bucket",
        )
    return checks
