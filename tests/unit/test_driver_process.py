"""The VM's pipeline driver as real local processes (no SSH): start, follow, failures it survives, autostop."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time

from bootstrap.remote import driver, jobrunner
from bootstrap.remote.jobrunner import Layout
from tests.loopback import wait_for


def plan(tmp_path, jobs: list[tuple[str, str, list[str]]], **extra) -> dict:
    """A plan of shell jobs: (name, command, needs); each writes its own output file."""
    entries = []
    for name, command, needs in jobs:
        out = tmp_path / f"{name}.out"
        spec = {"name": name, "argv": ["sh", "-c", f"{command} && touch {out}"], "env": {}, "secrets": [],
                "outputs": [str(out)], "cwd": str(tmp_path), "secrets_dir": str(tmp_path / "secrets")}  # fmt: skip
        entries.append({"name": name, "job_dir": str(tmp_path / "jobs" / name), "spec": spec, "needs": needs})
    return {"digest": "d1", "run": "r", "jobs": entries, "preflight": {}, **extra}


def drive(tmp_path, the_plan: dict) -> list[dict]:
    """`driver.py start --follow`, as fab runs it on the VM: everything it streams, parsed."""
    result = subprocess.run(
        [sys.executable, driver.__file__, "start", str(tmp_path / "state"), "--follow"],
        input=json.dumps(the_plan), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_job_that_cannot_even_start_fails_alone_and_the_driver_ends_the_pipeline_failed(tmp_path):
    the_plan = plan(tmp_path, [("ok", "true", []), ("after", "true", ["ok"])])
    the_plan["jobs"][0]["job_dir"] = "/proc/no-such-place/ok"  # not writable: as a full disk would refuse it
    items = drive(tmp_path, the_plan)
    end = next(i for i in items if i.get("event") == "end" and i["job"] == "ok")
    assert end["state"]["state"] == "failed" and "could not start" in end["state"]["error"]
    assert items[-1]["event"] == "finished" and items[-1]["state"] == "failed"
    assert [i["job"] for i in items if i.get("event") == "blocked"] == ["after"]
    record = driver.info(Layout(str(tmp_path / "state")))
    assert record["state"] == "failed"  # recorded, so no fab command starts the driver again (no crash loop)


def test_each_line_comes_once_and_before_its_jobs_end(tmp_path):
    items = drive(tmp_path, plan(tmp_path, [("a", "seq 1 300", []), ("b", "echo b-line", ["a"])]))
    lines = [i for i in items if i.get("job") == "a" and "line" in i]
    assert [i["line"] for i in lines] == ["[tpu-rl] starting a", *(str(n) for n in range(1, 301))]
    assert [i["n"] for i in lines] == list(range(1, 302))  # numbered: a watcher sent them again shows them once
    end_a = next(k for k, i in enumerate(items) if i.get("event") == "end" and i["job"] == "a")
    assert max(k for k, i in enumerate(items) if i.get("job") == "a" and "line" in i) < end_a


def test_a_log_replaced_by_a_fresh_attempt_is_read_from_its_start(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / jobrunner.LOG).write_bytes(b"first attempt\n")
    reader = jobrunner.LogReader(str(job))
    assert reader.read() + b"".join(reader.rest()) == b"first attempt\n"
    os.replace(job / jobrunner.LOG, job / "log.1")  # what launch does before a fresh attempt
    (job / jobrunner.LOG).write_bytes(b"second\n")
    assert b"".join(reader.rest()) == b"second\n"


def test_autostop_waits_for_the_idle_time_and_tries_a_failed_shutdown_again(tmp_path):
    layout = Layout(str(tmp_path / "state"))
    os.makedirs(layout.pipeline)
    tries = tmp_path / "tries"
    command = ["sh", "-c", f"echo x >> {tries}; test $(wc -l < {tries}) -ge 2"]  # fails once, then works
    the_plan = plan(tmp_path, [], autostop={"idle_seconds": 0.3, "command": command})
    worker = driver.Driver(layout, the_plan)
    worker.record["since"] = started = time.time()
    worker.autostop()
    assert tries.read_text() == "x\nx\n"
    shutdown = driver.read_json(os.path.join(layout.pipeline, driver.DRIVER))["shutdown"]
    assert shutdown["exit_code"] == 0 and shutdown["at"] >= started + 0.6  # an idle time, then another one


def test_a_fab_command_in_the_idle_time_puts_autostop_off(tmp_path):
    layout = Layout(str(tmp_path / "state"))
    os.makedirs(layout.pipeline)
    marker = tmp_path / "stopped"
    the_plan = plan(tmp_path, [], autostop={"idle_seconds": 1.0, "command": ["touch", str(marker)]})
    worker = driver.Driver(layout, the_plan)
    worker.record["since"] = time.time() - 0.9  # almost idle long enough ...
    driver.touch_seen(layout)  # ... when a fab command came
    seen = time.time()
    worker.autostop()
    assert marker.exists() and os.path.getmtime(marker) >= seen + 1.0


def test_follow_touches_seen_and_stops_at_the_end(tmp_path):
    drive(tmp_path, plan(tmp_path, [("a", "true", [])]))
    out = io.StringIO()
    assert driver.follow(Layout(str(tmp_path / "state")), out) == 0  # replays the finished pass, then ends
    assert json.loads(out.getvalue().splitlines()[-1])["event"] == "finished"
    assert os.path.exists(os.path.join(str(tmp_path / "state"), "pipeline", driver.SEEN))


class _Collected:
    """A watcher's end of `follow`: the JSON lines it was sent."""

    def __init__(self):
        self.items: list[dict] = []

    def write(self, text: str) -> None:
        self.items.extend(json.loads(line) for line in text.splitlines())

    def flush(self) -> None:
        pass


def test_a_new_pass_is_told_by_its_events_files_identity_not_its_size(tmp_path):
    """Another fab's new pass replaces events.jsonl with a file longer than what was read: the watcher of the
    old pass says `replaced`, never reads the new file from the old position (mid-line) as its own."""
    layout = Layout(str(tmp_path / "state"))
    os.makedirs(layout.pipeline)
    record = {**jobrunner.identity(os.getpid()), "state": "running", "digest": "d1", "run": "r1"}  # alive: this process
    jobrunner.write_json(os.path.join(layout.pipeline, driver.DRIVER), record)
    events = os.path.join(layout.pipeline, driver.EVENTS)
    with open(events, "w") as f:
        f.write(json.dumps({"event": "pass", "run": "r1"}) + "\n")
    out = _Collected()
    watcher = threading.Thread(target=driver.follow, args=(layout, out), daemon=True)
    watcher.start()
    wait_for(lambda: out.items, 30, "the first pass's event")
    os.replace(events, f"{events}.previous")  # what `start` does for a new pass
    with open(events, "w") as f:
        f.writelines(json.dumps({"event": "pass", "run": "r2", "n": n}) + "\n" for n in range(50))
    watcher.join(30)
    assert not watcher.is_alive()
    assert [item["event"] for item in out.items] == ["pass", "replaced"]
    assert out.items[0]["run"] == "r1"
