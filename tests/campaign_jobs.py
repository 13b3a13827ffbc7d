"""The fault campaign's stand-in jobs, shaped like the real pipeline's (tests/campaign.py builds their plan).

    campaign_jobs.py convert CKPT_DIR LEDGER              the "converted model": CKPT_DIR/0/items
    campaign_jobs.py train ACTOR_DIR CONVERTED STEPS LEDGER
                                                          checkpoint steps, each committed as Orbax does
                                                          (commit_success.txt last); resumes after the
                                                          highest committed step; with EVALS_ENV, logs its
                                                          evals as train_rl does (before training, after
                                                          it) through the launcher's recorder
    campaign_jobs.py export STEP ACTOR_DIR EXPORT_DIR LEDGER
                                                          the export of STEP (${latest_step:...} on the VM)
    campaign_jobs.py shutdown MARKER LEDGER               autostop's command: records what it saw

Each run of a job is an attempt, numbered in the ledger (a folder that outlives the VM: the test's eyes).
What it makes carries that number beside it, so a checker tells a stale output from the latest one; what
the pipeline keeps (the checkpoints' contents, the export) is derived from the converted model alone, so
that every fault-free or faulted run ends with the same export. A job holds a lock on its ledger entry
while it runs: a second live copy finds it held and says so in the ledger's `violations` (a killed copy's
lock goes with it, so a SIGKILL never leaves a false one).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bootstrap.remote import attempts, gcs, jobrunner  # noqa: E402

COMMITTED = b"committed"
BROKEN_ENV = "CAMPAIGN_BROKEN"  # a deliberately broken variant, to show that a check catches it
EVALS_ENV = "CAMPAIGN_EVALS"  # BEFORE,AFTER,TOTAL: problems solved before training and after, of TOTAL
BASE_MODEL = "base-weights"
STARTS, VIOLATIONS, EVENTS, SHUTDOWNS = "starts.jsonl", "violations", "events.jsonl", "shutdowns.jsonl"


def milestone(ledger: str, event: str, attempt: int) -> None:
    """Noted in the ledger; then held while the test's `hold-EVENT` file is there (a fault lands here), the
    same hold as on arrival: one made again for the next fault never holds a job that got here before."""
    append(ledger, EVENTS, {"event": event, "attempt": attempt})
    hold = os.path.join(ledger, f"hold-{event}")
    arrived = _read(hold)
    while arrived is not None and _read(hold) == arrived:
        time.sleep(0.01)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def append(ledger: str, name: str, entry: dict) -> None:
    """One JSON line (one write: whole lines only, whoever appends beside)."""
    with open(os.path.join(ledger, name), "a") as f:
        f.write(json.dumps({"t": time.time(), **entry}) + "\n")


def begin(ledger: str, job: str):
    """Hold this job's live lock (or note a second live copy) and number this attempt; the lock's file, kept
    open for as long as the process lives, and the attempt."""
    live = open(os.path.join(ledger, f"live-{job}"), "a")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(live, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        append(ledger, VIOLATIONS, {"violation": f"two live copies of {job}", "pid": os.getpid()})
    with open(os.path.join(ledger, "count.lock"), "a") as serial:
        fcntl.flock(serial, fcntl.LOCK_EX)
        path = os.path.join(ledger, STARTS)
        with open(path, "a+") as f:
            f.seek(0)
            previous = [json.loads(line) for line in f]
        attempt = 1 + sum(entry["job"] == job for entry in previous)
        append(ledger, STARTS, {"job": job, "attempt": attempt, "pid": os.getpid()})
    return live, attempt


def state_after(state: str, step: int) -> str:
    """What training one more step makes of a state: deterministic, so every run ends the same."""
    return hashlib.sha256(f"{state}/{step}".encode()).hexdigest()[:16]


def convert(ckpt: str, ledger: str) -> int:
    _live, attempt = begin(ledger, "convert")
    gcs.write(f"{ckpt}/0/items", json.dumps({"model": BASE_MODEL, "attempt": attempt}).encode())
    milestone(ledger, "converted", attempt)
    return 0


def train(actor: str, converted: str, steps: int, ledger: str) -> int:
    _live, attempt = begin(ledger, "train")
    attempts.record_start(dict(os.environ))
    from bootstrap.remote import eval_recorder  # here: it imports logging, which the other jobs need not pay for

    recorder = eval_recorder.EvalRecorder.install(dict(os.environ))  # as maxtext_run.py installs it
    done = jobrunner.finished_steps(actor)  # the product's rule for a committed step
    if os.environ.get(BROKEN_ENV) == "restart":  # a deliberately broken trainer: it ignores them
        done = []
    last = done[-1] if done else 0
    state = json.loads(gcs.read(converted))["model"]
    if last:
        state = json.loads(gcs.read(f"{actor}/{last}/model_params/data"))["state"]
        evaluate(recorder, f"Restored params from step: {last} in 0.1 seconds")  # tunix's line, then its Pre eval
    evaluate(recorder, "Pre RL Training", before=True)
    for step in range(last + 1, steps + 1):
        state = state_after(state, step)
        made = {"step": step, "state": state, "attempt": attempt}
        gcs.write(f"{actor}/{step}/model_params/data", json.dumps(made).encode())
        gcs.write(f"{actor}/{step}/commit_success.txt", COMMITTED)  # last: the step is committed
        milestone(ledger, f"committed-{step}", attempt)
    evaluate(recorder, "Post RL Training")
    if recorder is not None:
        milestone(ledger, "evaluated", attempt)
    return 0


def evaluate(recorder, phase: str, before: bool = False) -> None:
    """An eval line as train_rl logs it (or another line of its log), handed to the launcher's recorder; a
    resumed attempt's "Pre" eval scores its restored weights, which score as the run's result so far."""
    if recorder is None:
        return
    if not phase.endswith("Training"):
        recorder.read(phase)
        return
    first, last, total = (int(n) for n in os.environ[EVALS_ENV].split(","))
    correct = first if before and recorder.attempts.resumed_at is None else last
    recorder.read(
        f"W1203 10:00:00.000000 1 train_rl.py:716] {phase}: corr={correct}, total={total}, "
        f"accuracy={100 * correct / total}%, partial_accuracy=50.0%, format_accuracy=90.0%, mean_reward=1.0000"
    )


def export(step: str, actor: str, folder: str, ledger: str) -> int:
    _live, attempt = begin(ledger, "export")
    state = json.loads(gcs.read(f"{actor}/{step}/model_params/data"))["state"]
    os.makedirs(folder, exist_ok=True)
    files = {
        "config.json": json.dumps({"model_type": "llama", "step": int(step), "state": state}),
        "generation_config.json": json.dumps({"eos_token_id": [128001, 128009]}),
        "model.safetensors": hashlib.sha256(state.encode()).hexdigest() * 64,
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    with open(f"{folder}.attempt", "w") as f:  # beside the export, not in it: the export is the same each run
        f.write(str(attempt))
    milestone(ledger, "exported", attempt)
    return 0


def shutdown(marker: str, ledger: str) -> int:
    """What autostop's shutdown saw: the copy's marker, and the objects where it says the copy is."""
    try:
        with open(marker) as f:
            copied = json.load(f)
    except (OSError, ValueError):
        copied = None
    objects = {}
    if copied:
        prefix = f"{copied['url']}/"
        for name in gcs.names(prefix):
            objects[name.removeprefix(prefix)] = hashlib.sha256(gcs.read(name) or b"").hexdigest()
    append(ledger, SHUTDOWNS, {"marker": copied, "objects": objects})
    return 0


def main(argv: list[str]) -> int:
    kind, args = argv[0], argv[1:]
    if kind == "convert":
        return convert(*args)
    if kind == "train":
        return train(args[0], args[1], int(args[2]), args[3])
    if kind == "export":
        return export(*args)
    if kind == "shutdown":
        return shutdown(*args)
    raise SystemExit(f"unknown stand-in {kind}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
