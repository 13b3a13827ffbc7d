"""Durable results: the export uploaded to the Hub (stand-in on 127.0.0.1) and verified."""

from __future__ import annotations

import json
import shutil
import uuid

import yaml

from tests.loopback import Fab, edit_yaml
from tests.stack import lose


def set_results(fab: Fab, **results) -> None:
    path = fab.jobs / "pipeline.yaml"
    pipeline = yaml.safe_load(path.read_text())
    pipeline["results"].update(results)
    path.write_text(yaml.safe_dump(pipeline, sort_keys=False))


def current_run(fab: Fab) -> str:
    return (fab.tmp / "state" / "current-run").read_text().strip()


def exported(fab: Fab, run: str) -> dict[str, bytes]:
    folder = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / run
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_upload_to_the_hub_verified_with_a_model_card(fab: Fab):
    repo = f"tester/grpo-{fab.tmp.name}"
    set_results(fab, hub_repo=repo)
    result = fab("train", "--arg", "vars.num_batches=10")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"HF_TOKEN: can write {repo}" in result.stdout
    assert f"model kept at {fab.hub.url}/{repo} (verified)" in result.stdout
    run = (fab.tmp / "state" / "current-run").read_text().strip()
    files = fab.hub.repos[repo]
    card = files.pop("README.md").decode()
    assert files == exported(fab, run)
    assert fab.hub.private[repo] is True
    assert "base_model: meta-llama/Llama-3.1-8B-Instruct" in card
    assert "GRPO for 10 batches of `openai/gsm8k`" in card
    assert "Learning rate: warmup 1 step to 3e-06, cosine to 0 over 10 steps" in card  # sized to the 10 steps
    assert "| before training | 33.33 |" in card and "| after training | 55.56 |" in card
    assert "| step 10 |" not in card  # the eval at the final step is the Post eval, not counted twice

    again = fab("train", "--arg", "vars.num_batches=10")
    assert "publish-hub: done already" in again.stdout


