"""The export's manifest: SHA-256 of every file, written on the VM right after export.

    python3 manifest.py FOLDER      # writes FOLDER/SHA256SUMS

The format is `sha256sum`'s (`HEX  NAME` per line), so `sha256sum -c SHA256SUMS` checks
a copy anywhere. `fab download`, the Hub upload and the Cloud Storage copy all verify
against it, so two runs' shards of equal size, or a file damaged in place, are never
taken for each other. Names are relative and plain: `check_name` refuses anything that
could land outside the folder it is copied into. Runs on the VM's python3 (stdlib only).
"""

from __future__ import annotations

import hashlib
import os
import sys

try:
    from . import faults  # on the laptop: bootstrap.remote.manifest
except ImportError:
    import faults  # on the VM: beside this script in the tools folder

NAME = "SHA256SUMS"
TEMPORARY = f".{NAME}.tmp"  # where the manifest is written before it is renamed into place: never listed
CHUNK = 4 << 20


def file_digest(path: str, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_name(name: str) -> str:
    """A relative path inside the folder: no absolute path, no `..`, no empty or odd part."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in name or "\0" in name:
        raise ValueError(f"{name!r} is not a plain relative file name")
    if any(ord(c) < 32 for c in name):
        raise ValueError(f"{name!r} holds a control character")
    return name


def files_of(folder: str) -> list[str]:
    """Every file below `folder` except the manifest itself and hidden folders (e.g. .cache).

    A link is an error: a link to a file would list (and ship) whatever it points to, the token file
    say, and a link to a folder would be skipped without a word."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names) + dirs:
            if os.path.islink(os.path.join(root, name)):
                raise ValueError(f"{os.path.join(root, name)} is a link; an export holds plain files only")
        found += [os.path.relpath(os.path.join(root, n), folder) for n in sorted(names)]
    return [name for name in found if name not in (NAME, TEMPORARY)]


def render(digests: dict[str, str]) -> str:
    return "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))


def parse(text: str) -> dict[str, str]:
    """Name -> SHA-256 hex; raise ValueError on a malformed line or an unsafe name."""
    digests = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"{NAME} line {number} is not `SHA256  NAME`")
        digests[check_name(name)] = digest
    return digests


def read_verified(folder: str) -> dict[str, str]:
    """The folder's manifest, after checking every file against it; raise ValueError naming what differs."""
    with open(os.path.join(folder, NAME)) as f:
        digests = parse(f.read())
    gone = [name for name in digests if not os.path.isfile(os.path.join(folder, name))]
    if gone:
        raise ValueError(f"{', '.join(gone)} listed in {NAME} but not in {folder}")
    wrong = [name for name, digest in digests.items() if file_digest(os.path.join(folder, name)) != digest]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} no longer match {NAME} in {folder}")
    return digests


def write(folder: str) -> dict[str, str]:
    """Hash every file and write the manifest atomically (a reader never sees half of it)."""
    digests = {name: file_digest(os.path.join(folder, name)) for name in files_of(folder)}
    temporary = os.path.join(folder, TEMPORARY)
    with open(temporary, "w") as f:
        f.write(render(digests))
    os.replace(temporary, os.path.join(folder, NAME))
    faults.point("manifest.wrote")
    return digests


def main(argv: list[str]) -> int:
    """Write the manifest, then check the folder against it: the export is done only with one that verifies."""
    try:
        digests = write(argv[0])
        read_verified(argv[0])
    except ValueError as err:
        print(f"[tpu-rl] {NAME}: {err}", file=sys.stderr, flush=True)
        return 1
    print(f"[tpu-rl] {NAME}: SHA-256 of {len(digests)} files in {argv[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
