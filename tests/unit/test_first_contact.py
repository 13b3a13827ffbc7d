"""A newcomer's first contact, before anything is paid for (issue 52), through the real fab: nothing that would buy
an unreachable VM, a plan that shows what fab train will run and lack, and help where users stumble."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from bootstrap.paths import REPO
from tests import fabfork, hubstub
from tests.unit.test_stumbles import fab, jobs, one_line  # noqa: F401 - jobs: the fixture

__all__ = ["jobs"]


@pytest.fixture
def stack(tmp_path):
    """A filled-in stack file (Pulumi.<name>.yaml in the clone, as pulumi keeps it): its name and config."""
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    config = {"gcp:project": "my-project", "gcp:zone": "us-east5-b", "tpu-rl:reservation": "r",
              "tpu-rl:sshUser": "alice", "tpu-rl:sshPublicKey": key.with_suffix(".pub").read_text().strip(),
              "tpu-rl:sshSourceRanges": ["100.64.7.0/24"]}  # fmt: skip
    path = REPO / f"Pulumi.contact-{os.getpid()}.yaml"
    path.write_text(json.dumps({"config": config}))
    yield path.stem.removeprefix("Pulumi."), config, path
    path.unlink()


def test_the_shipped_dev_stack_is_refused_by_fab_before_pulumi_up(tmp_path, jobs):
    line = one_line(fab(tmp_path, jobs, "plan", "--stack", "dev"))
    assert "Pulumi.dev.yaml: gcp:project: my-gcp-project is Pulumi.dev.yaml's placeholder" in line


@pytest.mark.parametrize(
    ("ranges", "said"),
    [(["203.0.113.7/32"], "is a documentation range"), (["2a00:1450:4001::/48"], "is an IPv6 range")],
)
def test_a_range_nobody_could_reach_the_vm_from_is_refused_by_fab(tmp_path, jobs, stack, ranges, said):
    name, config, path = stack
    path.write_text(json.dumps({"config": {**config, "tpu-rl:sshSourceRanges": ranges}}))
    assert said in one_line(fab(tmp_path, jobs, "plan", "--stack", name))


def test_the_plan_shows_the_folders_of_the_user_fab_train_logs_in_as(tmp_path, jobs, stack):
    """Never this laptop's login: the stack's tpu-rl:sshUser, -H's user, else the default, said."""
    name, _, _ = stack
    for args, user, why in (
        (("plan", "--stack", name), "alice", f"alice, Pulumi.{name}.yaml's tpu-rl:sshUser"),
        (("-H", "bob@10.1.2.3", "plan"), "bob", "bob, -H's"),
        (("plan",), "tpu-rl", "tpu-rl, tpu-rl:sshUser's default"),
    ):
        shown = fab(tmp_path, jobs, *args, USER="root", LOGNAME="root")
        assert shown.returncode == 0, shown.stderr
        assert f"/dev/shm/tpu-rl-{user}/" in shown.stdout and "/dev/shm/tpu-rl-root/" not in shown.stdout
        assert f"  user:     {why}" in shown.stdout


def test_the_plan_says_what_the_run_will_lack_before_it_is_paid_for(tmp_path, jobs):
    text = (jobs / "pipeline.yaml").read_text().replace("  notify: []", "  notify: [TPU_RL_NO_SUCH_HOOK]")
    (jobs / "pipeline.yaml").write_text(text)
    shown = fab(tmp_path, jobs, "plan", HF_TOKEN="")
    assert shown.returncode == 0, shown.stderr
    notes = shown.stdout[shown.stdout.index("before fab train:") :]
    assert "HF_TOKEN: not set: fab train refuses; the Hugging Face token (export HF_TOKEN=" in notes
    assert "notify:   TPU_RL_NO_SUCH_HOOK not set: fab train refuses" in notes
    assert "results:  none: the model lives only in the VM's memory (/dev/shm)" in notes
    assert "autostop: off: nothing keeps the model outside the VM" in notes
    assert "HF_TOKEN='<not set>'" in shown.stdout and "<redacted>" not in shown.stdout
    kept = fab(tmp_path, jobs, "plan", HF_TOKEN="hf_" + "k" * 34)
    assert "HF_TOKEN: set on this machine" in kept.stdout and "HF_TOKEN='<redacted>'" in kept.stdout