def test_a_finished_run_whose_model_is_on_the_hub_is_not_trained_again_after_a_restart(fab: Fab):
    """A STANDARD VM restarted on maintenance keeps its disk and loses /dev/shm: the export, the converted
    model and the checkpoints. The verified Hub copy is the run's result: the next no-op `fab train`
    starts nothing and uploads nothing."""
    repo = f"tester/restart-{fab.tmp.name}"
    set_results(fab, hub_repo=repo)
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    commits = list(fab.hub.commits[repo])
    lose(fab)
    shutil.rmtree(fab.tmp / "shm")  # the restart
    again = fab("train", "--arg", "vars.num_batches=2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "publish-hub: done already" in again.stdout and "the VM's copy it was made from is gone" in again.stdout
    for job in ("prefetch", "convert", "train", "export", "publish-hub"):
        assert f"{job}: starting" not in again.stdout and f"{job}: was done but" not in again.stdout
    assert fab.hub.commits[repo] == commits  # nothing uploaded again


def test_an_existing_public_repo_gets_nothing_when_private_is_asked(fab: Fab):
    """create_repo(private=True, exist_ok=True) leaves an existing repo public: its real visibility decides."""
    repo = f"tester/public-{fab.tmp.name}"
    fab.hub.repos[repo], fab.hub.private[repo] = {}, False
    set_results(fab, hub_repo=repo)
    result = fab("train", "--arg", "vars.num_batches=2")
    assert result.returncode == 2
    assert f"not uploading: {repo} exists and is public, but results.hub_private is true" in result.stdout
    assert "(private)" not in result.stdout and "(public)" in result.stdout
    assert fab.hub.repos[repo] == {}  # not one file sent


def test_upload_that_fails_half_way_resumes_without_sending_files_again(fab: Fab):
    repo = f"tester/resume-{fab.tmp.name}"
    set_results(fab, hub_repo=repo)
    fab.hub.fail_commits_of.add("model.safetensors")
    failed = fab("train", "--arg", "vars.num_batches=2")
    assert failed.returncode == 2
    assert "publish-hub failed" in failed.stderr
    sent_before = list(fab.hub.commits[repo])
    assert "config.json" in sent_before and "model.safetensors" not in sent_before
    assert "README.md" not in sent_before  # the card last: it never states the result of weights not there

    fab.hub.fail_commits_of.clear()
    files = fab.hub.repos[repo]
    files["config.json"] = b" " * len(files["config.json"])  # same size, other contents (a git blob)
    files["model.safetensors"] = b"\0" * len(exported(fab, current_run(fab))["model.safetensors"])  # (an LFS file)
    resumed = fab("train", "--arg", "vars.num_batches=2")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "export: done already" in resumed.stdout
    new = fab.hub.commits[repo][len(sent_before) :]
    assert new == ["config.json", "model.safetensors", "README.md"]  # what differs by hash, then the card
    assert {k: v for k, v in fab.hub.repos[repo].items() if k != "README.md"} == exported(fab, current_run(fab))


def test_no_durable_target_says_so_plainly(fab: Fab):
    result = fab("train", "--arg", "vars.num_batches=2")
    assert result.returncode == 0
    assert "The trained model lives only in the VM's memory" in result.stdout
    assert "fab download" in result.stdout


def test_a_bad_token_stops_before_any_job_starts(fab: Fab):
    """The token is checked once the VM says what would start, and before it starts anything."""
    fab.hub.tokens.pop(fab.token)
    result = fab("train")
    assert result.returncode == 2
    assert "HF_TOKEN: the Hub rejects this token (HTTP 401)" in result.stderr
    assert not list((fab.tmp / "state").glob("**/runner.json"))  # no job was started
    assert not (fab.tmp / "state" / "pipeline" / "driver.json").exists()  # nor a driver


def test_a_bad_token_stops_a_job_the_install_read_would_start(fab: Fab):
    """The install read the run's states (an output gone: export would start again): the token is checked
    then, and a rejected one starts nothing."""
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    exported = next((fab.tmp / "shm").glob("*/hf-trained/*/config.json"))
    exported.unlink()
    runners = {path: path.read_bytes() for path in (fab.tmp / "state").glob("**/runner.json")}
    fab.hub.tokens.pop(fab.token)
    result = fab("train", "--arg", "vars.num_batches=2")
    assert result.returncode == 2
    assert "HF_TOKEN: the Hub rejects this token (HTTP 401)" in result.stderr
    assert not exported.exists()  # export did not run again
    assert {path: path.read_bytes() for path in (fab.tmp / "state").glob("**/runner.json")} == runners


def test_a_no_op_train_asks_the_hub_nothing_and_a_run_with_work_checks_the_token_first(fab: Fab):
    repo = f"tester/noop-{fab.tmp.name}"
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["results"].update(hub_repo=repo))
    fab.hub.requests.clear()  # the Hub stand-in serves the whole session
    first = fab("train", "--arg", "vars.num_batches=2")
    assert first.returncode == 0, first.stderr
    checks = [r for r in fab.hub.requests if "whoami" in r or "auth-check" in r]
    assert len(checks) == 3 and first.stdout.index("checking the Hugging Face token") < first.stdout.index(
        "setup: starting"
    )  # whoami, the base model, the repository: before the first job
    fab.hub.requests.clear()
    again = fab("train", "--arg", "vars.num_batches=2")
    assert again.returncode == 0, again.stderr
    assert "publish-hub: done already" in again.stdout and "starting" not in again.stdout.replace(
        "pipeline started", ""
    )
    assert fab.hub.requests == [] and "checking the Hugging Face token" not in again.stdout


def test_a_no_op_after_a_run_whose_args_were_dropped_asks_the_hub_nothing(fab: Fab):
    """Review: a run last driven without --arg is recorded so; the no-op after it is guessed as one."""
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    assert fab("train").returncode == 0  # the same run without --arg: driven again
    fab.hub.requests.clear()
    again = fab("train")
    assert again.returncode == 0 and "nothing to start" in again.stdout, again.stdout
    assert fab.hub.requests == []


