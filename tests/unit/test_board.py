"""fab tensorboard's copy of a run's events (results/board.py): what train appended is appended here, in the same
file, so that TensorBoard's open reader sees it; a file that is not the copy grown replaces it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap.errors import UserError
from bootstrap.paths import REPO
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


def test_a_path_outside_the_folder_is_refused_and_nothing_is_written(tmp_path):
    """A listing that names `../x` (a VM that lies) writes nothing outside the served folder."""

    class Lying(Folder):
        def list_files(self, directory: str) -> dict[str, int]:
            return {"../outside": 3}

    here = tmp_path / "here"
    with pytest.raises(UserError, match="outside"):
        board.sync(Lying(), str(tmp_path / "vm"), here)
    assert not (tmp_path / "outside").exists()


SERVING = """
import signal, subprocess, sys, threading, time
from bootstrap.results import board

copies = []
def copy():
    copies.append(time.monotonic())
    if len(copies) == 3:
        print("copying", flush=True)
        if sys.argv[2] == "copy":  # Ctrl-C as the kernel may hand it out: to the copy's thread, not the main one
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        while True:  # an SFTP read that never returns, in a library whose bare `except:` would swallow Ctrl-C
            try:
                threading.Event().wait()
            except BaseException:
                pass
server = subprocess.Popen(["sleep", "600"])
try:
    board.serve(server, copy, float(sys.argv[1]))
except KeyboardInterrupt:
    server.kill()
    print("stopped", len(copies), flush=True)
"""


@pytest.mark.parametrize("thread", ["main", "copy"])
def test_ctrl_c_ends_the_serving_at_once_even_with_a_copy_in_flight(tmp_path, thread):
    """Copies every --every seconds (a fraction too) beside the server; Ctrl-C while one hangs ends fab at once,
    whichever thread the signal reached (`copy`: the copy's own; a blocking wait once left fab on TensorBoard)."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVING, "0.2", thread], cwd=REPO, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stdout.readline() == "copying\n"  # the third copy, 0.2 s apart
        assert time.monotonic() - started >= 0.6
        if thread == "main":
            process.send_signal(signal.SIGINT)
        process.wait(timeout=20)
        out = process.stdout.read()  # through the reader readline filled: it may hold the next line already
    finally:
        process.kill()
    assert out == "stopped 3\n" and process.returncode == 0
