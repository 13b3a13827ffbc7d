"""The run's folders are the SSH user's alone: another account of the VM cannot own them, through the real fab."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from tests.loopback import Fab

NOBODY = 65534


def test_a_work_folder_another_account_made_first_starts_nothing_and_is_left_alone(fab: Fab):
    """The review's attack: another account makes the work folder in /dev/shm before the first convert, open to
    all. Before, the pipeline ran to done in it and certified what that account could swap; now no job starts."""
    shm = fab.tmp / "shm"  # the loopback's /dev/shm: root's, anyone may write, sticky
    shm.mkdir()
    shm.chmod(0o1777)
    claimed = shm / "llama3.1-8b-Instruct"
    claimed.mkdir()
    claimed.chmod(0o777)
    os.chown(claimed, NOBODY, NOBODY)
    result = fab("train", "--arg", "vars.num_batches=2")
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "preflight folder: vars.work_dir" in errors[0], result.stderr
    assert f"{claimed} belongs to " in errors[0] and f"(uid {NOBODY})" in errors[0]
    assert not list((fab.tmp / "state").glob("**/runner.json"))  # no job started, not even setup
    assert list(claimed.iterdir()) == [] and claimed.stat().st_uid == NOBODY  # nothing written, nothing taken


def test_the_work_folder_is_made_private_before_any_job(fab: Fab):
    """Our own work folder, left open by an earlier tool (0755): the check makes it 0700 before any job (the jobs
    make only missing folders, 0700, and leave an existing one as it is)."""
    shm = fab.tmp / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    (shm / "llama3.1-8b-Instruct").mkdir(mode=0o755)
    (shm / "llama3.1-8b-Instruct").chmod(0o755)
    result = fab("train", "--arg", "vars.num_batches=2")
    assert result.returncode == 0, result.stdout + result.stderr
    made = (shm / "llama3.1-8b-Instruct").stat()
    assert made.st_mode & 0o777 == 0o700 and made.st_uid == os.geteuid()


def test_an_export_another_account_planted_after_a_restart_is_never_taken_downloaded_or_listed(fab: Fab, tmp_path):
    """The review's HIGH: the run is done; a restart empties /dev/shm; another account makes the work folder
    again and puts an export of its own (SHA256SUMS and all) where the run's was. The next pass takes nothing as
    done from the markers in the private state folder, fab download writes nothing, fab runs lists no export."""
    shm = fab.tmp / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    run = (fab.tmp / "state" / "current-run").read_text().strip()
    work = shm / "llama3.1-8b-Instruct"
    export = work / "hf-trained" / run
    theirs = {p.name: p.read_bytes() for p in export.iterdir()}  # their copy of the layout, weights of their own
    theirs["model.safetensors"] = b"someone else's weights"
    theirs["SHA256SUMS"] = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(theirs.items()) if name != "SHA256SUMS"
    ).encode()
    shutil.rmtree(work)  # the restart
    export.mkdir(parents=True)
    for name, data in theirs.items():
        (export / name).write_bytes(data)
    for folder, _, files in os.walk(work):
        os.chown(folder, NOBODY, NOBODY)
        os.chmod(folder, 0o777)
        for name in files:
            os.chown(os.path.join(folder, name), NOBODY, NOBODY)

    dest = tmp_path / "model"
    download = fab("download", "--dest", str(dest))
    assert download.returncode == 2 and f"{work} belongs to " in download.stderr, download.stderr
    assert not dest.exists()
    runs = json.loads(fab("runs", "--json").stdout)
    assert "vm" not in next(row for row in runs if row["run"] == run)["kept"]
    again = fab("train", "--arg", "vars.num_batches=2")
    assert again.returncode == 2 and "preflight folder: vars.work_dir" in again.stderr, again.stdout + again.stderr
    assert "skipping" not in again.stdout  # nothing taken as done
    assert {p.name: p.read_bytes() for p in export.iterdir()} == theirs and work.stat().st_uid == NOBODY
