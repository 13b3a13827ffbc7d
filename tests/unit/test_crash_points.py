"""The runner's protocol killed at every crash point (bootstrap/remote/faults.py), then driven to its end.

Each case: a job with a follow-up step (as export has) ran once and is done; its input changes, so the
next launch is a fresh attempt. That launch (or the runner it starts) is SIGKILLed at one point, and
the point's note proves the kill happened. The adopt cases first kill the fresh attempt's runner while
its main step runs, then kill the launch that adopts it at each point of that path. Then launches
without faults, as the pipeline driver makes them, until the job is done. Checked after each: the job
is done; its outputs are its latest attempt's, the follow-up's made from that attempt's main output
(never an earlier attempt's); no two copies of a step ever ran at once; the main step ran at most once
more than the attempts needed (an adopted step is not run again); a bucket record is the latest's.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bootstrap.paths import REPO
from bootstrap.remote import faults, gcs, jobrunner
from tests import gcsemulator
from tests.loopback import wait_for

REMOTE = REPO / "bootstrap" / "remote"
# Every VM-side module that writes a durable file or object (tests/unit/test_fault_campaign.py sweeps their
# points in a whole pipeline); the rest write none: they read, or talk to the Kubernetes API.
INSTRUMENTED = (
    "jobrunner.py",
    "driver.py",
    "gcs.py",
    "gcs_upload.py",
    "hub_upload.py",
    "attempts.py",
    "manifest.py",
    "export_config.py",
    "maxtext_check.py",
    "envcache.py",
)
DURABLE = {"write_json", "jobrunner.write_json", "os.replace", "os.remove", "gcs.write", "shutil.copyfile"}
DURABLE_METHODS = {"upload_file"}  # a file committed to the Hub
PRIMITIVES = {"write_json", "preflight"}  # the atomic write itself; the libtpu lock is not ours
RUNNER_POINTS = [p for p in faults.POINTS if p.startswith(("launch.", "run."))]
IF_BUCKET = {"run.recorded-in-bucket"}  # only a job with a record in the bucket reaches it
ADOPTED_WHILE = "run.process-going"  # the runner killed with its main step running: the next launch adopts it
FRESH = [p for p in RUNNER_POINTS if p != "launch.removed-dead-runner"]  # a fresh attempt removed it already
ADOPTING = ["launch.removed-dead-runner", *(p for p in RUNNER_POINTS if p.startswith("run.") and p not in IF_BUCKET)]

JOB = """
import json, os, sys, time
step, folder = sys.argv[1], sys.argv[2]
live = os.path.join(folder, f"live-{step}")
try:
    os.close(os.open(live, os.O_CREAT | os.O_EXCL))
except FileExistsError:
    open(os.path.join(folder, "violations"), "a").write(f"two live copies of {step}\\n")
time.sleep(float(os.environ.get("STEP_SECONDS", "0")))
if step == "main":
    count = os.path.join(folder, "main-runs")
    runs = int(open(count).read()) + 1 if os.path.exists(count) else 1
    open(count, "w").write(str(runs))
    made = {"attempt": open(os.path.join(folder, "input")).read(), "run": runs}
    open(os.path.join(folder, "main.json.tmp"), "w").write(json.dumps(made))
    os.replace(os.path.join(folder, "main.json.tmp"), os.path.join(folder, "main.json"))
else:
    made = json.load(open(os.path.join(folder, "main.json")))
    open(os.path.join(folder, "after.json"), "w").write(json.dumps({"made_from": made}))
os.remove(live)
"""


def spec(folder: Path) -> dict:
    job = [sys.executable, str(folder / "job.py")]
    return {
        "name": "export",
        "argv": [*job, "main", str(folder)],
        "after": [[*job, "after", str(folder)]],
        "env": {"STEP_SECONDS": "0.3"},
        "secrets": [],
        "inputs": [str(folder / "input")],
        "outputs": [str(folder / "main.json"), str(folder / "after.json")],
        "cwd": str(folder),
        "files": {"card.md": "what the job reads from its folder"},
    }


def launch(job_dir: Path, spec_text: str, crash_at: str = "") -> int:
    """One launch in its own process (a crash point kills it), with the fault named in its environment;
    the point notes its kill in job_dir's parent."""
    env = {k: v for k, v in os.environ.items() if k not in (faults.ENV, faults.NOTE_ENV)}
    if crash_at:
        env[faults.ENV], env[faults.NOTE_ENV] = crash_at, str(job_dir.parent / "killed")
    code = "import sys; from bootstrap.remote import jobrunner; jobrunner.launch(sys.argv[1], sys.argv[2])"
    return subprocess.run([sys.executable, "-c", code, str(job_dir), spec_text], env=env, cwd=REPO).returncode


def drive(job_dir: Path, spec_text: str, launches: int = 6) -> str:
    """What the driver does: wait while the job runs, launch it while it is not done; its final state."""
    for _ in range(launches):
        wait_for(lambda: jobrunner.job_state(str(job_dir))["state"] != "running", 60, "the job to stop running")
        state = jobrunner.job_state(str(job_dir))["state"]
        if state == "done":
            return state
        launch(job_dir, spec_text)
    return jobrunner.job_state(str(job_dir))["state"]


def killed(tmp_path: Path) -> list[str]:
    """The points that killed a process in this case, in order."""
    return (tmp_path / "killed").read_text().split() if (tmp_path / "killed").exists() else []


