"""Bad jobs and bad overrides: each stops before anything starts, naming file, key and fix."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap import secrets
from bootstrap.errors import UserError
from bootstrap.jobs import load
from bootstrap.jobs.plan import check_local
from bootstrap.paths import REPO
from tests import fabfork


def load_checked(directory, overrides):
    return check_local(load.read(directory), overrides)


OVERRIDE_CASES = [
    (
        "train.num_batchs=3",
        "--arg train.num_batchs=3: args.num_batchs: not a MaxText 0.2.3 config key; did you mean num_batches",
    ),
    (
        "train.loss_algo=gspo-token",
        "args.loss_algo: RL setting at the top level has no effect on RL training; write it as rl.loss_algo",
    ),
    ("train.rl.bogus=1", "args.rl.bogus: unknown key under rl. (MaxText would silently ignore it)"),
    ("train.debug.verbose=1", "args.debug.verbose: unknown key under debug."),
    (
        "export.--lazy_load_tensors=False",
        "--lazy_load_tensors is not a flag of maxtext.checkpoint_conversion.to_huggingface; it belongs to maxtext.checkpoint_conversion.to_maxtext",
    ),
    ("vars.model_name=llama3.1-8b-instruct", "'llama3.1-8b-instruct' is not one of"),
    (
        "train.base_emb_dim=1024",
        "args.base_emb_dim: llama3.1-8b.yml (MaxText's model config) sets it to 4096; add override_model_config=True",
    ),
    ("train.num_batches=many", "args.num_batches: 'many' is not an integer"),
    # Values are never parsed as YAML: a python tag, a deep nest or a broken flow list is only a wrong value.
    ('train.base_emb_dim=!!python/object/apply:os.system ["true"]', "args.base_emb_dim: '!!python/object/apply"),
    ("train.base_emb_dim=" + "[" * 2000, "args.base_emb_dim: '[[[["),
    ("train.base_emb_dim=[", "args.base_emb_dim: '[' is not an integer"),
    ("train.base_emb_dim=4096", None),  # the model's own value: accepted without override_model_config
    ("train.scan_layers=maybe", "args.scan_layers: 'maybe' is not a boolean"),
    ("export.model_name=llama3.1-8b", "args.model_name: 'llama3.1-8b' differs from convert's 'llama3.1-8b-Instruct'"),
    ("train", "--arg train: --arg: expected JOB.KEY=VALUE"),
    ("bogus.x=1", "--arg bogus.x=1: bogus: no such job; use one of prefetch, convert, train, export or vars"),
    ("vars.work_dir=${nowhere}", "--arg vars.work_dir=${nowhere}: vars.work_dir: undefined variable ${nowhere}"),
]


@pytest.mark.parametrize(("override", "message"), OVERRIDE_CASES, ids=[c[0][:60] for c in OVERRIDE_CASES])
def test_bad_override(override, message):
    if message is None:
        load_checked(REPO / "jobs", [override])
        return
    with pytest.raises(UserError) as raised:
        load_checked(REPO / "jobs", [override])
    assert message in str(raised.value)


def test_model_name_override_suggests_the_right_name():
    with pytest.raises(UserError, match="did you mean llama3.1-8b-Instruct"):
        load_checked(REPO / "jobs", ["vars.model_name=llama3.1-8b-instruct"])


@pytest.fixture
def jobs_copy(tmp_path) -> Path:
    shutil.copytree(REPO / "jobs", tmp_path / "jobs")
    return tmp_path / "jobs"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


FILE_CASES = [
    ("train.yaml", "  num_test_batches: 42\n", "  num_test_batches: [42\n", "not valid YAML"),
    ("train.yaml", "  run_name: ${run_name}", "  run_name: ${nope}", "args.run_name: undefined variable ${nope}"),
    (
        "convert.yaml",
        "needs: [prefetch]",
        "needs: [export]",
        "needs: dependency cycle: convert -> export -> train -> convert",
    ),
    ("train.yaml", "needs: [convert]", "needs: [convrt]", "needs: no job 'convrt'"),
    ("export.yaml", "needs: [train]", "needs: [train]\ntimeout: 5", "timeout: unknown key (not part of the schema)"),
    ("convert.yaml", "outputs:\n  - ${checkpoint_dir}/0/items\n", "", "outputs: Field required"),
    ("convert.yaml", "secrets: [HF_TOKEN]", "secrets: [HF_TOKEN, AWS_KEY]", "secrets: unknown secret 'AWS_KEY'"),
    ("pipeline.yaml", '  python: "3.12"', '  python: "3.12"\n  pyhton: "3.11"', "environment.pyhton: unknown key"),
]


@pytest.mark.parametrize(("file", "old", "new", "message"), FILE_CASES, ids=[c[3][:30] for c in FILE_CASES])
def test_bad_job_file(jobs_copy, file, old, new, message):
    path = jobs_copy / file
    edit(path, old, new)
    with pytest.raises(UserError) as raised:
        pipeline = load_checked(jobs_copy, [])
        secrets.require({str(job.doc.path): job.spec.secrets for job in pipeline.jobs.values()})
    assert message in str(raised.value)
    assert str(path) in str(raised.value)


def test_error_points_at_the_line(jobs_copy):
    path = jobs_copy / "train.yaml"
    edit(path, "  chips_per_vm: ${chips}", "  chips_per_vm: ${chips}\n  loss_algo: grpo")
    with pytest.raises(UserError) as raised:
        load_checked(jobs_copy, [])
    assert f"{path}:{line_of(path, 'loss_algo: grpo')}: args.loss_algo" in str(raised.value)


def test_missing_token_is_an_error(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no stored token either
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    with pytest.raises(UserError, match="jobs/train.yaml: secrets: HF_TOKEN is required but not set"):
        secrets.require({"jobs/train.yaml": ["HF_TOKEN"]})


def test_all_problems_reported_at_once():
    with pytest.raises(UserError) as raised:
        load_checked(REPO / "jobs", ["train.loss_algo=grpo", "train.rl.bogus=1", "convert.num_batchs=2"])
    assert len(raised.value.problems) == 3


def fab(*args: str, env=None) -> subprocess.CompletedProcess:
    return fabfork.run([fabfork.FAB, "-r", str(REPO), *args], capture_output=True, text=True, env=env)


def test_fab_plan_fails_fast_with_the_message():
    started = time.monotonic()
    result = fab("plan", "--arg", "train.loss_algo=grpo")
    took = time.monotonic() - started
    assert result.returncode == 2
    assert "write it as rl.loss_algo" in result.stderr
    assert took < 30  # generous: the point is "before anything is contacted", not a benchmark


def test_fab_plan_offline_text_and_json_with_the_token_redacted(tmp_path):
    token = "hf_plan" + "x" * 30
    env = {**os.environ, "HF_TOKEN": token, "TPU_RL_RUNS": str(tmp_path), "PATH": "/usr/bin:/bin"}
    text = fab("plan", env=env)
    assert text.returncode == 0, text.stderr
    assert "run: <new> (a new run: its name is generated when fab train starts)" in text.stdout
    assert "HF_TOKEN='<redacted>'" in text.stdout and token not in text.stdout
    assert "--lazy_load_tensors=False" in text.stdout
    data = json.loads(fab("plan", "--json", env=env).stdout)
    jobs = {job["name"]: job for job in data["jobs"]}
    assert list(jobs) == ["prefetch", "convert", "train", "export"]
    assert jobs["train"]["env"]["HF_TOKEN"] == "<redacted>"
    assert jobs["train"]["argv"][2] == "maxtext.trainers.post_train.rl.train_rl"
    assert jobs["convert"]["needs"] == ["setup", "prefetch"] and jobs["export"]["needs"] == ["setup", "train"]
    assert jobs["convert"]["shared"] and jobs["prefetch"]["shared"] and not jobs["train"]["shared"]
    assert jobs["convert"]["job_dir"].startswith("tpu-rl/shared/convert-")


def test_fab_plan_names_the_recorded_run(tmp_path):
    (tmp_path / "current").write_text("2026-11-30-12-00-00\n")
    (tmp_path / "2026-11-30-12-00-00").mkdir()
    (tmp_path / "2026-11-30-12-00-00" / "record.json").write_text(
        '{"name": "2026-11-30-12-00-00", "jobs": {"convert": {"state": "done"}, "train": {"state": "interrupted"}}}'
    )
    env = {**os.environ, "TPU_RL_RUNS": str(tmp_path)}
    data = json.loads(fab("plan", "--json", env=env).stdout)
    assert data["run"]["name"] == "2026-11-30-12-00-00"
    assert data["run"]["has_checkpoints"] is True
    assert "run_name=2026-11-30-12-00-00" in data["jobs"][2]["argv"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.hf_access_token={token}", "args.hf_access_token: the token is never passed as an argument"),
        ("train.hf_access_token=placeholder", "args.hf_access_token: the token is never passed as an argument"),
        ("convert.env.HF_HUB_TOKEN={token}", "env.HF_HUB_TOKEN: holds the value of your HF_TOKEN"),
        ("convert.--hf_model_path=/x/{token}", "flags.hf_model_path: holds the value of your HF_TOKEN"),
    ],
)
def test_the_token_in_a_job_is_refused_without_repeating_it(tmp_path, override, message):
    """MaxText's own hf_access_token= (or the token's value anywhere) would reach the VM's argv and fab plan."""
    token = "hf_arg" + "y" * 30
    env = {**os.environ, "HF_TOKEN": token, "TPU_RL_RUNS": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = fab("plan", "--arg", override.format(token=token), env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("error:") == 1 and message in result.stderr, result.stderr
    assert token not in result.stderr


@pytest.mark.parametrize("python", ["/nonexistent/python", "", "/etc/passwd", sys.executable])
def test_fab_check_with_a_python_that_cannot_validate_is_one_line(python):
    result = fab("check", "--python", python)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "scripts/maxtext_config_env.py" in result.stderr and "Traceback" not in result.stderr


def test_fab_plan_prints_commands_a_shell_runs_as_shown(tmp_path):
    """~/ stays where the shell expands it; everything else is quoted as the shell needs."""
    env = {**os.environ, "TPU_RL_RUNS": str(tmp_path)}
    text = fab("plan", env=env).stdout
    assert "   argv:    ~/maxtext_venv/bin/python3 -m maxtext.checkpoint_conversion.to_maxtext \\" in text
    assert "HF_HOME=~/.cache/huggingface " in text and "'~/" not in text


def test_the_token_pieced_together_or_in_any_part_of_the_job_files_is_refused(tmp_path):
    """A follow-up step, the environment spec, vars joined by ${...}: wherever the value would travel."""
    token = "hf_pieces" + "z" * 30
    env = {**os.environ, "HF_TOKEN": token, "TPU_RL_RUNS": str(tmp_path), "PATH": "/usr/bin:/bin"}
    joined = fab(
        "plan",
        "--arg",
        f"vars.a={token[:10]}",
        "--arg",
        f"vars.b={token[10:]}",
        "--arg",
        "convert.env.Y=${a}${b}",
        env=env,
    )
    assert joined.returncode == 2 and "env.Y: holds the value of your HF_TOKEN" in joined.stderr
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    edit(jobs / "export.yaml", '"${export_dir}", "${hf_model}"]', f'"${{export_dir}}", "${{hf_model}}", "--t={token}"]')
    edit(
        jobs / "pipeline.yaml",
        "    UV_TORCH_BACKEND: cpu",
        f"    UV_TORCH_BACKEND: cpu\n    UV_INDEX: https://x:{token}@idx",
    )
    for job in ("prefetch", "convert", "train", "export"):  # no job declares the token: it is checked all the same
        path = jobs / f"{job}.yaml"
        path.write_text("\n".join(line for line in path.read_text().splitlines() if not line.startswith("secrets:")))
    result = fab("plan", env={**env, "TPU_RL_JOBS": str(jobs)})
    assert result.returncode == 2 and token not in result.stderr + result.stdout
    assert "export.yaml" in result.stderr and "after.0.4: holds the value of your HF_TOKEN" in result.stderr
    assert "pipeline.yaml" in result.stderr and "environment.install_env.UV_INDEX: holds" in result.stderr


def notify_jobs(tmp_path: Path, entry: str) -> Path:
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    text = (jobs / "pipeline.yaml").read_text().replace("  notify: []", f"  notify: [{entry!r}]")
    (jobs / "pipeline.yaml").write_text(text)
    return jobs


HOOK_URL = "https://hooks.slack.com/services/T000/B000/" + "s3cr3t" * 4


@pytest.mark.parametrize("setting", [f"train.env.X={HOOK_URL}", f"train.num_batches={HOOK_URL}"])
def test_a_webhook_url_on_the_command_line_is_refused_and_never_printed(tmp_path, setting):
    """A receiver's URL is a secret as the token is: written into an --arg it is refused, in lines that never
    quote it (the plan would show it, the VM's argv or environment would hold it)."""
    env = {**os.environ, "SLACK_URL": HOOK_URL, "TPU_RL_JOBS": str(notify_jobs(tmp_path, "SLACK_URL")),
           "TPU_RL_RUNS": str(tmp_path / "runs")}  # fmt: skip
    refused = fab("plan", "--arg", setting, env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "holds the value of your SLACK_URL, a webhook URL of results.notify" in refused.stderr
    assert "s3cr3t" not in refused.stderr and "<redacted>" in refused.stderr


@pytest.mark.parametrize("written", [HOOK_URL, HOOK_URL.removeprefix("https://")])
def test_a_url_written_into_results_notify_is_refused_without_quoting_it(tmp_path, written):
    env = {**os.environ, "TPU_RL_JOBS": str(notify_jobs(tmp_path, written)), "TPU_RL_RUNS": str(tmp_path / "runs")}
    refused = fab("plan", env=env)
    assert refused.returncode == 2 and "s3cr3t" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.endswith("results.notify.0: is a URL (not repeated here: it may be a secret), not the name of a "
                         "variable holding one: export NAME=<the URL> on this machine and write NAME here")  # fmt: skip


def test_a_value_quoted_back_is_cut_to_a_readable_length():
    refused = fab("plan", "--arg", f"vars.num_batches={'9' * 10_000}")
    (line,) = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(line) < 400 and "...(10,017 characters)" in line


def test_where_a_problem_is_stays_whole_however_long_its_path(tmp_path):
    """Only a value quoted back is cut: the file and line of a long checkout's job file are always said."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "jobs"
    shutil.copytree(REPO / "jobs", deep)
    (deep / "train.yaml").write_text((deep / "train.yaml").read_text().replace("\nneeds:", "\nneed:"))
    refused = fab("plan", env={**os.environ, "TPU_RL_JOBS": str(deep), "TPU_RL_RUNS": str(tmp_path / "runs")})
    assert refused.returncode == 2 and f"{deep / 'train.yaml'}:" in refused.stderr, refused.stderr