def test_a_command_that_starts_nothing_needs_no_valid_token(fab: Fab):
    """Review: the check begun while connecting (other --args than the run's last) gives way to the states
    the install read: setup is done, nothing starts, the revoked token is never asked about."""
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    fab.hub.tokens.pop(fab.token)
    setup = fab("setup")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "setup: done already" in setup.stdout and "checking the Hugging Face token" not in setup.stdout


def gate(fab: Fab, rule: str) -> str:
    """A Hub target of this test's own, gated by `rule`; the repository's name."""
    repo = f"tester/gate-{uuid.uuid4().hex[:8]}"
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["results"].update(hub_repo=repo, publish_if=rule))
    return repo


def test_a_worse_model_is_held_back_from_the_hub_and_fab_publish_uploads_it_anyway(fab: Fab):
    repo = gate(fab, "improved")
    worse = ("--arg", "vars.num_batches=2", "--arg", "train.env.STANDIN_EVALS=600,500,1319")
    held = fab("train", *worse)
    assert held.returncode == 0, held.stderr
    out = " ".join(held.stdout.split())
    assert f"not uploaded to {repo}: publish_if: improved, and it did not: GSM8K accuracy 45.5% -> 37.9%" in out
    assert "warning: accuracy fell 45.5% -> 37.9%" in out and "Publish it anyway: fab publish --run-name" in out
    assert repo not in fab.hub.repos and repo not in fab.hub.commits  # the Hub received nothing
    record = json.loads((fab.tmp / "state" / "pipeline" / "driver.json").read_text())
    assert record["autostop_idle"] is None and record["autostop_why"].startswith("off: the model was held back")
    again = fab("train", *worse)  # a no-op: held stays held, nothing is trained or uploaded
    assert again.returncode == 0 and "publish-hub: done already" in again.stdout and repo not in fab.hub.repos
    run = (fab.tmp / "state" / "current-run").read_text().strip()
    published = fab("publish", "--run-name", run, *worse)
    assert published.returncode == 0, published.stderr
    assert "although it was held back" in published.stdout and f"model kept at {fab.hub.url}/{repo}" in published.stdout
    assert set(fab.hub.repos[repo]) >= {"README.md", "model.safetensors", "SHA256SUMS"}
    card = fab.hub.repos[repo]["README.md"].decode()
    assert "**Result:** GSM8K accuracy 45.5% -> 37.9%" in card and "**Warning:** accuracy fell" in card


def test_a_held_back_model_is_no_copy_a_restart_that_wipes_it_makes_it_again(fab: Fab):
    """A held upload is never the run's kept copy: after a restart wiped /dev/shm (the only copy), the pipeline
    does not end "done" with the model nowhere; it says so, makes the export again, judges it again (held
    again), keeps it on the VM, and autostop stays off."""
    repo = gate(fab, "improved")
    worse = ("--arg", "vars.num_batches=2", "--arg", "train.env.STANDIN_EVALS=600,500,1319")
    assert fab("train", *worse).returncode == 0
    run = current_run(fab)
    lose(fab)  # the restart: every process gone, /dev/shm emptied, the disk kept
    shutil.rmtree(fab.tmp / "shm")
    again = fab("train", *worse)
    assert again.returncode == 0, again.stdout + again.stderr
    out = " ".join(again.stdout.split())
    assert "publish-hub: held the model back (results.publish_if), and the VM's copy of it is gone" in out
    assert "publish-hub: done already" not in out and "export: was done but its outputs are gone" in out
    assert f"not uploaded to {repo}: publish_if: improved, and it did not" in out and repo not in fab.hub.repos
    assert "SHA256SUMS" in exported(fab, run)  # the model is on the VM again, its only place
    record = json.loads((fab.tmp / "state" / "pipeline" / "driver.json").read_text())
    assert record["autostop_idle"] is None and record["autostop_why"].startswith("off: the model was held back")


