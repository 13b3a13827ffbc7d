"""The authoritative layer for real: each supported MaxText's own pyconfig, on CPU, in a Python 3.12 venv."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bootstrap.jobs import load, schema
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from scripts import maxtext_config_env
from tests import fabfork
from tests.unit.test_maxtext_versions import jobs_installing

CHECK = REPO / "bootstrap" / "remote" / "maxtext_check.py"
pytestmark = pytest.mark.maxtext


@pytest.fixture(scope="module")
def maxtext_python() -> Path:
    return maxtext_config_env.ensure()


def fab(*args: str, jobs: Path = REPO / "jobs") -> subprocess.CompletedProcess:
    return fabfork.run(
        [fabfork.FAB, "-r", str(REPO), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TPU_RL_JOBS": str(jobs)},
    )


@pytest.mark.parametrize("version", schema.supported())
def test_each_maxtext_accepts_the_shipped_jobs_rendered_for_it(tmp_path, version):
    """The shipped jobs, with the environment pinned to `version`, pass that version's own validator, train_rl
    through the config class it parses with (0.2.4's RLConfig has other keys than MaxTextConfig)."""
    python = maxtext_config_env.ensure(version)
    result = fab("check", "--python", str(python), jobs=jobs_installing(tmp_path, f"maxtext=={version}"))
    assert result.returncode == 0, result.stdout + result.stderr
    for job, module in (("convert", "to_maxtext"), ("train", "train_rl"), ("export", "to_huggingface")):
        assert f"{job}: ok: maxtext." in result.stdout and module in result.stdout


@pytest.mark.parametrize("version", schema.supported())
def test_each_facts_file_is_what_its_wheel_says(version):
    python = maxtext_config_env.ensure(version)
    result = subprocess.run(
        [python, REPO / "scripts" / "generate_maxtext_schema.py", "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0 and f"maxtext/{version}.json: up to date" in result.stdout, result.stderr[-2000:]


def test_fab_check_refuses_another_versions_validator_in_one_line(maxtext_python, tmp_path):
    result = fab("check", "--python", str(maxtext_python), jobs=jobs_installing(tmp_path, "maxtext==0.2.5"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "has maxtext 0.2.3, the jobs install 0.2.5" in result.stderr
    assert "scripts/maxtext_config_env.py 0.2.5" in result.stderr


BAD_ARGS = {  # a job name: train_rl's arguments, and MaxText's own error for them
    "lowercase": (
        ["model_name=llama3.1-8b-instruct"],
        "MAXTEXT CONFIG ERROR: 1 validation error for MaxTextConfig model_name Input should be",
    ),
    "bogus": (["model_name=llama3.1-8b-Instruct", "bogus_key=1"], "MAXTEXT CONFIG ERROR: 'bogus_key' not in"),
    "both": (
        ["model_name=llama3.1-8b-Instruct", "base_emb_dim=1024"],
        "MAXTEXT CONFIG ERROR: Keys ['base_emb_dim'] are overridden by both model config",
    ),
}


def test_maxtext_rejects_bad_args_with_its_own_error(maxtext_python):
    """Each bad argument gets MaxText's own error in one line (not its 700-line config dump); one process checks
    them all, as the validate job does, and pays MaxText's import once."""
    words = [
        w
        for name, (args, _) in BAD_ARGS.items()
        for w in ("--job", name, "maxtext.trainers.post_train.rl.train_rl", *args)
    ]
    result = subprocess.run([maxtext_python, CHECK, *words], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stdout.splitlines()
    assert len(lines) == len(BAD_ARGS), result.stdout[-3000:]
    for line, (name, (_, message)) in zip(lines, BAD_ARGS.items(), strict=True):
        assert line.startswith(f"{name}: ") and message in line and len(line) < 1200, line[:1500]


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