@pytest.mark.parametrize(
    ("adopted", "point"), [*((False, p) for p in FRESH), *((True, p) for p in ADOPTING)], ids=lambda v: str(v)
)
def test_a_kill_at_each_point_loses_nothing_and_mixes_no_attempts(tmp_path, adopted, point, request, monkeypatch):
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "input").write_text("1")
    planned = spec(tmp_path)
    if point in IF_BUCKET:  # a job whose done is recorded in the bucket too (its outputs are all there on a VM)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", request.getfixturevalue("gcs_emulator"))
        planned["record"] = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/tpu-rl/runs/r1/export.json"
    job_dir, text = tmp_path / "job", json.dumps(planned)
    assert drive(job_dir, text) == "done"  # attempt 1, clean
    (tmp_path / "input").write_text("2")  # the input changed: attempt 2 must be a fresh one
    assert jobrunner.job_state(str(job_dir))["state"] == "stale"
    if adopted:
        launch(job_dir, text, crash_at=ADOPTED_WHILE)
        wait_for(lambda: killed(tmp_path) == [ADOPTED_WHILE], 60, "the first runner's kill")
        wait_for(lambda: jobrunner.job_state(str(job_dir))["state"] != "running", 60, "the orphaned main step")
        assert jobrunner.job_state(str(job_dir))["state"] == "interrupted"
    launch(job_dir, text, crash_at=point)
    faults_made = [*([ADOPTED_WHILE] if adopted else []), point]  # each fault did happen (a runner's, soon after)
    wait_for(lambda: killed(tmp_path) == faults_made, 60, f"the kill at {point}")
    final = drive(job_dir, text)
    main, after = (json.loads((tmp_path / name).read_text()) for name in ("main.json", "after.json"))
    assert final == "done", (point, (job_dir / "log").read_text()[-2000:])
    assert main["attempt"] == "2", point  # made by the latest attempt, from the input as it is now
    assert after["made_from"] == main, point  # the follow-up ran on that attempt's output, not an older one
    assert not (tmp_path / "violations").exists(), (tmp_path / "violations").read_text()
    assert int((tmp_path / "main-runs").read_text()) <= 3, point  # attempt 1, attempt 2, at most one retry
    if point in IF_BUCKET:
        assert json.loads(gcs.read(planned["record"]))["inputs"] == jobrunner.inputs_digest(planned["inputs"])


def test_every_point_is_in_the_code_once_and_listed():
    called = []
    for path in REMOTE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "faults.point":
                (arg,) = node.args  # a name, or launch's loop over FORGOTTEN's
                called += [arg.value] if isinstance(arg, ast.Constant) else [p for _, p in jobrunner.FORGOTTEN]
    assert sorted(called) == sorted(faults.POINTS)


def test_a_durable_write_without_a_point_after_it_is_found():
    """In an instrumented module, each write, rename or removal of a durable file is followed by a point
    (in the same block, as the next statement), so that the sweep kills the process right after it."""
    missing = []
    for name in INSTRUMENTED:
        tree = ast.parse((REMOTE / name).read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name not in PRIMITIVES):
            for block in (getattr(n, field) for n in ast.walk(function) for field in ("body", "orelse")
                          if isinstance(getattr(n, field, None), list)):  # fmt: skip
                for i, statement in enumerate(block):
                    following = ast.unparse(block[i + 1]) if i + 1 < len(block) else ""
                    if _durable(statement, following) and not following.startswith("faults.point("):
                        missing.append(f"{name}:{statement.lineno} {ast.unparse(statement)[:80]}")
    assert missing == []


def _durable(statement: ast.stmt, following: str) -> bool:
    """A write, rename or removal of a durable file or object; a file opened to be written (not appended to)
    is one too, unless it is a temporary that the next statement renames into place."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if isinstance(call, ast.Call):
        function = ast.unparse(call.func)
        return function in DURABLE or function.rsplit(".", 1)[-1] in DURABLE_METHODS
    if isinstance(statement, ast.With):
        for item in statement.items:
            opened = item.context_expr
            if isinstance(opened, ast.Call) and ast.unparse(opened.func) == "open" and len(opened.args) > 1:
                mode = opened.args[1].value if isinstance(opened.args[1], ast.Constant) else "w"
                # appended to (a log, the events, `seen`, a lock): never a record that decides anything
                if ("w" in mode or "x" in mode) and not following.startswith("os.replace("):
                    return True
    return False


def test_the_points_are_inert_without_the_variable():
    """Off, a point does nothing (the sweep above would not finish otherwise); on, it kills at its hit."""
    code = "from bootstrap.remote import faults; faults.point('run.wrote-done'); faults.point('run.wrote-done'); print('on')"
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    assert subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True).stdout == b"on\n"
    killed = subprocess.run([sys.executable, "-c", code], env={**env, faults.ENV: "run.wrote-done@2"}, cwd=REPO)
    assert killed.returncode == -9


def test_a_forked_process_counts_its_own_hits_as_a_new_one_does():
    """NAME@2 is a process's second hit: a copy (start's driver is one) does not inherit the hit before it forked."""
    code = (
        "import os; from bootstrap.remote import faults; faults.point('run.wrote-done')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    faults.point('run.wrote-done'); os._exit(0)\n"
        "print(os.waitpid(pid, 0)[1])"
    )
    forked = subprocess.run([sys.executable, "-c", code], env={**os.environ, faults.ENV: "run.wrote-done@2"},
                            cwd=REPO, capture_output=True, text=True)  # fmt: skip
    assert forked.stdout == "0\n", forked.stderr
