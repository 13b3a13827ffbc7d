"""fab train against a real SSH server: fresh runs, no-op re-runs, failures, retries."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.loopback import REPO, Fab, edit_yaml


def current_run(fab: Fab) -> str:
    return (fab.tmp / "state" / "current-run").read_text().strip()


def test_fresh_run_goes_through_all_jobs_then_a_second_is_a_no_op(fab: Fab):
    first = fab("train", "--arg", "vars.num_batches=4")
    assert first.returncode == 0, first.stderr
    run = current_run(fab)
    for job in ("setup", "prefetch", "convert", "train", "export"):
        assert f"{job}: starting" in first.stdout
    for job in ("train", "export"):
        assert (fab.job_dir(run, job) / "done").exists()
    # convert does not depend on the run: it is shared by every run with the same command.
    assert len(list((fab.tmp / "state" / "shared").glob("convert-*/done"))) == 1
    export = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / run
    assert sorted(p.name for p in export.iterdir()) == [
        "SHA256SUMS",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((export / "config.json").read_text())
    # The export job found the last step itself (4; the real layout also has actor/1), not a step assumed.
    assert config["exported_from"].endswith(f"{run}/checkpoints/actor/4/model_params")
    # Servable: the base model's own token ids and generation config, not MaxText's table (eos 128001).
    assert config["eos_token_id"] == [128001, 128008, 128009]
    assert json.loads((export / "generation_config.json").read_text())["eos_token_id"] == [128001, 128008, 128009]

    second = fab("train", "--arg", "vars.num_batches=4")
    assert second.returncode == 0, second.stderr
    assert "starting" not in second.stdout
    for stage in ("setup", "prefetch", "convert", "train", "export"):
        assert f"{stage}: done already" in second.stdout
    assert current_run(fab) == run


def test_failing_job_shows_its_log_and_the_next_run_retries_only_it(fab: Fab):
    failed = fab("train", "--arg", "vars.num_batches=4", "--arg", "train.env.STANDIN_FAIL=1")
    assert failed.returncode == 2
    assert "train failed on 127.0.0.1: exited with 1" in failed.stderr
    assert f"fab logs --job train --run-name {current_run(fab)} --arg vars.num_batches=4" in failed.stderr
    assert "--- last 30 lines of" in failed.stdout
    assert "RuntimeError: simulated failure (STANDIN_FAIL)" in failed.stdout
    assert "export: starting" not in failed.stdout
    run = current_run(fab)
    assert not (fab.job_dir(run, "train") / "done").exists()

    retried = fab("train", "--arg", "vars.num_batches=4")
    assert retried.returncode == 0, retried.stderr
    assert "convert: done already" in retried.stdout
    assert "train: last attempt failed (exited with 1), retrying" in retried.stdout
    assert "export: starting" in retried.stdout
    # Same run, so MaxText resumes from the checkpoint the failed attempt left.
    assert "Restored params from step: 2 in" in (fab.job_dir(run, "train") / "log").read_text()


def test_a_done_job_whose_outputs_vanished_runs_again(fab: Fab):
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    run = current_run(fab)
    shutil.rmtree(fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / run)  # as a VM restart wipes /dev/shm
    again = fab("train", "--arg", "vars.num_batches=2")
    assert again.returncode == 0, again.stderr
    assert "train: done already" in again.stdout
    assert "export: was done but its outputs are gone" in again.stdout


def test_a_single_job_needs_its_dependencies_done(fab: Fab):
    result = fab("export")
    assert result.returncode == 2
    assert "export needs train, which is pending: run fab train first" in result.stderr


def test_new_run_option_starts_a_fresh_run(fab: Fab):
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    first = current_run(fab)
    second = fab("train", "--arg", "vars.num_batches=2", "--run-name", "second-run")
    assert second.returncode == 0, second.stderr
    assert "run second-run (given with --run-name)" in second.stdout
    assert "convert: done already" in second.stdout  # shared by runs
    assert "train: starting" in second.stdout
    assert current_run(fab) == "second-run" != first


def test_status_and_logs(fab: Fab):
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    status = fab("status")
    assert status.returncode == 0, status.stderr
    for job in ("setup", "prefetch", "convert", "train", "export"):
        assert any(job in line and "done" in line for line in status.stdout.splitlines()), status.stdout
    shown = fab("status", "--json")  # for scripts, as plan's and runs' (a newcomer's stumble)
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert found["pipeline"]["state"] == "done" and found["run"] == current_run(fab)
    assert {job["job"]: job["state"] for job in found["jobs"]} == dict.fromkeys(
        ("setup", "prefetch", "convert", "train", "export"), "done"
    )
    logs = fab("logs", "--job", "train")
    assert logs.returncode == 0, logs.stderr
    assert "RL Training Completed Successfully!" in logs.stdout
    assert "Post RL Training: corr=" in logs.stdout


def test_metrics_and_download_after_a_run(fab: Fab):
    assert fab("train", "--arg", "vars.num_batches=12").returncode == 0
    run = current_run(fab)
    result = fab("metrics")
    assert result.returncode == 0, result.stderr
    folder = fab.tmp / "runs" / run
    rows = (folder / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,actor/train/kl,actor/train/loss,rewards/train/score/mean"
    assert len(rows) == 13  # header + 12 steps
    assert (folder / "evals.csv").read_text().count("\n") == 4  # header, before, step 10, after
    assert (folder / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary["jobs"]) == {"setup", "prefetch", "convert", "train", "export"}
    split = summary["time_split"]  # from the log's own timestamps: 12 steps, evals at step 10 and after training
    assert (split["steps"], split["evals"]) == (12, 2) and "train's time: start-up" in result.stdout

    first = fab("download")
    assert first.returncode == 0, first.stderr
    model = folder / "model"
    remote = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / run
    assert {p.name: p.read_bytes() for p in model.iterdir()} == {p.name: p.read_bytes() for p in remote.iterdir()}
    (model / "config.json").unlink()  # an interrupted download: only the missing file moves again
    again = fab("download")
    assert again.returncode == 0, again.stderr
    assert "config.json" in again.stdout and "model.safetensors" not in again.stdout
    weights = model / "model.safetensors"
    weights.write_bytes(b"\0" * weights.stat().st_size)  # damaged here, same size
    repaired = fab("download")
    assert repaired.returncode == 0 and "model.safetensors" in repaired.stdout
    assert weights.read_bytes() == (remote / "model.safetensors").read_bytes()
    assert "SHA-256 verified" in repaired.stdout
    verified = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=model, capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout  # the manifest is sha256sum's own format


def reseal(fab: Fab, run: str) -> None:
    """Seal the export's files as they are now in its job's done marker, as the job does once it verified them."""
    done = fab.job_dir(run, "export") / "done"
    marker = json.loads(done.read_text())
    marker["seals"] = {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in marker["seals"]}
    done.write_text(json.dumps(marker))


def test_an_export_changed_after_it_was_verified_is_never_downloaded_and_is_made_again(fab: Fab, tmp_path):
    """The export job sealed its SHA256SUMS when it verified the export: another SHA256SUMS (and the weights it
    vouches for) put there since is refused by fab download, writing nothing, and the next pass exports again."""
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    run = current_run(fab)
    remote = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / run
    made = {p.name: p.read_bytes() for p in remote.iterdir()}
    (remote / "model.safetensors").write_bytes(b"someone else's weights")
    (remote / "SHA256SUMS").write_text(
        "".join(
            f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n"
            for p in sorted(remote.iterdir())
            if p.name != "SHA256SUMS"
        )  # fmt: skip
    )
    dest = tmp_path / "model"
    refused = fab("download", "--dest", str(dest))
    assert (
        refused.returncode == 2 and "SHA256SUMS, model.safetensors changed since it was verified" in refused.stderr
    ), refused.stderr
    assert not dest.exists()
    status = {job["job"]: job["state"] for job in json.loads(fab("status", "--json").stdout)["jobs"]}
    assert status["export"] == "lost"
    again = fab("train", "--arg", "vars.num_batches=2")
    assert again.returncode == 0 and "export: was done but " in again.stdout, again.stdout
    assert sorted(p.name for p in remote.iterdir()) == sorted(made)  # made again from the run's checkpoints
    assert (remote / "model.safetensors").read_bytes() != b"someone else's weights"
    assert fab("download", "--dest", str(dest)).returncode == 0
    assert (dest / "model.safetensors").read_bytes() == (remote / "model.safetensors").read_bytes()


def test_an_export_an_earlier_version_made_without_seals_is_still_downloaded_verified(fab: Fab, tmp_path):
    """A done marker from before seals were kept: the folder is checked and every file against SHA256SUMS."""
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    done = fab.job_dir(current_run(fab), "export") / "done"
    done.write_text(json.dumps({k: v for k, v in json.loads(done.read_text()).items() if k != "seals"}))
    result = fab("download", "--dest", str(tmp_path / "model"))
    assert result.returncode == 0 and "SHA-256 verified" in result.stdout, result.stderr


def test_download_refuses_names_that_leave_dest(fab: Fab):
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    remote = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / current_run(fab)
    dest = fab.tmp / "dest" / "model"
    for hostile in ("../escaped", "/tmp/escaped", "a/../../escaped"):
        (remote / "SHA256SUMS").write_text(f"{'0' * 64}  config.json\n{'1' * 64}  {hostile}\n")
        reseal(fab, current_run(fab))  # as if the export job itself had written it
        result = fab("download", "--dest", str(dest))
        assert result.returncode == 2
        assert f"{hostile!r} is not a plain relative file name; refused, nothing written to {dest}" in result.stderr
        assert not dest.exists() and not (fab.tmp / "dest" / "escaped").exists()


def test_download_never_mixes_exports_nor_writes_through_links(fab: Fab, tmp_path):
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    remote = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / current_run(fab)
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "SHA256SUMS").write_text(f"{'2' * 64}  model.safetensors\n")  # another run's export is here
    mixed = fab("download", "--dest", str(dest))
    assert mixed.returncode == 2 and "holds another export" in mixed.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["SHA256SUMS"]
    (dest / "SHA256SUMS").unlink()
    outside = tmp_path / "outside"
    (dest / "config.json.part").symlink_to(outside)  # left there by someone else
    linked = fab("download", "--dest", str(dest))
    assert linked.returncode == 2 and "config.json.part is a link" in linked.stderr
    assert not outside.exists()
    (dest / "config.json.part").unlink()
    (dest / "SHA256SUMS").unlink()  # written first by the attempt that stopped at the link
    (dest / "SHA256SUMS").symlink_to(outside)
    assert fab("download", "--dest", str(dest)).returncode == 2 and not outside.exists()
    (dest / "SHA256SUMS").unlink()
    assert fab("download", "--dest", str(dest)).returncode == 0
    assert (dest / "SHA256SUMS").read_text() == (remote / "SHA256SUMS").read_text()
    # a download stopped half way already says whose files these are: another export is refused there
    other, original = tmp_path / "other", (remote / "SHA256SUMS").read_text()
    (remote / "SHA256SUMS").write_text(original + f"{'3' * 64}  zz-missing.bin\n")  # stops at this file
    reseal(fab, current_run(fab))
    assert fab("download", "--dest", str(other)).returncode == 2
    assert (other / "SHA256SUMS").read_text() == (remote / "SHA256SUMS").read_text()
    (remote / "SHA256SUMS").write_text(original)
    reseal(fab, current_run(fab))
    again = fab("download", "--dest", str(other))
    assert again.returncode == 2 and "holds another export" in again.stderr


def test_a_manifest_over_a_mebibyte_is_read_whole(fab: Fab, tmp_path):
    """An export of many files: every one is verified, none is dropped by a cut list."""
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    remote = fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / current_run(fab)
    dest = tmp_path / "model"
    folder = f"{'d' * 250}/{'e' * 250}"
    for i in range(1300):  # about 1.05 MiB of manifest; the copies here already match, so nothing moves
        for root in (remote, dest):
            (root / folder).mkdir(parents=True, exist_ok=True)
            (root / folder / f"{'f' * 240}{i:05d}").write_text(str(i))
    for path in remote.iterdir():
        if path.is_file() and path.name != "SHA256SUMS":
            (dest / path.name).write_bytes(path.read_bytes())
    written = subprocess.run([sys.executable, REPO / "bootstrap" / "remote" / "manifest.py", remote], check=True)
    assert written.returncode == 0 and (remote / "SHA256SUMS").stat().st_size > 1 << 20
    reseal(fab, current_run(fab))  # as the export job would have sealed it
    result = fab("download", "--dest", str(dest))
    assert result.returncode == 0, result.stderr
    verified = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=dest, capture_output=True, text=True)
    assert verified.returncode == 0 and len((dest / "SHA256SUMS").read_text().splitlines()) > 1300


def test_an_environment_that_fails_its_check_stops_train_with_one_line(fab: Fab):
    """The environment check (remote/envcheck.py) in the validate job, on the stand-in environment, which has no
    tunix: validate fails with the line naming the package and version, and train never starts."""
    edit_yaml(fab.jobs / "pipeline.yaml", lambda data: data["vm"].update(check_environment=True))
    edit_yaml(
        fab.jobs / "pipeline.yaml", lambda data: data["environment"].update(check_packages={"google-tunix": "==0.1.7"})
    )
    failed = fab("train", "--arg", "vars.num_batches=4")
    assert failed.returncode == 2, failed.stdout + failed.stderr
    line = "ENVIRONMENT ERROR: google-tunix: not installed, the spec installs google-tunix==0.1.7"
    assert f"[validate] {line}" in failed.stdout  # shown as the job logs it, and again in its log's tail
    assert "validate failed on 127.0.0.1: exited with 2" in failed.stderr
    assert "train: not started, it needs validate, which failed" in failed.stdout
    assert "train: starting" not in failed.stdout and "export: starting" not in failed.stdout
    assert not (fab.job_dir(current_run(fab), "train") / "log").exists()
