"""The notifier's parts without SSH: each receiver's body, bounded tries against one that is slow or refuses."""

from __future__ import annotations

import json
import time

import pytest

from bootstrap.remote import notify
from tests.ssh.test_notify import Receiver

EVENT = {"run": "r1", "state": "done", "host": "vm"}


@pytest.mark.parametrize(
    ("url", "kind", "body"),
    [
        ("https://hooks.slack.com/services/T/B/x", "slack", {"text": "done"}),
        ("https://discord.com/api/webhooks/1/x", "discord", {"content": "done"}),
        ("https://example.com/hook", "json", {**EVENT, "text": "done"}),
    ],
)
def test_each_receiver_gets_the_body_it_takes(url, kind, body):
    assert notify.kind_of(url) == kind
    assert json.loads(notify.request(url, kind, "done", EVENT).data) == body


def test_ntfy_gets_plain_text_and_a_title():
    made = notify.request("https://ntfy.sh/my-topic", notify.kind_of("https://ntfy.sh/my-topic"), "done", EVENT)
    assert made.data == b"done" and made.get_header("Title") == "tpu-rl: run r1 done"
    assert notify.kind_of("https://example.com/x", "ntfy") == "ntfy"  # named: results.notify NAME:ntfy


def test_a_slow_receiver_is_tried_a_bounded_number_of_times(monkeypatch):
    slow = Receiver(delay=1.0)
    monkeypatch.setattr(notify, "TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(notify, "BACKOFF_SECONDS", 0.05)
    try:
        started = time.monotonic()
        outcome = notify.send(slow.url, "json", "done", EVENT)
        took = time.monotonic() - started
    finally:
        slow.close()
    assert outcome["ok"] is False and outcome["tries"] == notify.TRIES
    assert took < notify.TRIES * (0.2 + 0.05 * notify.TRIES) + 1.5
    assert slow.url not in json.dumps(outcome)


def test_a_receiver_that_is_down_is_said_without_its_url(monkeypatch):
    down = Receiver()
    down.close()
    monkeypatch.setattr(notify, "BACKOFF_SECONDS", 0.01)
    outcome = notify.send(down.url, "json", "done", EVENT)
    assert outcome == {"ok": False, "error": "ConnectionRefusedError", "tries": notify.TRIES}


@pytest.mark.parametrize(("status", "tries"), [(404, 1), (503, notify.TRIES)])
def test_a_refusal_is_not_tried_again_and_a_busy_receiver_is(status, tries, monkeypatch):
    """retry.py's one policy: a 4xx would be refused again; a 5xx may pass."""
    answering = Receiver(status=status)
    monkeypatch.setattr(notify, "BACKOFF_SECONDS", 0.01)
    try:
        outcome = notify.send(answering.url, "json", "done", EVENT)
    finally:
        answering.close()
    assert outcome == {"ok": False, "error": f"HTTP {status}", "tries": tries} and len(answering.posts) == tries
