"""The notifier's parts without SSH: each receiver's body, bounded tries against one that is slow or refuses."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from bootstrap.remote import driver, jobrunner, notify, processes
from tests.loopback import wait_for
from tests.ssh.test_notify import Receiver
from tests.unit.test_driver_process import drive, plan

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


class Liar:
    """A TCP server on 127.0.0.1 that is no proper receiver: it answers `reply` at once, or one byte of it every
    `trickle` seconds (an answer that never ends within a try's time), or (None) nothing until it is closed; how
    many connections it took."""

    def __init__(self, reply: bytes | None, trickle: float = 0.0):
        self.reply, self.trickle, self.connections = reply, trickle, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/hook/{uuid.uuid4().hex}"
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                peer, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(peer,), daemon=True).start()

    def _answer(self, peer: socket.socket) -> None:
        with contextlib.suppress(OSError), peer:
            peer.recv(65536)
            if self.reply is None:
                self.stopped.wait()
                return
            for index in range(len(self.reply)) if self.trickle else [None]:
                if self.stopped.wait(self.trickle):
                    return
                peer.sendall(self.reply if index is None else self.reply[index : index + 1])

    def close(self) -> None:
        self.stopped.set()
        self.server.close()


def notifier_process(tmp_path, receivers: dict[str, str], timeout: float) -> tuple[jobrunner.Layout, list, dict]:
    """The notifier as the driver starts it, over a state folder naming `receivers` (name -> URL): its layout,
    argv and environment (each try's deadline `timeout`)."""
    layout = jobrunner.Layout(str(tmp_path / "state"))
    for folder in (layout.pipeline, layout.secrets):
        os.makedirs(folder)
    for name, url in receivers.items():
        pathlib.Path(layout.secrets, name).write_text(url)
    plan = {"run": "r1", "jobs": [], "notify": [{"name": name, "secret": name} for name in receivers]}
    jobrunner.write_json(os.path.join(layout.pipeline, "plan.json"), plan)
    env = {**os.environ, "TPU_RL_NOTIFY_TIMEOUT_SECONDS": str(timeout), "TPU_RL_RETRY_BACKOFF_SECONDS": "0.01"}
    argv = [sys.executable, str(pathlib.Path(notify.__file__)), layout.root, json.dumps({"state": "done"})]
    return layout, argv, env


def notifier(tmp_path, receivers: dict[str, str], timeout: float) -> list[dict]:
    """Run the notifier to its end; the outcome lines it wrote."""
    layout, argv, env = notifier_process(tmp_path, receivers, timeout)
    assert subprocess.run(argv, env=env, timeout=120).returncode == 0
    return notify.recent(layout, count=10)


def test_receivers_are_told_side_by_side(tmp_path):
    """One receiver that holds its connection for as long as a try may last (here: ten minutes) keeps no other
    waiting: the good one is told, and its outcome written, while the first is still being tried."""
    hanging, good = Liar(None), Receiver()
    layout, argv, env = notifier_process(tmp_path, {"A_HANGS": hanging.url, "B_GOOD": good.url}, timeout=600)
    process = subprocess.Popen(argv, env=env)
    try:
        wait_for(
            lambda: [line["to"] for line in notify.recent(layout)] == ["B_GOOD"], 60, "the good receiver's outcome"
        )
        assert len(good.posts) == 1 and hanging.connections == 1 and process.poll() is None
    finally:
        process.kill()
        process.wait()
        hanging.close()
        good.close()


@pytest.mark.parametrize(
    ("liar", "error"),
    [
        (lambda: Liar(b"SPEAKING SMTP HERE\r\n\r\n"), "BadStatusLine"),
        (
            lambda: Liar(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"." * 1000, trickle=0.05),
            "TimeoutError",
        ),
    ],
    ids=["not-http", "trickles"],
)
def test_a_receiver_that_lies_or_trickles_keeps_no_other_from_being_told(tmp_path, liar, error):
    """Every receiver gets its own outcome line: the one that is no proper receiver fails within its tries'
    time, each try whole within its deadline, and the good one after it is told all the same."""
    bad, good = liar(), Receiver()
    try:
        lines = notifier(tmp_path, {"A_BAD": bad.url, "B_GOOD": good.url}, timeout=1.0)
    finally:
        bad.close()
        good.close()
    outcomes = {line["to"]: line for line in lines}
    assert outcomes["B_GOOD"]["ok"] is True and len(good.posts) == 1
    assert outcomes["A_BAD"] == {**outcomes["A_BAD"], "ok": False, "error": error, "tries": notify.TRIES}
    assert bad.connections == notify.TRIES
    assert bad.url not in json.dumps(lines)


def test_the_driver_never_waits_for_a_receiver(tmp_path, monkeypatch):
    """The real driver process ends its pipeline (and would go on to autostop) while the notifier it started is
    still waiting on a receiver that never answers."""
    hanging = Liar(None)
    monkeypatch.setenv("TPU_RL_NOTIFY_TIMEOUT_SECONDS", "600")  # the notifier's, inherited: it waits as long as we hold
    layout = jobrunner.Layout(str(tmp_path / "state"))
    os.makedirs(layout.secrets)
    pathlib.Path(layout.secrets, "HOOK").write_text(hanging.url)
    try:
        items = drive(tmp_path, plan(tmp_path, [("a", "true", [])], notify=[{"name": "HOOK", "secret": "HOOK"}]))
        assert items[-1] == {**items[-1], "event": "finished", "state": "done"}
        record = driver.info(layout)
        wait_for(lambda: not processes.alive(record), 60, "the driver's end")
        wait_for(lambda: hanging.connections == 1, 60, "the notifier's POST")
        assert not notify.recent(layout)  # the receiver still holds it: no outcome yet, and the driver is gone
    finally:
        hanging.close()
