"""Whether a command's local inputs passed the local checks before: it may then dial the VM at once.

The local checks (plan.check_local, the run name, the secrets) need the job schema, which takes about a
tenth of a second to import. A command whose inputs (the job files, its --args, run name and options,
what decides the secrets set here, tpu-rl's own files) are exactly those of an earlier command that passed
them dials the VM while it imports and checks them again (vm/dial.py); any other checks first, and contacts nothing
before it has (tests/unit/test_bad_inputs.py). This decides only when the dial starts: the checks always
run, and their errors always come first. Standard library only: it runs before the schema is imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from pathlib import Path

from .. import secrets
from ..paths import REPO, jobs_dir, runs_dir

MEMO = ".checked"  # in the runs folder: the digests of the inputs that passed, newest first
READ_BYTES = 1 << 20  # of a job file: more than the checks accept (yamlfile.MAX_BYTES)
KEPT = 32  # a user's usual commands (status, logs, train with its --args) each keep theirs


class LocalInputs:
    """What one command's local checks read, as one digest (`options`: the task's, e.g. whether it needs the
    jobs' secrets set)."""

    def __init__(self, overrides: list[str], run_name: str | None, options: dict[str, bool]):
        digest = hashlib.sha256(json.dumps([overrides, run_name, options], sort_keys=True).encode())
        for path in sorted(jobs_dir().glob("*.yaml")):
            digest.update(b"\0%s\0%s" % (path.name.encode(), _head(path)))
        for name in secrets.HUB_TOKEN_SETTINGS:  # what decides the token: the checks refuse its value in the jobs
            digest.update(b"\0" + os.environ.get(name, "\0unset").encode(errors="surrogateescape"))
        token_file = secrets.login_token_path()
        # A token huggingface_hub would mint (OIDC) or find elsewhere is in no digest: such inputs never passed.
        self.known = bool(os.environ.get("HF_TOKEN")) or token_file is not None
        digest.update(b"\0" + _head(Path(token_file)) if token_file else b"\0elsewhere")
        for folder, folders, files in os.walk(REPO / "bootstrap"):  # its code and MaxText's keys: another tpu-rl
            folders[:] = sorted(f for f in folders if f != "__pycache__")
            for name in sorted(files):
                digest.update(f"\0{folder}/{name}:{_stamp(Path(folder, name))}".encode())
        self.digest = digest.hexdigest()

    def passed_before(self) -> bool:
        return self.known and self.digest in _remembered()

    def passed(self) -> None:
        """Remember these inputs as passed. Best effort: a memo that cannot be written only dials later; two
        fabs writing it at once may each drop the other's newest digest, never a whole memo."""
        remembered = _remembered()
        if not self.known or remembered[:1] == [self.digest]:
            return
        memo = runs_dir() / MEMO
        beside = memo.with_name(f"{MEMO}.{uuid.uuid4().hex[:12]}")
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            beside.write_text("\n".join([self.digest, *(d for d in remembered if d != self.digest)][:KEPT]) + "\n")
            beside.replace(memo)
        except OSError:
            with contextlib.suppress(OSError):
                beside.unlink()


def _remembered() -> list[str]:
    try:
        return (runs_dir() / MEMO).read_bytes().decode(errors="replace").split()
    except OSError:
        return []


def _head(path: Path) -> bytes:
    """A file's bytes, up to what the checks would refuse as too big (a FIFO or a folder: a marker)."""
    try:
        if path.is_file():
            with open(path, "rb") as f:
                return f.read(READ_BYTES)
    except OSError:
        pass
    return b"\0not a readable file"


def _stamp(path: Path) -> str:
    try:
        stat = path.stat()
    except OSError:  # an editor's lock file pointing nowhere, a file removed meanwhile
        return "-"
    return f"{stat.st_size}:{stat.st_mtime_ns}"
