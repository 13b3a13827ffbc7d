"""Every supported MaxText version is checked by its own facts: the version environment.packages pins
chooses the keys, the renames, the defaults and the schedule; an unsupported or unpinned one is refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bootstrap.errors import UserError
from bootstrap.jobs import load, schedule, schema
from bootstrap.jobs.plan import build, check_local
from bootstrap.paths import REPO
from tests import fabfork
from tests.loopback import edit_yaml

VERSIONS = schema.supported()


def jobs_installing(tmp_path: Path, package: str) -> Path:
    """A copy of the shipped jobs/ whose environment installs `package`."""
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    edit_yaml(jobs / "pipeline.yaml", lambda data: data["environment"].update(packages=[package]))
    return jobs


def problems(tmp_path: Path, version: str, overrides: list[str]) -> str:
    with pytest.raises(UserError) as raised:
        check_local(load.read(jobs_installing(tmp_path, f"maxtext[tpu-post-train]=={version}")), overrides)
    return str(raised.value)


def test_the_supported_versions_are_the_guides_and_the_newest():
    assert VERSIONS[0] == schema.DEFAULT_VERSION == "0.2.3" and "0.2.5" in VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_the_shipped_jobs_pass_each_versions_check_and_say_which(tmp_path, version):
    files = load.read(jobs_installing(tmp_path, f"maxtext[tpu-post-train]=={version}"))
    assert check_local(files, []).maxtext.version == version
    plan = build(files, [], "run-1")
    assert plan.maxtext_version == version
    assert (plan.job("train").lr_schedule.train_steps, plan.job("train").lr_schedule.schedule_steps) == (50, 50)


@pytest.mark.parametrize(
    ("version", "override", "message"),
    [
        # 0.2.4 and later names, refused by 0.2.3 with the name it knows
        ("0.2.3", "train.hf_subset=main", "not a MaxText 0.2.3 config key; MaxText 0.2.3 calls it hf_name"),
        (
            "0.2.3",
            "train.gc_collect_after_weight_sync=false",
            "not a MaxText 0.2.3 config key; it is a key of MaxText 0.2.5, not of 0.2.3",
        ),
        ("0.2.3", "train.debug=true", "a group, not a value; set its keys as debug.NAME (rl)"),
        ("0.2.3", "train.num_generations=4", "RL setting at the top level has no effect on RL training"),
        # 0.2.3 names, refused by 0.2.5 with what became of them
        (
            "0.2.5",
            "train.rl.degenerate_group_masking=true",
            "unknown key under rl. (MaxText would silently ignore it); it is a key of MaxText 0.2.3, not of 0.2.5",
        ),
        ("0.2.5", "train.debug.rl=false", "'debug' has no nested keys in MaxText 0.2.5"),
        ("0.2.5", "train.debug.rl=false", "MaxText 0.2.4 renamed it debug"),
        ("0.2.5", "train.hf_name=main", "train_rl reads the dataset's subset from hf_subset; hf_name is accepted and"),
        ("0.2.5", "train.chat_template_path=t.json", "reads the prompt template (gsm8k_rl.json) from data_template_"),
        ("0.2.4", "train.hf_name=main", "from MaxText 0.2.4 on, train_rl reads the dataset's subset from hf_subset"),
        # 0.2.4's RLConfig copies the flat value rl.yml sets over the group's: the group's is silently lost
        (
            "0.2.5",
            "train.dataset.num_batches=10",
            "MaxText 0.2.5's post_train/rl.yml sets num_batches itself, and that value is copied over "
            "dataset.num_batches (silently ignored); write it as num_batches",
        ),
        ("0.2.4", "train.vllm.max_num_seqs=7", "sets max_num_seqs itself, and that value is copied over vllm."),
    ],
)
def test_a_key_of_one_version_is_refused_by_the_other_in_one_line(tmp_path, version, override, message):
    text = problems(tmp_path, version, [override])
    assert message in text and text.count("\n") == 0, text


@pytest.mark.parametrize(
    ("version", "overrides"),
    [
        ("0.2.5", ["train.hf_subset=main", "train.gc_collect_after_weight_sync=false", "train.debug=true"]),
        ("0.2.5", ["train.num_generations=4", "train.data_template_path=t.json"]),  # flat RL keys reach rl.
        ("0.2.3", ["train.hf_name=main", "train.debug.rl=true", "train.rl.degenerate_group_masking=true"]),
    ],
)
def test_each_versions_own_keys_pass(tmp_path, version, overrides):
    check_local(load.read(jobs_installing(tmp_path, f"maxtext[tpu-post-train]=={version}")), overrides)


@pytest.mark.parametrize(
    ("package", "message"),
    [
        ("maxtext==0.1.0", "MaxText 0.1.0 is not supported; supported: " + ", ".join(VERSIONS)),
        ("maxtext==0.2.5.1", "MaxText 0.2.5.1 is not supported"),
        ("maxtext==0.2.5rc1", "MaxText 0.2.5rc1 is not supported"),
        ("maxtext[tpu-post-train]>=0.2.3", "does not pin one MaxText version; write maxtext[tpu-post-train]==VERSION"),
        ("MaxText", "does not pin one MaxText version"),
        ("maxtext @ git+https://github.com/AI-Hypercomputer/maxtext", "does not pin one MaxText version"),
        ("git+https://github.com/AI-Hypercomputer/maxtext@v0.2.5", "does not pin one MaxText version"),
        ("/wheels/maxtext-0.2.5-py3-none-any.whl", "does not pin one MaxText version"),
    ],
)
def test_an_unsupported_or_unpinned_maxtext_is_refused_before_anything(tmp_path, package, message):
    env = {**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs"), "TPU_RL_JOBS": str(jobs_installing(tmp_path, package))}
    result = fabfork.run([fabfork.FAB, "-r", str(REPO), "plan"], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "pipeline.yaml" in result.stderr and "environment.packages: " in result.stderr, result.stderr
    assert message in result.stderr and result.stderr.count("error:") == 1, result.stderr


def test_a_package_list_without_maxtext_is_checked_as_the_guides_version(tmp_path):
    """A local stand-in or a wheel file names no version: the checks take the guide's."""
    files = load.read(jobs_installing(tmp_path, str(REPO / "tests" / "standin")))
    assert check_local(files, []).maxtext.version == schema.DEFAULT_VERSION


