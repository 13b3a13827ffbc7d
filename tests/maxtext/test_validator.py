"""The authoritative layer for real: MaxText 0.2.3's own pyconfig, on CPU, in a Python 3.12 venv."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.paths import REPO
from bootstrap.remote import jobrunner
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


def test_the_job_runner_validates_before_starting_the_job(maxtext_python, tmp_path):
    """What runs on the VM before each job: a rejected argument fails in seconds, the job never starts."""
    outputs = tmp_path / "never-written"
    spec = {
        "name": "train",
        "argv": [
            str(maxtext_python),
            "-m",
            "maxtext.trainers.post_train.rl.train_rl",
            "model_name=llama3.1-8b-Instruct",
            "rl.loss_algo=bogus",
        ],
        "env": {},
        "secrets": [],
        "outputs": [str(outputs)],
        "cwd": str(tmp_path),
        "validate": [str(CHECK), "maxtext.trainers.post_train.rl.train_rl"],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert jobrunner._Job(str(tmp_path)).run() == 2
    log = (tmp_path / "log").read_text()
    assert "MAXTEXT CONFIG ERROR" in log and "loss_algo" in log
    assert "[tpu-rl] starting" not in log
    assert json.loads((tmp_path / "result.json").read_text())["error"] == "MaxText rejected the arguments"
    assert not (tmp_path / "done").exists()


def test_schema_file_matches_the_real_package(maxtext_python):
    result = subprocess.run(
        [maxtext_python, REPO / "scripts" / "generate_maxtext_schema.py", "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
