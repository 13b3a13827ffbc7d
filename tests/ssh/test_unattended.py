"""The pipeline belongs to the VM: fab starts it, watches it, and may go away at any moment."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from bootstrap.remote import processes
from tests.loopback import Fab, edit_yaml, wait_for

SLOW = ("--arg", "vars.num_batches=6", "--arg", "train.env.STANDIN_SECONDS=1")
SLOW_CONVERT = ("--arg", "vars.num_batches=2", "--arg", "convert.env.STANDIN_SECONDS=3")


def pipeline(fab: Fab) -> dict:
    return json.loads((fab.tmp / "state" / "pipeline" / "driver.json").read_text())


def job_folder(fab: Fab, job: str) -> Path | None:
    """The folder of a started job: shared by runs (convert) or the run's own (train, publish-hub-REPO)."""
    found = list((fab.tmp / "state").glob(f"shared/{job}-*/runner.json"))
    found += list((fab.tmp / "state").glob(f"runs/*/{job}*/runner.json"))
    return found[0].parent if found else None


def done(fab: Fab, job: str) -> bool:
    folder = job_folder(fab, job)
    return folder is not None and (folder / "done").exists()


def starts(folder: Path, job: str) -> int:
    """How often the job was started in its folder (a restarted job keeps its old log as log.<time>)."""
    return sum(log.read_text().count(f"[tpu-rl] starting {job}") for log in folder.glob("log*"))


def set_results(fab: Fab, **results) -> None:
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["results"].update(results))


def test_the_laptop_gone_during_convert_the_vm_finishes_train_export_and_the_copy_alone(fab: Fab):
    repo = f"tester/alone-{fab.tmp.name}"
    set_results(fab, hub_repo=repo)
    first = fab.start("train", *SLOW_CONVERT)
    wait_for(lambda: job_folder(fab, "convert") is not None, what="convert to start")
    first.send_signal(signal.SIGKILL)  # the laptop closes: no cleanup, its SSH connection gone with it
    first.wait()
    # No fab from here on: the VM's driver carries on.
    wait_for(lambda: done(fab, "publish-hub"), what="the Hub copy, with no fab running")
    for job in ("convert", "train", "export", "publish-hub"):
        assert starts(job_folder(fab, job), job if job != "publish-hub" else "hub_upload") == 1, job
    wait_for(lambda: pipeline(fab)["state"] == "done", what="the driver to see the copy done")
    card = fab.hub.repos[repo]["README.md"].decode()
    assert "| before training | 33.33 |" in card  # filled on the VM from train's log, with no laptop
    again = fab("train", *SLOW_CONVERT)
    assert again.returncode == 0, again.stderr
    assert "publish-hub: done already" in again.stdout and "starting" not in again.stdout.replace(
        "pipeline started", ""
    )


def test_a_killed_driver_is_restarted_by_the_next_fab_and_adopts_the_running_train(fab: Fab):
    first = fab.start("train", *SLOW)
    wait_for(lambda: job_folder(fab, "train") is not None, what="train to start")
    os.kill(pipeline(fab)["pid"], signal.SIGKILL)  # the driver dies (OOM), its job does not
    first.wait(timeout=180)  # the watcher sees the driver gone, starts it again, and watches on
    second = fab("train", *SLOW)
    assert second.returncode == 0, second.stdout + second.stderr
    train = job_folder(fab, "train")
    assert (train / "done").exists() and starts(train, "train") == 1  # adopted, never started twice
    assert done(fab, "export")
    output = first.stdout.read()
    assert "the pipeline's driver stopped; starting it again" in output or "re-attaching" in second.stdout, output


def test_two_fabs_with_the_same_plan_share_one_pipeline_and_both_show_it(fab: Fab):
    first = fab.start("train", *SLOW)
    wait_for(lambda: job_folder(fab, "train") is not None, what="train to start")
    second = fab("train", *SLOW)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "attached to the pipeline on 127.0.0.1: run " in second.stdout
    assert "[train] training steps" in second.stdout and "train: done in" in second.stdout
    assert first.wait(timeout=180) == 0
    assert "train: done in" in first.stdout.read()
    events = (fab.tmp / "state" / "pipeline" / "events.jsonl").read_text().splitlines()
    assert sum(json.loads(e)["event"] == "pass" for e in events) == 1  # one pipeline, not two
    assert starts(job_folder(fab, "train"), "train") == 1


def test_another_run_while_one_runs_is_refused_in_one_line_naming_it(fab: Fab):
    first = fab.start("train", *SLOW, "--run-name", "first-run")
    try:
        wait_for(lambda: job_folder(fab, "train") is not None, what="train to start")
        second = fab("train", *SLOW, "--run-name", "second-run")
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert "127.0.0.1 runs another pipeline: run first-run running since" in lines[0]
        assert "Follow it: fab train --run-name first-run --arg vars.num_batches=6" in lines[0]
        assert (fab.tmp / "state" / "current-run").read_text().strip() == "first-run"
    finally:
        assert first.wait(timeout=180) == 0
    assert not (fab.tmp / "state" / "runs" / "second-run").exists()


def test_detach_returns_while_the_pipeline_runs_and_it_finishes_alone(fab: Fab):
    result = fab("train", *SLOW, "--detach")
    assert result.returncode == 0, result.stderr
    assert "pipeline started on 127.0.0.1; it goes on without this laptop" in result.stdout
    assert "watch it: fab train --run-name" in result.stdout
    assert not done(fab, "export")  # returned before the work was done
    wait_for(lambda: done(fab, "export"), what="export, with no fab running")
    status = fab("status")
    assert "pipeline: run " in status.stdout and " done since " in status.stdout


def test_autostop_shuts_the_vm_down_after_the_idle_time_and_a_fab_command_puts_it_off(fab: Fab):
    shutdown = fab.tmp / "shutdown-called"
    set_results(fab, hub_repo=f"tester/autostop-{fab.tmp.name}")  # the model is kept: the VM may stop
    edit_yaml(
        fab.jobs / "pipeline.yaml",
        lambda d: d["vm"].update(autostop="12s", autostop_command=["sh", "-c", f"date +%s.%N > {shutdown}"]),
    )
    result = fab("train", "--arg", "vars.num_batches=2")
    assert result.returncode == 0, result.stderr
    before_status = time.time()
    status = fab("status")
    assert "autostop: the VM shuts itself down after 12 s with no fab command" in status.stdout
    assert not shutdown.exists()
    said = wait_for(lambda: shutdown.exists() and shutdown.read_text().strip(), 120, "the autostop command")
    assert float(said) >= before_status + 12  # fab status started the wait again (read once written whole)
    wait_for(lambda: "shutdown" in pipeline(fab), what="the driver to record the shutdown")
    assert "autostop: shut the VM down at" in fab("status").stdout


def test_autostop_is_off_without_a_durable_copy_and_by_default_for_a_vm_given_with_h(fab: Fab):
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["vm"].update(autostop="12s"))
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    assert "autostop: off: nothing keeps the model outside the VM" in fab("status").stdout  # /dev/shm: the only copy
    wait_for(lambda: not processes.alive(pipeline(fab)), timeout=60, what="the driver to end: nothing to wait for")
    set_results(fab, hub_repo=f"tester/auto-{fab.tmp.name}")
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["vm"].update(autostop="auto"))
    assert fab("train", "--arg", "vars.num_batches=2").returncode == 0
    assert "autostop: off: a VM given with -H" in fab("status").stdout