def test_the_token_is_checked_with_the_hub_before_any_vm(tmp_path, jobs):
    state, server = hubstub.serve()
    state.tokens["hf_good" + "x" * 30] = hubstub.Token()
    try:
        good = fab(tmp_path, jobs, "token", HF_TOKEN="hf_good" + "x" * 30, HF_ENDPOINT=state.url)
        bad = fab(tmp_path, jobs, "token", HF_TOKEN="hf_bad" + "x" * 30, HF_ENDPOINT=state.url)
    finally:
        server.shutdown()
    assert good.returncode == 0 and "HF_TOKEN: valid, user tester" in good.stdout, good.stderr
    assert "HF_TOKEN: can read meta-llama/Llama-3.1-8B-Instruct" in good.stdout
    assert "the Hub rejects this token" in one_line(bad)


def test_fab_token_checks_it_may_write_the_repository_the_run_publishes_to(tmp_path, jobs):
    text = (jobs / "pipeline.yaml").read_text().replace('  hub_repo: ""', "  hub_repo: tester/grpo-model")
    (jobs / "pipeline.yaml").write_text(text)
    state, server = hubstub.serve()
    state.tokens["hf_write" + "x" * 30] = hubstub.Token()
    state.tokens["hf_read" + "x" * 30] = hubstub.Token(role="read")
    try:
        writer = fab(tmp_path, jobs, "token", HF_TOKEN="hf_write" + "x" * 30, HF_ENDPOINT=state.url)
        reader = fab(tmp_path, jobs, "token", HF_TOKEN="hf_read" + "x" * 30, HF_ENDPOINT=state.url)
    finally:
        server.shutdown()
    assert writer.returncode == 0 and "HF_TOKEN: can write tester/grpo-model" in writer.stdout, writer.stderr
    assert "results.hub_repo: this token is read-only" in one_line(reader)


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (("trian",), "No idea what 'trian' is! Did you mean fab train? (fab --list)"),
        (("plan", "--arg", "train.num_batches", "100"),
         "No idea what '100' is! --arg takes JOB.KEY=VALUE as one word: --arg train.num_batches=100"),
        (("plan", "--jsn"), "No idea what '--jsn' is! Did you mean --json? (fab plan --help)"),
    ],
)  # fmt: skip
def test_a_misspelt_task_or_option_gets_what_was_meant(tmp_path, jobs, args, meant):
    result = fab(tmp_path, jobs, *args)
    assert result.returncode == 1 and result.stderr.strip() == meant


def test_help_piped_to_head_ends_quietly(tmp_path):
    """Bare `fab --help` prints before fab loads any of this project's code (fabric's own entry point): not here."""
    for args in (["--list"], ["--help", "train"], ["plan"]):
        piped = subprocess.run(
            f"{fabfork.FAB} -r {REPO} {' '.join(args)} | head -1",
            shell=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert piped.stdout.strip() and piped.stderr == "", piped.stderr


def test_the_readme_builds_the_maxtext_the_jobs_pin_and_asks_for_an_ipv4_address():
    readme = (REPO / "README.md").read_text()
    packages = yaml.safe_load((REPO / "jobs" / "pipeline.yaml").read_text())["environment"]["packages"]
    version = next(p for p in packages if p.startswith("maxtext")).rsplit("==", 1)[1]
    assert f"scripts/maxtext_config_env.py {version})" in readme and "curl -4 -s ifconfig.me" in readme
    assert "curl -s ifconfig.me" not in readme
    assert readme.index("## Tests") > readme.index("## Train")  # the user's path first
