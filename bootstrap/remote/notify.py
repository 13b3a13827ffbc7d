"""Tell the user's receivers how the pipeline ended, from the VM: one JSON POST each (results.notify).

    python3 notify.py STATE_DIR EVENT_JSON      # started detached by the driver; prints nothing

The driver starts it when the pipeline ends (done, failed, or done with the Hub copy held back) and when it
stops for a reason that needs the user (a driver the crontab gave up reviving), and never waits for it: a
receiver that is down or slow changes nothing in the pipeline or in autostop. Each receiver's URL is a secret
(in the secrets folder, as the token is): it is never printed, logged or written anywhere else. The receivers
are told side by side, each in a thread of its own: one that hangs, or answers something other than HTTP, keeps
no other from being told. Each POST is tried TRIES times, each try whole (connect, send, answer) within
TIMEOUT_SECONDS, however slowly the receiver trickles its answer; each receiver's outcome (never the URL) is one
line of the pipeline folder's notifications.jsonl, which `fab status` shows. The body fits the receiver, by its URL or as named:
Slack's and Discord's incoming webhooks, ntfy, or a plain JSON object for anything else.

Standard library only: it runs on the VM beside driver.py.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.parse

try:
    from . import attempts, evals, joblog, jobrunner, retry  # on the laptop: bootstrap.remote.notify
except ImportError:
    import attempts  # on the VM: beside this script in the tools folder
    import evals
    import joblog
    import jobrunner
    import retry

LOG = "notifications.jsonl"  # in the pipeline folder
TRIES = 3
# test-only knobs, as retry.py's: how long a receiver may take to answer, and the first wait before trying again
TIMEOUT_SECONDS = float(os.environ.get("TPU_RL_NOTIFY_TIMEOUT_SECONDS", "10"))
BACKOFF_SECONDS = float(os.environ.get("TPU_RL_RETRY_BACKOFF_SECONDS", "2"))
READ_BYTES = 64 * 1024
KINDS = ("json", "slack", "discord", "ntfy")
HOSTS = {"hooks.slack.com": "slack", "discord.com": "discord", "discordapp.com": "discord", "ntfy.sh": "ntfy"}


def kind_of(url: str, named: str = "") -> str:
    """The receiver's kind: as named (results.notify NAME:KIND), else by the URL's host, else plain JSON."""
    return named or HOSTS.get(urllib.parse.urlsplit(url).hostname or "", "json")


def request(url: str, kind: str, message: str, event: dict) -> urllib.request.Request:
    """One POST, its body as the receiver takes it."""
    import urllib.request  # here, not above: every fab command and the VM's first look import this module, few send

    if kind == "ntfy":  # ntfy publishes a plain-text body to the topic the URL names
        title = f"tpu-rl: run {event.get('run', '?')} {event.get('state', '')}".strip()
        return urllib.request.Request(url, data=message.encode(), headers={"Title": title}, method="POST")
    body = {"slack": {"text": message}, "discord": {"content": message[:2000]}}.get(kind, {**event, "text": message})
    headers = {"Content-Type": "application/json"}
    return urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")


def send(url: str, kind: str, message: str, event: dict) -> dict:
    """The POST, tried TRIES times; what happened, without the URL."""
    import urllib.error  # as request's urllib.request

    error = ""
    for attempt in range(1, TRIES + 1):
        try:
            return {"ok": True, "status": _post(request(url, kind, message, event)), "tries": attempt}
        except Exception as err:  # noqa: BLE001 - any failure is an outcome; its code or type alone (a message may quote the URL)
            error = f"HTTP {err.code}" if isinstance(err, urllib.error.HTTPError) else _reason(err)
            if not retry.may_pass(err):  # refused (a 4xx): again would be refused again
                break
        if attempt < TRIES:
            time.sleep(BACKOFF_SECONDS * attempt)
    return {"ok": False, "error": error, "tries": attempt}


def _post(made: urllib.request.Request) -> int:
    """One try, whole within TIMEOUT_SECONDS (however slowly the receiver trickles its answer)."""

    def post() -> int:
        with urllib.request.urlopen(made, timeout=TIMEOUT_SECONDS) as response:
            response.read(READ_BYTES)  # what a receiver says back is not kept: a stream never fills memory
            return response.status

    return retry.within(post, TIMEOUT_SECONDS)


def _reason(err: BaseException) -> str:
    reason = getattr(err, "reason", err) if isinstance(err, urllib.error.URLError) else err
    return type(reason).__name__ if isinstance(reason, BaseException) else "unreachable"


def message(event: dict) -> str:
    """One line a person reads first: the run, how it ended, and its result or what to look at."""
    head = f"tpu-rl: run {event.get('run', '?')} on {event.get('host', '?')}"
    if event.get("kind") == "gave-up":
        return f"{head}: its driver keeps stopping ({event.get('why', '')}); run fab status"
    if event.get("kind") == "preempted":
        return f"{head}: preempted {during(event)}; fab train --recover carries it on (--watch does it itself)"
    if event.get("state") == "stopped":  # a health rule: its log's last line says which, at which step
        failed = event.get("failed") or {}
        job = next(iter(failed), "?")
        last = f": {event['last_line']}" if event.get("last_line") else ""
        return f"{head}: {job} stopped by a health rule{last}; its last committed checkpoint is kept"
    if event.get("state") == "failed":
        failed = event.get("failed") or {}
        job = next(iter(failed), "?")
        last = f": {event['last_line']}" if event.get("last_line") else ""
        return f"{head}: failed at {job} ({failed.get(job, '?')}){last}; run fab train to retry it"
    result = f"; {event['result']}" if event.get("result") else ""
    if event.get("held"):
        return f"{head}: done, the model held back ({event['held']}); fab publish uploads it{result}"
    return f"{head}: done{result}"


def during(preemption: dict) -> str:
    """What a preemption record (preempted.py) says the VM was doing: `during train (last committed checkpoint:
    step 30)`."""
    step = preemption.get("committed_step")
    kept = f"last committed checkpoint: step {step}" if step is not None else "no checkpoint committed yet"
    return f"during {', '.join(preemption.get('running') or []) or 'no job'} ({kept})"


def describe(layout: jobrunner.Layout, event: dict) -> dict:
    """The event with what a receiver needs: the run's result from its eval records, the failed job's last
    log line (secrets redacted), a held back Hub copy's reason."""
    plan = jobrunner.read_json(os.path.join(layout.pipeline, "plan.json")) or {"jobs": []}
    jobs = {job["name"]: job for job in plan["jobs"]}
    found = {**event, "run": plan.get("run", "?"), "host": os.uname().nodename}
    records = ((jobs.get("train") or {}).get("spec") or {}).get("env", {}).get(attempts.EVALS_ENV)
    if records:
        try:  # the result compares the first eval with the last: the run's step count changes nothing
            result = evals.outcome(attempts.recorded_evals(attempts.read_records(records), None))
            found["result"] = evals.result_line(result) if result else ""
        except (OSError, ValueError):
            found["result"] = ""
    for name in event.get("failed") or {}:
        if name in jobs:
            folder = os.path.expanduser(jobs[name]["job_dir"])
            redactor = joblog.Redactor.of(folder)
            tail = redactor.feed(_last_line(folder)) + redactor.feed(b"")
            found["last_line"] = tail.decode(errors="replace").strip()[-300:]
            break
    held = [jobrunner.read_json(os.path.expanduser(job["spec"]["outputs"][0])) or {} for job in jobs.values()
            if job["spec"].get("may_hold")]  # fmt: skip
    if reasons := [marker["held"] for marker in held if marker.get("held")]:
        found["held"] = str(reasons[0])[:300]
    return found


