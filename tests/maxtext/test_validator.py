"""The authoritative layer for real: MaxText 0.2.3's own pyconfig, on CPU, in a Python 3.12 venv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from scripts import maxtext_config_env

CHECK = REPO / "bootstrap" / "remote" / "maxtext_check.py"
pytestmark = pytest.mark.maxtext


@pytest.fixture(scope="module")
def maxtext_python() -> Path:
    return maxtext_config_env.ensure()


def fab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("fab")), "-r", str(REPO), *args], capture_output=True, text=True
    )


def test_maxtext_accepts_the_shipped_jobs(maxtext_python):
    result = fab("check", "--python", str(maxtext_python))
    assert result.returncode == 0, result.stdout + result.stderr
    for job, module in (("convert", "to_maxtext"), ("train", "train_rl"), ("export", "to_huggingface")):
        assert f"{job}: ok: maxtext." in result.stdout and module in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["model_name=llama3.1-8b-instruct"],
            "MAXTEXT CONFIG ERROR: 1 validation error for MaxTextConfig model_name Input should be",
        ),
        (["model_name=llama3.1-8b-Instruct", "bogus_key=1"], "MAXTEXT CONFIG ERROR: 'bogus_key' not in"),
        (
            ["model_name=llama3.1-8b-Instruct", "base_emb_dim=1024"],
            "MAXTEXT CONFIG ERROR: Keys ['base_emb_dim'] are overridden by both model config",
        ),
    ],
)
def test_maxtext_rejects_bad_args_with_its_own_error(maxtext_python, args, message):
    result = subprocess.run(
        [maxtext_python, CHECK, "maxtext.trainers.post_train.rl.train_rl", *args], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert message in result.stdout
    assert len(result.stdout) < 1200  # one line, not MaxText's 700-line config dump


def test_the_validate_job_checks_every_job_at_once_and_marks_only_full_acceptance(maxtext_python, tmp_path):
    """What runs on the VM once setup is done: one rejected argument of any job fails the check in seconds,
    before convert and train spend anything; the marker (the job's output) appears only when all pass."""
    plan = build(load.read(REPO / "jobs"), ["export.rl.loss_algo=bogus"], "run-1")
    validate = plan.job("validate")
    assert validate.needs == ("setup",) and all("validate" in plan.job(n).needs for n in ("train", "export"))
    assert "validate" not in plan.job("convert").needs  # it runs beside the check, which it does itself at start
    argv = list(validate.runner_spec["argv"])
    words = argv[argv.index("--job") :]  # MaxText's part; the environment check (envcheck.py) has its own tests
    assert words.count("--job") == 3 and "load_parameters_path=" in " ".join(words)
    marker = tmp_path / "accepted"
    bad = subprocess.run([maxtext_python, CHECK, "--marker", marker, *words], capture_output=True, text=True)
    assert bad.returncode == 2
    lines = bad.stdout.splitlines()
    assert lines[0].startswith("convert: ok:") and lines[1].startswith("train: ok:")
    assert lines[2].startswith("export: MAXTEXT CONFIG ERROR") and "loss_algo" in lines[2]
    assert not marker.exists()
    good_argv = list(build(load.read(REPO / "jobs"), [], "run-1").job("validate").runner_spec["argv"])
    good = good_argv[good_argv.index("--job") :]
    assert subprocess.run([maxtext_python, CHECK, "--marker", marker, *good]).returncode == 0
    assert marker.read_text() == "3 jobs accepted\n"


def test_schema_file_matches_the_real_package(maxtext_python):
    result = subprocess.run(
        [maxtext_python, REPO / "scripts" / "generate_maxtext_schema.py", "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