@pytest.mark.parametrize("version", VERSIONS)
def test_fab_plan_names_the_version(tmp_path, version):
    env = {
        **os.environ,
        "TPU_RL_RUNS": str(tmp_path / "runs"),
        "TPU_RL_JOBS": str(jobs_installing(tmp_path, f"maxtext[tpu-post-train]=={version}")),
    }
    result = fabfork.run([fabfork.FAB, "-r", str(REPO), "plan"], capture_output=True, text=True, env=env)
    assert f"0. setup: build the environment ~/maxtext_venv, MaxText {version} (" in result.stdout, result.stderr


def test_a_grouped_key_the_config_file_sets_flat_does_not_count():
    """What MaxText 0.2.5 trains with (measured with its own RLConfig: num_batches 4 for dataset.num_batches=10):
    the replay takes rl.yml's flat value, not the group's."""
    maxtext = schema.load("0.2.5")
    assert schedule.train_steps(maxtext, {"dataset.num_batches": "10"}) == 4
    assert schedule.train_steps(maxtext, {"num_batches": "10"}) == 10
    assert schedule.train_steps(maxtext, {"rl.num_iterations": "2"}) == 8  # rl.yml sets no flat num_iterations


@pytest.mark.parametrize(
    ("packages", "version"),
    [
        (["maxtext==0.2.5 ; python_version >= '3.12'"], "0.2.5"),  # an environment marker is not the version
        (["MaxText[tpu-post-train] == 0.2.5"], "0.2.5"),
        (["maxtext===0.2.4"], "0.2.4"),
        (["maxtext==0.2.5.0"], "0.2.5"),  # the same release, as pip compares them
    ],
)
def test_each_spelling_of_a_pin_is_its_version(packages, version):
    assert schema.pinned(packages).version == version


def test_two_maxtext_pins_are_refused():
    with pytest.raises(ValueError, match="names maxtext twice"):
        schema.pinned(["maxtext[tpu-post-train]==0.2.4", "maxtext==0.2.5"])
