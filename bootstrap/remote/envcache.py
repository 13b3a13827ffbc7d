"""The environment kept in the bucket: built once, then restored by every new VM of the same kind instead
of built again while the TPU waits (tunix, tpu-inference and vLLM build from source).

    python3 envcache.py restore SPEC_DIGEST VENV gs://BUCKET/PREFIX   exit 0: restored; 3: build it
    python3 envcache.py store SPEC_DIGEST VENV gs://BUCKET/PREFIX     after a build; once per key

What is kept is the venv and the uv-managed Python it runs on (pyvenv.cfg's `home`): a venv is not
relocatable and names its interpreter by absolute path, so both come back to the same paths, byte for
byte. uv's cache is not kept: a rebuild from it still resolves, installs and compiles the extra deps.
The key is everything that made them: the environment spec's digest, the image (os-release), the
machine's architecture and the venv's absolute path. One tar stream is cut into parts of PART_BYTES,
each named in manifest.json with its SHA-256; the manifest is written last, so an entry without one is
never restored. A restore unpacks beside its targets and moves them into place only once every part
verified: a missing, corrupt or partial entry, or one of another key, leaves nothing behind, and the
setup job builds (one line says why).

Standard library only: it runs with the VM's system python3 before any environment exists.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import stat
import sys
import tarfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

try:
    from . import faults, gcs  # on the laptop: bootstrap.remote
except ImportError:
    import faults  # on the VM: beside this script in the tools folder
    import gcs

PART_BYTES = 64 * 2**20
STREAMS = 4  # parts read or written at once: at most this many in memory besides the one being unpacked
MANIFEST = "manifest.json"
FORMAT = 1
BUILD = 3  # restore's exit code when the setup job is to build
ROOTS = ("venv", "python")  # the tar stream's top folders: the venv, the Python it runs on


def key_fields(spec_digest: str, venv: str) -> dict:
    """Everything that made the environment, as the key's parts."""
    return {
        "format": FORMAT,
        "spec": spec_digest,
        "image": _os_release(),
        "arch": platform.machine(),
        "venv": os.path.abspath(venv),
    }


def key(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]


def entry_url(cache: str, fields: dict) -> str:
    return f"{cache.rstrip('/')}/{key(fields)}"


def _os_release() -> str:
    try:
        with open("/etc/os-release") as f:
            values = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except OSError:
        return "unknown"
    return f"{values.get('ID', '?').strip(chr(34))} {values.get('VERSION_ID', '?').strip(chr(34))}"


def _uv_pythons() -> str:
    """The folder uv installs its Pythons in."""
    return os.path.realpath(os.path.expanduser(os.environ.get("UV_PYTHON_INSTALL_DIR", "~/.local/share/uv/python")))


def python_of(venv: str) -> dict:
    """The Python the venv runs on: pyvenv.cfg's `home`, and when uv installed it (below uv's Python folder),
    its installation folder and the minor-version link uv may name it by; a system or pyenv Python is not
    kept (the image or the host has it, or a restore refuses)."""
    try:
        with open(os.path.join(venv, "pyvenv.cfg")) as f:
            home = next((line.split("=", 1)[1].strip() for line in f if line.split("=")[0].strip() == "home"), "")
    except OSError:
        home = ""
    found = {"home": home, "installation": None, "link": None}
    managed = _uv_pythons()
    named = os.path.dirname(home.rstrip("/"))  # .../cpython-3.12-linux-x86_64-gnu (perhaps a link)
    installation = os.path.realpath(named) if named else ""
    if installation.startswith(managed + os.sep):
        found["installation"] = installation
        if os.path.islink(named):
            found["link"] = [named, os.readlink(named)]
    return found