def test_a_better_model_is_uploaded_and_a_run_without_evals_is_held_back_with_its_reason(fab: Fab):
    repo = gate(fab, "improved")
    better = fab("train", "--arg", "vars.num_batches=2", "--arg", "train.env.STANDIN_EVALS=600,800,1319")
    assert better.returncode == 0, better.stderr
    assert "result: GSM8K accuracy 45.5% -> 60.7%" in better.stdout and "model.safetensors" in fab.hub.repos[repo]
    repo = gate(fab, "improved")
    silent = fab("train", "--new-run", "--arg", "vars.num_batches=2", "--arg", "train.num_test_batches=0")
    assert silent.returncode == 0, silent.stderr
    out = " ".join(silent.stdout.split())
    assert f"not uploaded to {repo}: no held-out eval was recorded for this run (train.num_test_batches: 0" in out
    assert repo not in fab.hub.repos


def test_a_resumed_run_is_judged_from_its_first_attempts_eval_before_training(fab: Fab):
    """The gate judges the run, not the attempt: train failed half way, the next fab train resumed it (its log
    moved aside, its own Pre eval scoring the restored weights: as good as the end, so an attempt judged alone
    would be held back), and the better model is uploaded."""
    repo = gate(fab, "improved")
    better = ("--arg", "vars.num_batches=4", "--arg", "train.env.STANDIN_EVALS=600,800,1319")
    failed = fab("train", *better, "--arg", "train.env.STANDIN_FAIL=1")
    assert failed.returncode == 2 and "train failed" in failed.stderr
    resumed = fab("train", *better)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Restored params from step: 2" in (fab.job_dir(current_run(fab), "train") / "log").read_text()
    assert f"model kept at {fab.hub.url}/{repo} (verified)" in resumed.stdout
    card = fab.hub.repos[repo]["README.md"].decode()
    assert "| before training | 45.49 |" in card and "| resumed at step 2 | 60.65 |" in card


def test_a_worse_model_never_replaces_a_better_one_on_the_hub(fab: Fab):
    """publish_if: improved compares with what the repository holds, as its card's model-index says: a run that beat
    its own base model but not the model there is held, saying which run holds it; a better one replaces it."""
    repo = gate(fab, "improved")
    best = fab("train", "--arg", "vars.num_batches=2", "--arg", "train.env.STANDIN_EVALS=600,811,1319")
    assert best.returncode == 0, best.stderr
    holder = current_run(fab)
    card = fab.hub.repos[repo]["README.md"].decode()
    assert "type: openai/gsm8k" in card and "value: 61.49" in card and f"name: tpu-rl run {holder}" in card
    weights = fab.hub.repos[repo]["model.safetensors"]
    worse = ("--arg", "vars.num_batches=3", "--arg", "train.env.STANDIN_EVALS=600,725,1319")  # 45.5% -> 55.0%
    held = fab("train", "--new-run", *worse)
    assert held.returncode == 0, held.stderr
    out = " ".join(held.stdout.split())
    assert (
        f"not uploaded to {repo}: publish_if: improved, and it is not better than what {repo} holds: run {holder}'s "
        "model scored 61.5% on 1,319 problems, this run 55.0% on 1,319" in out
    )
    assert (
        fab.hub.repos[repo]["model.safetensors"] == weights
        and f"run {holder}" in fab.hub.repos[repo]["README.md"].decode()
    )
    assert "Publish it anyway: fab publish --run-name" in out
    better = ("--arg", "vars.num_batches=4", "--arg", "train.env.STANDIN_EVALS=600,950,1319")  # 72.0%
    replaced = fab("train", "--new-run", *better)
    assert replaced.returncode == 0, replaced.stderr
    assert f"model kept at {fab.hub.url}/{repo} (verified)" in replaced.stdout
    assert f"name: tpu-rl run {current_run(fab)}" in fab.hub.repos[repo]["README.md"].decode()
