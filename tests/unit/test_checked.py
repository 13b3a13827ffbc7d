"""jobs/checked.py: the digest of what a command's local checks read, and the memo of those that passed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.jobs import checked
from bootstrap.paths import REPO


@pytest.fixture
def jobs(tmp_path, monkeypatch) -> Path:
    shutil.copytree(REPO / "jobs", tmp_path / "jobs")
    monkeypatch.setenv("TPU_RL_JOBS", str(tmp_path / "jobs"))
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_TOKEN", "hf_" + "a" * 34)
    return tmp_path / "jobs"


def digest(overrides=("train.num_batches=2",), run_name=None, **options: bool) -> str:
    return checked.LocalInputs(list(overrides), run_name, options).digest


def test_every_input_the_checks_read_changes_the_digest(jobs: Path, monkeypatch):
    """Any of them changed, the inputs never passed: that command checks before it contacts anything."""
    seen = {digest()}
    assert digest() in seen  # the same inputs, the same digest

    def differs(value: str) -> None:
        assert value not in seen
        seen.add(value)

    differs(digest(overrides=("train.num_batches=3",)))
    differs(digest(run_name="r1"))
    differs(digest(runs_jobs=False))  # another task: status needs no token set
    (jobs / "train.yaml").write_bytes((jobs / "train.yaml").read_bytes() + b"\n")
    differs(digest())
    monkeypatch.setenv("HF_TOKEN", "hf_" + "b" * 34)
    differs(digest())
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(jobs.parent / "no-hf-home"))  # no token stored by `hf auth login` either
    differs(digest())
    (jobs.parent / "no-hf-home").mkdir()
    (jobs.parent / "no-hf-home" / "token").write_text("hf_" + "c" * 34)  # `hf auth login`
    differs(digest())
    (jobs.parent / "no-hf-home" / "token").write_text("hf_" + "d" * 34)  # logged in again, as another token
    differs(digest())
    monkeypatch.setenv("HF_TOKEN_PATH", str(jobs.parent / "elsewhere"))
    differs(none_there := digest())
    os.mkfifo(jobs.parent / "elsewhere")
    assert digest() == none_there  # a FIFO is not read (never waited on): no token stored, as when none is there
    monkeypatch.setattr(checked, "REPO", jobs.parent / "tpu-rl")  # tpu-rl's own code: another version
    (jobs.parent / "tpu-rl" / "bootstrap").mkdir(parents=True)
    (jobs.parent / "tpu-rl" / "bootstrap" / "check.py").write_text("")
    differs(digest())
    os.utime(jobs.parent / "tpu-rl" / "bootstrap" / "check.py", ns=(0, 1))
    differs(digest())
    (jobs.parent / "tpu-rl" / "bootstrap" / "0.2.3.json").write_text("{}")  # MaxText's keys are read too
    differs(digest())
    (jobs.parent / "tpu-rl" / "bootstrap" / ".#check.py").symlink_to("nowhere")  # an editor's lock file
    differs(digest())


def test_the_token_of_hf_auth_login_is_not_looked_up_for_the_digest(jobs: Path, monkeypatch):
    """huggingface_hub takes a third of a second to import: the digest reads its token file instead, so that a
    user logged in with `hf auth login` dials as early as one with HF_TOKEN set."""
    monkeypatch.delenv("HF_TOKEN")
    (jobs.parent / "hf" / "token").parent.mkdir()
    (jobs.parent / "hf" / "token").write_text("hf_" + "c" * 34)
    program = (
        "import sys; from bootstrap.jobs import checked; checked.LocalInputs([], None, {}); print(sorted(sys.modules))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO,
        env={**os.environ, "HF_HOME": str(jobs.parent / "hf")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "bootstrap.jobs.checked" in shown.stdout and "huggingface_hub" not in shown.stdout


def test_a_token_huggingface_hub_would_mint_never_passed_before(jobs: Path, monkeypatch):
    """With HF_OIDC_RESOURCE set, huggingface_hub exchanges an OIDC token for one: nothing here tells that it
    is the same as last time, so the checks come first, every time."""
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_OIDC_RESOURCE", "user/repo")
    inputs = checked.LocalInputs([], None, {})
    inputs.passed()
    assert not inputs.passed_before()
    monkeypatch.setenv("HF_TOKEN", "hf_" + "a" * 34)  # ours comes first: HF_TOKEN is the token fab uses
    inputs = checked.LocalInputs([], None, {})
    inputs.passed()
    assert inputs.passed_before()


def test_the_memo_keeps_the_latest_inputs_that_passed(jobs: Path):
    inputs = [checked.LocalInputs([f"train.num_batches={n}"], None, {}) for n in range(checked.KEPT + 1)]
    assert not inputs[0].passed_before()
    for each in inputs:
        each.passed()
    assert inputs[-1].passed_before() and inputs[1].passed_before()
    assert not inputs[0].passed_before()  # the oldest made room
    inputs[1].passed()  # passed again: the newest, and kept once
    memo = (jobs.parent / "runs" / checked.MEMO).read_text().split()
    assert memo[0] == inputs[1].digest and len(memo) == len(set(memo)) == checked.KEPT


def test_a_memo_that_cannot_be_written_or_read_only_dials_later(jobs: Path, monkeypatch):
    inputs = checked.LocalInputs([], None, {})
    (jobs.parent / "runs").mkdir()
    (jobs.parent / "runs" / checked.MEMO).write_bytes(b"\xff\xfe not a digest")
    assert not inputs.passed_before()
    inputs.passed()
    assert inputs.passed_before()
    monkeypatch.setenv("TPU_RL_RUNS", str(jobs / "pipeline.yaml" / "runs"))  # under a file: nothing can be written
    inputs.passed()
    assert not inputs.passed_before()
