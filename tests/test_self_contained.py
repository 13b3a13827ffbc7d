"""A fresh clone is all the tests have: nothing in the repository reads, or sends a reader to, a file
outside it. (CI has a `shared/` folder beside its clone and a user does not, so a green CI alone would
hide such a path.)"""

import re
import subprocess

from bootstrap.paths import REPO

SKIPPED = {".git", ".venv", ".pytest_cache", ".ruff_cache", "__pycache__", "runs", "build", ".tpu-rl"}
TEXT = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ""}
# ../anything, a folder beside the checkout, or REPO's parent: each leaves the repository.
OUTSIDE = re.compile(r"\.\./(shared|reference)\b|\bshared/reference\b|\bREPO\.parent\b|\bREPO\s*/\s*['\"]\.\.")


def text_files():
    """The repository's text files (those git would track: no venv, caches or run output)."""
    for path in REPO.rglob("*"):
        parts = path.relative_to(REPO).parts
        if path.is_file() and not SKIPPED & set(parts) and path.suffix in TEXT and path.stat().st_size < 2**20:
            yield path


def test_no_file_points_outside_the_repository():
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}"
        for path in text_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == [], "\n".join(found)


def test_the_check_finds_such_a_path():
    beside = "/".join(("..", "shared", "reference"))  # put together here, so that this file names no such path
    assert OUTSIDE.search(f"see {beside}/gcs_emulation.md")
    assert OUTSIDE.search("CRDS = REPO" + '.parent / "shared"')
    assert not OUTSIDE.search('CRDS = REPO / "tests" / "data" / "crds"')


def test_the_folders_the_docs_call_ignored_are_ignored_by_git():
    """The TPU tier's wheels (docs/tests.md) and the run records: never committed by a `git add -A`."""
    for path in (".whl-tpu/jax-0.10.2-py3-none-any.whl", "runs/r1/record.json", ".tpu-rl/known_hosts"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0, path
