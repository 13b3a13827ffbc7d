"""fab tensorboard's copy of a run's events (results/board.py): what train appended is appended here, in the same
file, so that TensorBoard's open reader sees it; a file that is not the copy grown replaces it."""

from __future__ import annotations

import shutil
from pathlib import Path

from bootstrap.results import board


class Folder:
    """A folder of this machine as transfer's Source: what Vm offers over SSH."""

    name = "vm"

    def list_files(self, directory: str) -> dict[str, int]:
        root = Path(directory)
        return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}

    def fetch(self, path: str, target: Path) -> None:
        shutil.copyfile(path, target)


def test_new_records_are_appended_to_the_same_file_and_a_rewritten_one_replaces_it(tmp_path):
    vm, here = tmp_path / "vm", tmp_path / "here"
    events = vm / "train" / "events.out.tfevents.1"
    events.parent.mkdir(parents=True)
    events.write_bytes(b"record-1;")
    assert board.sync(Folder(), str(vm), here) == 9
    copy = here / "train" / "events.out.tfevents.1"
    reader = copy.open("rb")  # as TensorBoard holds it
    assert reader.read() == b"record-1;"
    with events.open("ab") as f:
        f.write(b"record-2;")
    assert board.sync(Folder(), str(vm), here) == 9  # only what is new
    assert reader.read() == b"record-2;"  # the open reader sees it: the same file, grown
    assert board.sync(Folder(), str(vm), here) == 0
    events.write_bytes(b"another run's file, longer")
    board.sync(Folder(), str(vm), here)
    assert copy.read_bytes() == b"another run's file, longer"
    reader.close()
