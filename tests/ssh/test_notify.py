"""Notifications (results.notify): one POST to each receiver when the pipeline ends, sent by the VM, through the
real fab; a receiver that is down or slow changes nothing; its URL, a secret, appears nowhere."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.loopback import Fab, edit_yaml, wait_for
from tests.webhook import Receiver

HOOK = "TPU_RL_TEST_HOOK"


@pytest.fixture
def receiver(fab: Fab, monkeypatch):
    found = Receiver()
    monkeypatch.setenv(HOOK, found.url)  # fab's environment: the URL is a secret of this machine
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["results"].update(notify=[HOOK]))
    yield found
    found.close()


def everything_written(fab: Fab, *results) -> str:
    """What the VM wrote (logs, plan, events, records) and what fab printed or ran."""
    texts = [path.read_text(errors="replace") for path in (fab.tmp / "state").rglob("*") if path.is_file()
             and "secrets" not in path.parts]  # fmt: skip
    texts += [(fab.host.key.parent / "sshd.log").read_text(errors="replace")]
    return "\n".join(texts + [r.stdout + r.stderr for r in results])


def test_a_done_run_is_one_post_with_its_result_and_the_url_appears_nowhere(fab: Fab, receiver: Receiver):
    done = fab("train", "--arg", "vars.num_batches=2")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: receiver.posts, 60, "the notification")
    (post,) = receiver.posts
    assert post["body"]["state"] == "done" and post["body"]["text"].startswith(f"tpu-rl: run {current(fab)} on ")
    assert "done; GSM8K accuracy 33.3% -> " in post["body"]["text"]  # the run's result, from its eval records
    status = fab("status")
    assert "notified TPU_RL_TEST_HOOK of finished at" in status.stdout and "sent (HTTP 200)" in status.stdout
    assert receiver.secret not in everything_written(fab, done, status)


def test_a_failed_run_names_the_job_and_its_last_line(fab: Fab, receiver: Receiver):
    failed = fab("train", "--arg", "vars.num_batches=4", "--arg", "train.env.STANDIN_FAIL=1")
    assert failed.returncode == 2
    wait_for(lambda: receiver.posts, 60, "the notification")
    text = receiver.posts[0]["body"]["text"]
    assert "failed at train (exited with 1): RuntimeError: simulated failure (STANDIN_FAIL)" in text, text


def test_a_held_back_run_says_so(fab: Fab, receiver: Receiver):
    repo = f"tester/notify-{uuid.uuid4().hex[:8]}"
    edit_yaml(fab.jobs / "pipeline.yaml", lambda d: d["results"].update(hub_repo=repo, publish_if="improved"))
    held = fab("train", "--arg", "vars.num_batches=2", "--arg", "train.env.STANDIN_EVALS=600,500,1319")
    assert held.returncode == 0, held.stderr
    wait_for(lambda: receiver.posts, 60, "the notification")
    text = receiver.posts[0]["body"]["text"]
    assert "done, the model held back (publish_if: improved, and it did not" in text and "fab publish" in text


def test_a_receiver_that_is_down_changes_nothing_and_status_says_so(fab: Fab, receiver: Receiver, monkeypatch):
    receiver.close()  # nothing answers at its address any more
    done = fab("train", "--arg", "vars.num_batches=2")
    assert done.returncode == 0, done.stdout + done.stderr
    log = fab.tmp / "state" / "pipeline" / "notifications.jsonl"
    wait_for(log.exists, 120, "the notifier's outcome")
    (line,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert line["ok"] is False and line["tries"] == 3 and receiver.secret not in log.read_text()
    assert "not sent: " in fab("status").stdout  # that the driver never waits for it: tests/unit/test_notify.py


def current(fab: Fab) -> str:
    return (fab.tmp / "state" / "current-run").read_text().strip()