def _last_line(folder: str) -> bytes:
    try:
        with open(os.path.join(folder, jobrunner.LOG), "rb") as f:
            f.seek(max(0, os.path.getsize(f.name) - 4096))
            lines = [line for line in f.read().splitlines() if line.strip()]
    except OSError:
        return b""
    return lines[-1] if lines else b""


def notify(layout: jobrunner.Layout, event: dict) -> None:
    """Each receiver the plan names, once and side by side: its outcome appended to notifications.jsonl as it
    comes."""
    plan = jobrunner.read_json(os.path.join(layout.pipeline, "plan.json")) or {}
    receivers = plan.get("notify") or []
    if not receivers:
        return
    described = describe(layout, event)
    text = message(described)
    written = threading.Lock()

    def tell(receiver: dict) -> None:
        try:
            with open(os.path.join(layout.secrets, receiver["secret"])) as f:
                url = f.read().strip()
        except OSError:
            outcome = {"ok": False, "error": "its URL is not on the VM", "tries": 0}
        else:
            outcome = send(url, kind_of(url, receiver.get("kind", "")), text, described)
        line = {"t": time.time(), "event": event.get("kind", "finished"), "to": receiver["name"], **outcome}
        with written, open(os.path.join(layout.pipeline, LOG), "a") as log:  # one whole line per write
            log.write(json.dumps(line) + "\n")

    workers = [threading.Thread(target=tell, args=(receiver,)) for receiver in receivers]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def start(layout: jobrunner.Layout, event: dict) -> None:
    """Notify in a process of its own, never waited for (the driver goes on to autostop at once)."""
    import subprocess  # here, not above: only a pipeline's end starts one

    if not (jobrunner.read_json(os.path.join(layout.pipeline, "plan.json")) or {}).get("notify"):
        return
    argv = [sys.executable, os.path.abspath(__file__), layout.root, json.dumps(event)]
    with open(os.devnull, "wb") as quiet:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=quiet, stderr=quiet, start_new_session=True)


def recent(layout: jobrunner.Layout, count: int = 5) -> list[dict]:
    """The last notifications' outcomes, for fab status."""
    try:
        with open(os.path.join(layout.pipeline, LOG)) as f:
            lines = f.read().splitlines()[-count:]
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


if __name__ == "__main__":
    os.umask(0o077)
    notify(jobrunner.Layout(os.path.expanduser(sys.argv[1])), json.loads(sys.argv[2]))
