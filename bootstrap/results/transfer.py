"""Copying results to this machine, the same for every backend: a folder that grows (TensorBoard
events) and an export verified file by file against its SHA256SUMS.

A `Source` is where the files are: the VM over SFTP (vm.machine.Vm) or the bucket
(gke.cluster.Cluster). Each file is written under a `.part` name and renamed when complete,
never through a link, and never outside the local folder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..errors import UserError
from ..remote import manifest

OnFile = Callable[[str, int], None]


class Source(Protocol):
    name: str

    def list_files(self, directory: str) -> dict[str, int]:
        """Files below `directory` (relative path -> size); empty if there are none."""

    def read_text(self, path: str) -> str | None:
        """A small file's text (a manifest), whole; None if there is none."""

    def fetch(self, path: str, target: Path) -> None:
        """Write the file at `path` to `target`."""


def download(source: Source, directory: str, local: Path, on_file: OnFile, required: bool = True) -> dict[str, int]:
    """Copy a folder that grows in place: files here at the same size are kept. An empty or missing folder
    is an error unless not `required`."""
    files = source.list_files(directory)
    if not files and required:
        raise UserError(f"{source.name}: nothing to download in {directory}")
    for path, size in sorted(files.items()):
        target = inside(local, path, f"{source.name}:{directory}")
        if not (target.exists() and target.stat().st_size == size):
            _fetch(source, f"{directory}/{path}", target)
            on_file(path, size)
    return files


def download_verified(
    source: Source, directory: str, local: Path, on_file: OnFile, sealed: str | None = None
) -> dict[str, int]:
    """Copy the files an export's SHA256SUMS names, each verified by SHA-256 (resumable).

    A file here whose hash differs (another run's shard of the same size, a damaged copy) is
    fetched again; a fetched file that still differs fails the download. Names that would land
    outside `local` are refused before anything is written. With `sealed` (the SHA-256 the export job
    recorded of its SHA256SUMS), a SHA256SUMS that is not that one is refused: it vouches for someone else's files.
    """
    where = f"{source.name}:{directory}/{manifest.NAME}"
    text = source.read_text(f"{directory}/{manifest.NAME}")  # all of it: a cut list would verify a part
    if text is None:
        raise UserError(f"{where}: not found; the export is not finished (run fab export)")
    if sealed is not None and hashlib.sha256(text.encode()).hexdigest() != sealed:
        raise UserError(f"{where}: not the one its export job verified (changed since); refused, nothing written")
    try:
        digests = manifest.parse(text)
    except ValueError as err:
        raise UserError(f"{where}: {err}; refused, nothing written to {local}") from None
    kept = local / manifest.NAME
    if _no_link(kept, where).exists() and kept.read_text(errors="replace") != text:
        raise UserError(
            f"{local} holds another export (its {manifest.NAME} differs from {where}); "
            "download into an empty folder, or remove that one first"
        )
    targets = {name: inside(local, name, where) for name in digests}
    local.mkdir(parents=True, exist_ok=True)
    kept.write_text(text)  # first: a download stopped half way still says whose files these are
    sizes = {}
    for name, digest in sorted(digests.items()):
        target = targets[name]
        if not (target.exists() and manifest.file_digest(str(target)) == digest):
            _fetch(source, f"{directory}/{name}", target)
            if manifest.file_digest(str(target)) != digest:
                target.unlink()
                raise UserError(f"{name}: SHA-256 of the copy differs from {where}; run the command again")
            on_file(name, target.stat().st_size)
        sizes[name] = target.stat().st_size
    return sizes


def _fetch(source: Source, path: str, target: Path) -> None:
    """One file, under a .part name renamed only when complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = _no_link(target.with_name(target.name + ".part"), f"{source.name}:{path}")
    source.fetch(path, partial)
    partial.replace(target)


def inside(local: Path, name: str, source: str) -> Path:
    """Where a file named by the source lands here; refuse a name that would land outside `local`."""
    try:
        manifest.check_name(name)
    except ValueError as err:
        raise UserError(f"{source}: {err}; refusing to write outside {local}") from None
    target = local / name
    if not target.resolve().is_relative_to(local.resolve()):
        raise UserError(f"{source}: {name!r} would land outside {local} (through a link); refused")
    return _no_link(target, source)


def _no_link(path: Path, source: str) -> Path:
    """A file that download writes or replaces: never through a link someone left there."""
    if path.is_symlink():
        raise UserError(f"{source}: {path} is a link; fab download writes plain files only: remove it")
    return path
