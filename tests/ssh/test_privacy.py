"""The run's folders are the SSH user's alone: another account of the VM cannot own them, through the real fab."""

from __future__ import annotations

import os

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
    shm = fab.tmp / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    result = fab("train", "--arg", "vars.num_batches=2")
    assert result.returncode == 0, result.stdout + result.stderr
    made = (shm / "llama3.1-8b-Instruct").stat()
    assert made.st_mode & 0o777 == 0o700 and made.st_uid == os.geteuid()
