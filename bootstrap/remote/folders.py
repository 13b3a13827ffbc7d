"""The run's folders, the SSH user's alone: checked on the VM before any job starts.

The converted model, the checkpoints, the export and JAX's compiled programs live in the run's work
folder, by default in /dev/shm, which every account of the VM may write. A folder there that another
account made first is that account's: it could swap the export before its SHA256SUMS is written, or plant
compiled programs that train's process runs. So before the first job, each folder the pipeline writes is
walked from / down: every part must belong to the SSH user (or root) and be writable by no one else, but
for a shared root such as /dev/shm or /tmp (root's, with the sticky bit: no one may rename or remove what
another made there). The folder directly below such a root is made here, mode 0700, when it is missing:
from then on no one else can make it or anything in it. A part that fails is refused in one line that
says whose it is; nothing is taken over or removed.

Standard library only: it runs on the VM beside jobrunner.py.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat

MAX_LINKS = 40  # as the kernel's own limit on links followed in one path


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _shared_root(st: os.stat_result) -> bool:
    """A folder of root's that anyone may write but no one may rename another's entry in: /tmp, /dev/shm."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and bool(st.st_mode & stat.S_ISVTX)


def problem(path: str, uid: int | None = None) -> str | None:
    """Why the folder `path` is not the SSH user's alone (one line), or None. Parts that do not exist yet are
    made by the jobs (umask 077), except the one directly below a shared root, made here first."""
    uid = os.geteuid() if uid is None else uid
    me = _owner(uid)
    parts = [p for p in os.path.abspath(os.path.expanduser(path)).split("/") if p]
    current, shared, links = "/", False, 0
    while parts:
        name = parts.pop(0)
        current = os.path.join(current, name)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            if not shared:
                return None  # the rest is made by the jobs, inside folders already checked
            with contextlib.suppress(FileExistsError):  # another account made it meanwhile: it is checked below
                os.mkdir(current, 0o700)
            st = os.lstat(current)
        if st.st_uid not in (0, uid):
            return (
                f"{current} belongs to {_owner(st.st_uid)}, not to {me}: another account of the VM could change "
                "what the jobs write there; remove it, or set the folder elsewhere"
            )
        if stat.S_ISLNK(st.st_mode):  # root's or the user's own link: its target is checked the same way
            links += 1
            if links > MAX_LINKS:
                return f"{current}: too many links"
            target = os.path.join(os.path.dirname(current), os.readlink(current))
            parts = [p for p in os.path.abspath(target).split("/") if p] + parts
            current, shared = "/", False
            continue
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and _shared_root(st):
            shared = True
            continue
        if writable:
            who = "others" if st.st_mode & stat.S_IWOTH else "its group"
            return (
                f"{current} may be written by {who} (mode {stat.S_IMODE(st.st_mode):04o}): another account could "
                f"change what the jobs write there; chmod go-w {current}, or set the folder elsewhere"
            )
        if shared and st.st_uid == uid and st.st_mode & 0o077:
            os.chmod(current, stat.S_IMODE(st.st_mode) & 0o700)  # the user's own folder in a shared root: private
        shared = False
    return None


def checks(folders: dict[str, str]) -> list[dict]:
    """The preflight's check of the folders the pipeline writes (`folders`: what sets each -> the folder): one
    line for each problem, named by the first setting that meets it (a folder shared by many is said once)."""
    found, said = [], set()
    for setting, path in folders.items():
        why = problem(path)
        if why is not None and why not in said:
            said.add(why)
            found.append({"check": "folder", "ok": False, "message": f"{setting} {path}: {why}"})
    if not found:
        found.append(
            {"check": "folder", "ok": True, "message": f"the run's folders are the SSH user's alone ({len(folders)})"}
        )
    return found