class _Parts(io.RawIOBase):
    """A write-only stream cut into parts, each uploaded under its SHA-256 as soon as it is whole, up to
    STREAMS at a time (one Cloud Storage stream is far slower than the VM's network)."""

    def __init__(self, url: str, pool: ThreadPoolExecutor):
        self.url, self.pool, self.buffer, self.parts, self.pending = url, pool, bytearray(), [], deque()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.buffer += data
        while len(self.buffer) >= PART_BYTES:
            self._upload(bytes(self.buffer[:PART_BYTES]))
            del self.buffer[:PART_BYTES]
        return len(data)

    def finish(self) -> list[dict]:
        if self.buffer:
            self._upload(bytes(self.buffer))
            self.buffer = bytearray()
        while self.pending:
            self.pending.popleft().result()
        return self.parts

    def _upload(self, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        name = f"parts/{len(self.parts):05d}-{digest[:16]}"
        while len(self.pending) >= STREAMS:  # at most STREAMS parts held in memory
            self.pending.popleft().result()
        self.pending.append(self.pool.submit(gcs.write, f"{self.url}/{name}", data))
        self.parts.append({"name": name, "sha256": digest, "size": len(data)})


def store(spec_digest: str, venv: str, cache: str) -> str:
    """Keep the built environment in the bucket (nothing when this key is kept already); one line."""
    fields = key_fields(spec_digest, venv)
    url = entry_url(cache, fields)
    if _whole(url):
        return f"environment already kept in {url}"
    started, python = time.monotonic(), python_of(venv)
    with ThreadPoolExecutor(STREAMS) as pool:
        parts = _Parts(url, pool)
        with tarfile.open(fileobj=parts, mode="w|") as tar:
            tar.add(os.path.abspath(venv), arcname="venv")
            if python["installation"]:
                tar.add(python["installation"], arcname="python")
        listed = parts.finish()
    size = sum(part["size"] for part in listed)
    manifest = {"key": fields, "python": python, "parts": listed, "bytes": size}
    gcs.write(f"{url}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
    faults.point("envcache.stored")
    return (
        f"environment kept in {url} ({size / 2**30:.2f} GiB in {len(listed)} parts, {time.monotonic() - started:.0f} s)"
    )


def _whole(url: str) -> bool:
    """The entry's manifest is there and names parts that are all there at their sizes (a part removed by a
    lifecycle rule makes the next build keep the entry again)."""
    text = gcs.read(f"{url}/{MANIFEST}")
    try:
        parts = json.loads(text)["parts"] if text is not None else None
    except (ValueError, KeyError, TypeError):
        return False
    found = gcs.sizes(f"{url}/parts/") if parts else {}
    return bool(parts) and all(found.get(f"{url}/{part['name']}") == part["size"] for part in parts)


class Refused(Exception):
    """Why an entry is not restored (the setup job builds instead)."""


def _fetch(url: str) -> tuple[bytes | None, str]:
    """One part and its SHA-256, hashed in the reading thread (hashlib lets go of the GIL): the unpacking
    never waits on a hash."""
    data = gcs.read(url)
    return data, hashlib.sha256(data).hexdigest() if data is not None else ""


class _Verified(io.RawIOBase):
    """The parts read back in order (STREAMS read ahead at a time), each handed on only once its SHA-256
    matched the manifest's."""

    def __init__(self, url: str, parts: list[dict], pool: ThreadPoolExecutor):
        self.url, self.parts, self.pool, self.current = url, deque(parts), pool, memoryview(b"")
        self.ahead: deque = deque()

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while len(self.ahead) < STREAMS and self.parts:
            part = self.parts.popleft()
            self.ahead.append((part, self.pool.submit(_fetch, f"{self.url}/{part['name']}")))
        if not self.current and self.ahead:
            part, reading = self.ahead.popleft()
            data, digest = reading.result()
            if data is None:
                raise Refused(f"{part['name']} is missing")
            if digest != part["sha256"]:
                raise Refused(f"{part['name']} is corrupt (its SHA-256 differs from the manifest's)")
            self.current = memoryview(data)
        count = min(len(target), len(self.current))
        target[:count], self.current = self.current[:count], self.current[count:]
        return count


def restore(spec_digest: str, venv: str, cache: str) -> str:
    """Put the kept environment of this key in place, every part verified first; raises Refused."""
    fields = key_fields(spec_digest, venv)
    url = entry_url(cache, fields)
    text = gcs.read(f"{url}/{MANIFEST}")
    if text is None:
        raise Refused(f"none kept for this spec and machine ({url})")
    try:
        manifest = json.loads(text)
        parts, python = manifest["parts"], manifest["python"]
        home, installation, link = python["home"], python["installation"], python["link"]
    except (ValueError, KeyError, TypeError):
        raise Refused(f"{url}/{MANIFEST} is not a manifest") from None
    if manifest.get("key") != fields:
        raise Refused(f"{url} holds another key's environment")
    managed = _uv_pythons()
    for path in [p for p in (installation, link and link[0]) if p]:
        if os.path.dirname(os.path.abspath(path)) != managed:
            raise Refused(f"its manifest names {path}, not a Python of uv's ({managed})")
    if link and "/" in link[1]:
        raise Refused(f"its manifest links {link[0]} to {link[1]}, not to a Python beside it")
    if not installation and not os.path.isdir(home):
        raise Refused(f"its Python ({home}) is not on this machine")
    started, venv = time.monotonic(), os.path.abspath(venv)
    targets = {"venv": venv, "python": installation}
    unpacked = f"{venv}.restoring"
    shutil.rmtree(unpacked, ignore_errors=True)
    try:
        os.mkdir(unpacked, 0o700)
    except FileExistsError:
        raise Refused(f"{unpacked} is left from an earlier restore and cannot be removed") from None
    try:
        with (
            ThreadPoolExecutor(STREAMS) as pool,
            tarfile.open(fileobj=io.BufferedReader(_Verified(url, parts, pool), PART_BYTES), mode="r|") as tar,
        ):
            guard = _Guard(installation is not None, unpacked)
            for member in tar:
                guard.check(member)
                tar.extract(member, unpacked, **({"filter": "fully_trusted"} if hasattr(tarfile, "tar_filter") else {}))
            guard.finish()
        for root in reversed(ROOTS):  # the Python first: a venv in place always has its interpreter
            if targets[root] and os.path.isdir(os.path.join(unpacked, root)):
                _move_into_place(os.path.join(unpacked, root), targets[root], keep_existing=root == "python")
        if link and not os.path.lexists(link[0]):
            os.symlink(link[1], link[0])  # uv's minor-version name of that Python, which the venv's home uses
            faults.point("envcache.linked-python")
    except (tarfile.TarError, OSError, ValueError) as err:  # ValueError: a NUL byte in a name
        raise Refused(f"could not unpack it: {err}") from None
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
    seconds = time.monotonic() - started
    return f"environment restored from {url} ({manifest['bytes'] / 2**30:.2f} GiB in {seconds:.0f} s), not built"


class _Guard:
    """Only what store writes, judged from the names alone (the folder unpacked into is new, so the archive's
    own members are all it holds): files, folders and links below one of the roots, each root a folder, no
    absolute name, no `.`, `..` or empty part, a hard link only to an earlier regular file, no name twice
    (but a folder), nothing below a symlink, no set-id bits or write for others. A folder stays writable until
    `finish`, so that a refused archive can always be removed. No system call per member, where tarfile's
    own filter resolves every member's path (an lstat per folder above it)."""

    def __init__(self, has_python: bool, unpacked: str):
        self.roots = ROOTS if has_python else tuple(root for root in ROOTS if root != "python")
        self.unpacked = unpacked
        self.kinds: dict[str, str] = {}  # every name so far, the folders above them too: "dir", "file" or "link"
        self.folder_modes: dict[str, int] = {}

    def _inside(self, name: str) -> bool:
        parts = name.split("/")
        return parts[0] in self.roots and not any(part in ("", ".", "..") for part in parts)

    def check(self, member: tarfile.TarInfo) -> None:
        name, kind = member.name, "dir" if member.isdir() else "link" if member.issym() else "file"
        if not self._inside(name) or not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise Refused(f"the archive holds {name!r}, outside what is kept")
        if "/" not in name and kind != "dir":
            raise Refused(f"the archive holds {name!r} as a {kind}, not a folder")
        if member.islnk() and (not self._inside(member.linkname) or self.kinds.get(member.linkname) != "file"):
            raise Refused(f"the archive links {name!r} to {member.linkname!r}, not to a file it holds")
        if name in self.kinds and not (kind == "dir" and self.kinds[name] == "dir"):
            raise Refused(f"the archive holds {name!r} twice")  # a file written over a link put there first
        above = _prefixes(name)
        if any(self.kinds.get(folder, "dir") != "dir" for folder in above):
            raise Refused(f"the archive writes {name!r} through a link, outside what is kept")
        self.kinds.update({folder: "dir" for folder in above})  # tarfile makes them: never a link later
        self.kinds[name] = kind
        member.mode &= ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH)  # as tar_filter
        if kind == "dir":
            self.folder_modes[name] = member.mode
            member.mode |= stat.S_IRWXU

    def finish(self) -> None:
        """The folders' own modes, deepest first, once everything below them is written."""
        for name in sorted(self.folder_modes, key=lambda folder: folder.count("/"), reverse=True):
            os.chmod(os.path.join(self.unpacked, name), self.folder_modes[name])


def _prefixes(name: str) -> list[str]:
    """The folders above `name`: a/b/c -> a, a/b."""
    parts = name.split("/")
    return ["/".join(parts[:count]) for count in range(1, len(parts))]


def _move_into_place(unpacked: str, target: str, keep_existing: bool) -> None:
    """Rename the unpacked folder to `target`; an old one there (a half build) is removed first, unless
    `keep_existing` (the same uv Python, installed since: its folder names its exact version)."""
    if os.path.lexists(target):
        if keep_existing:
            return
        shutil.rmtree(target)
        faults.point("envcache.removed-old")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(unpacked, target)
    faults.point("envcache.moved-into-place")


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("restore", "store"):
        print(__doc__, file=sys.stderr)
        return 64
    command, spec_digest, venv, cache = argv
    venv = os.path.expanduser(venv)
    if command == "store":
        try:
            print(store(spec_digest, venv, cache))
        except OSError as err:
            print(f"environment not kept in the bucket ({err}); the next new VM builds it again")
        return 0
    try:
        print(restore(spec_digest, venv, cache))
        return 0
    except Refused as why:
        print(f"environment: building it ({why})")
    except OSError as err:
        print(f"environment: building it (the bucket could not be read: {err})")
    return BUILD


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
