"""The run's folders, the SSH user's alone (remote/folders.py), and the plan's list of them (plan.folders).

As root (the tests' user), another account is played by chown to `nobody`, and /dev/shm by a folder of
root's with mode 1777.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.remote import folders

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


@pytest.fixture
def shm(tmp_path) -> Path:
    """A shared root as /dev/shm is: root's, anyone may write, the sticky bit."""
    root = tmp_path / "shm"
    root.mkdir()
    root.chmod(0o1777)
    return root


def test_a_missing_folder_below_a_shared_root_is_made_private_first(shm):
    assert folders.problem(str(shm / "tpu-rl-me" / "model" / "post-train")) is None
    made = (shm / "tpu-rl-me").stat()
    assert stat.S_IMODE(made.st_mode) == 0o700 and made.st_uid == os.geteuid()
    assert not (shm / "tpu-rl-me" / "model").exists()  # the rest is the jobs' to make, inside it


def test_a_folder_another_account_made_first_is_refused_and_left_alone(shm):
    claimed = shm / "tpu-rl-me"
    claimed.mkdir(mode=0o777)
    claimed.chmod(0o777)
    os.chown(claimed, NOBODY, NOBODY)
    why = folders.problem(str(claimed / "model"))
    assert why.startswith(f"{claimed} belongs to ") and f"(uid {NOBODY})" in why
    assert claimed.stat().st_uid == NOBODY and stat.S_IMODE(claimed.stat().st_mode) == 0o777  # nothing taken over


def test_a_folder_others_may_write_is_refused_even_when_it_is_ours(shm, tmp_path):
    open_to_all = tmp_path / "home" / "shared-venv"
    open_to_all.mkdir(parents=True)
    open_to_all.chmod(0o775)
    assert folders.problem(str(open_to_all / "bin")) == (
        f"{open_to_all} may be written by its group (mode 0775): another account could change what the jobs write "
        f"there; chmod go-w {open_to_all}, or set the folder elsewhere"
    )


def test_a_link_another_account_planted_is_refused(shm, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = shm / "tpu-rl-me"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    assert f"{link} belongs to " in folders.problem(str(link / "model"))


def test_our_own_link_is_followed_and_its_target_checked(shm, tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o777)
    target.chmod(0o777)
    (shm / "tpu-rl-me").symlink_to(target)
    assert f"{target} may be written by others" in folders.problem(str(shm / "tpu-rl-me" / "model"))


def test_our_folder_in_a_shared_root_is_made_private_again(shm):
    ours = shm / "tpu-rl-me"
    ours.mkdir()
    ours.chmod(0o755)
    assert folders.problem(str(ours / "model")) is None
    assert stat.S_IMODE(ours.stat().st_mode) == 0o700


def test_a_shared_root_that_is_not_sticky_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    assert "may be written by others (mode 0777)" in folders.problem(str(loose / "tpu-rl-me"))


def test_the_checks_name_the_setting_and_the_folder(shm):
    claimed = shm / "taken"
    claimed.mkdir()
    os.chown(claimed, NOBODY, NOBODY)
    both = {"vars.work_dir": str(claimed / "m"), "vars.run_dir": str(claimed / "m" / "r1")}
    checks = folders.checks({**both, "environment.venv": str(shm / "mine" / "venv")})
    assert [c["ok"] for c in checks] == [False]  # said once, by the first setting that meets it
    assert checks[0]["message"].startswith(f"vars.work_dir {claimed / 'm'}: {claimed} belongs to ")
    assert folders.checks({"environment.venv": str(shm / "mine" / "venv")}) == [
        {"check": "folder", "ok": True, "message": "the run's folders are the SSH user's alone (1)"}
    ]


def written(plan) -> list[str]:
    """Every path on the VM that a job of the plan names: argument values, environment values, outputs, inputs,
    follow-up steps (what the jobs read and write)."""
    paths = []
    for job in plan.rendered:
        paths += [word.partition("=")[2] if "=" in word else word for word in job.argv[1:]]
        paths += [*job.env.values(), *job.outputs, *job.inputs, *(w for step in job.after for w in step)]
    return [p for p in paths if p.startswith(("/", "~/"))]


@pytest.mark.parametrize("overrides", [[], ["vars.durable_dir=gs://b/m"]], ids=["no bucket", "bucket"])
def test_every_folder_the_shipped_jobs_write_is_checked(overrides):
    plan = build(load.read(REPO / "jobs"), overrides, "r1", "alice")
    checked = list(plan.folders.values())
    for path in written(plan):
        assert any(path == c or path.startswith(f"{c}/") for c in checked), path
    assert plan.folders["vars.work_dir"] == "/dev/shm/tpu-rl-alice/llama3.1-8b-Instruct"  # the SSH user's own
    assert plan.folders["environment.venv"] == "~/maxtext_venv" and plan.folders["vm.state_dir"] == "~/tpu-rl"
    assert plan.folders["vars.hf_home"] == "~/.cache/huggingface"


def test_a_folder_added_to_the_job_files_is_checked_without_being_listed():
    plan = build(
        load.read(REPO / "jobs"),
        ["vars.scratch=/tmp/scratch-of-mine", "train.base_output_directory=${scratch}/out", "export.env.CACHE=/var/c"],
        "r1",
    )
    assert plan.folders["vars.scratch"] == "/tmp/scratch-of-mine"
    assert plan.folders["export.env.CACHE"] == "/var/c"
    assert plan.folders["train.base_output_directory"] == "/tmp/scratch-of-mine/out"  # named by its key


def test_an_ssh_user_who_is_not_root_keeps_their_own_folders_and_is_refused_anothers(tmp_path):
    """The other tests run as root; the VM's SSH user is not: checked as `nobody`, a folder of nobody's own (and
    root's above it) passes, one of a third account's is refused."""
    mine = tmp_path / "mine" / "model"
    mine.mkdir(parents=True)
    os.chown(mine.parent, NOBODY, NOBODY)
    os.chown(mine, NOBODY, NOBODY)
    assert folders.problem(str(mine), uid=NOBODY) is None
    os.chown(mine, 4242, 4242)
    assert f"{mine} belongs to uid 4242, not to " in folders.problem(str(mine), uid=NOBODY)
