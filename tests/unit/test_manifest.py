"""SHA256SUMS: sha256sum's own format, and no name that could leave the folder it is copied into."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from bootstrap.errors import UserError
from bootstrap.remote import manifest
from bootstrap.results import transfer
from bootstrap.results.transfer import inside


def test_written_manifest_is_checked_by_sha256sum(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub" / "model.safetensors").write_bytes(b"w" * 1000)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x").write_text("not part of the export")
    digests = manifest.write(str(tmp_path))
    assert set(digests) == {"config.json", "sub/model.safetensors"}
    checked = subprocess.run(["sha256sum", "-c", manifest.NAME], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 2
    assert manifest.parse((tmp_path / manifest.NAME).read_text()) == digests
    assert manifest.read_verified(str(tmp_path)) == digests


def test_a_manifest_left_half_written_is_never_listed_by_the_next(tmp_path, capsys):
    """A manifest.py killed half way leaves its temporary file; the next one listed it, then wrote over it and
    renamed it away, so its SHA256SUMS named a file that was gone and every copy and download failed."""
    (tmp_path / "model.safetensors").write_bytes(b"w" * 1000)
    (tmp_path / manifest.TEMPORARY).write_text(f"{'0' * 64}  model.saf")  # half of an earlier one
    assert manifest.main([str(tmp_path)]) == 0
    assert set(manifest.read_verified(str(tmp_path))) == {"model.safetensors"}
    assert "SHA-256 of 1 files" in capsys.readouterr().out


def test_a_file_listed_but_gone_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "a").write_bytes(b"one")
    manifest.write(str(tmp_path))
    (tmp_path / "a").unlink()
    with pytest.raises(ValueError, match=f"a listed in SHA256SUMS but not in {tmp_path}"):
        manifest.read_verified(str(tmp_path))


def test_a_file_changed_after_the_manifest_is_named(tmp_path):
    (tmp_path / "a").write_bytes(b"one")
    manifest.write(str(tmp_path))
    (tmp_path / "a").write_bytes(b"two")  # same size
    with pytest.raises(ValueError, match="a no longer match SHA256SUMS"):
        manifest.read_verified(str(tmp_path))


@pytest.mark.parametrize(
    "name", ["../x", "/etc/passwd", "a/../../x", "a//b", "./a", "", "a\\..\\b", "a/\x1b[2J", "dir/"]
)
def test_unsafe_names_are_refused(name):
    with pytest.raises(ValueError):
        manifest.parse(f"{'0' * 64}  {name}\n")


@pytest.mark.parametrize("line", ["abc  x", f"{'0' * 64} x", f"{'G' * 64}  x", "x"])
def test_malformed_lines_are_refused(line):
    with pytest.raises(ValueError, match="line 1 is not"):
        manifest.parse(line + "\n")


def test_a_link_out_of_dest_is_refused(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "out").symlink_to(tmp_path)
    with pytest.raises(UserError, match="would land outside"):
        inside(dest, "out/escaped", "vm:/export/SHA256SUMS")
    assert inside(dest, "sub/ok", "vm") == Path(dest / "sub" / "ok")


def test_a_download_refuses_sha256sums_that_are_not_the_ones_its_job_sealed(tmp_path):
    """transfer.download_verified, given the seal (the SHA-256 the export job recorded of its SHA256SUMS): another
    SHA256SUMS vouches for someone else's files and is refused before anything is written."""

    class Export:
        name = "vm"

        def __init__(self, files: dict[str, bytes]):
            self.files = files

        def read_text(self, path: str) -> str | None:
            data = self.files.get(path.rsplit("/", 1)[1])
            return data.decode() if data is not None else None

        def fetch(self, path: str, target: Path) -> None:
            target.write_bytes(self.files[path.rsplit("/", 1)[1]])

    weights = b"weights"
    sums = f"{hashlib.sha256(weights).hexdigest()}  model.safetensors\n".encode()
    source = Export({"SHA256SUMS": sums, "model.safetensors": weights})
    sealed = hashlib.sha256(sums).hexdigest()
    with pytest.raises(UserError, match="not the one its export job verified"):
        transfer.download_verified(source, "/export", tmp_path / "planted", lambda *a: None, sealed="0" * 64)
    assert not (tmp_path / "planted").exists()
    found = transfer.download_verified(source, "/export", tmp_path / "model", lambda *a: None, sealed=sealed)
    assert (
        found == {"model.safetensors": len(weights)}
        and (tmp_path / "model" / "model.safetensors").read_bytes() == weights
    )
