"""The fault campaign's harness: one pipeline on a stand-in VM, its faults, and the invariants checked after.

A Case is one VM's worth of folders below a temporary one (the state folder, a folder standing for
/dev/shm, the tools' bin), one prefix of the Cloud Storage emulator's bucket (behind tests/gcslayer.py,
which fails requests there on demand and journals every write), and a ledger that outlives the VM (the
stand-in jobs write their attempts and milestones there: tests/campaign_jobs.py). `fab train` is what it
is on the VM: the real driver.py from the tools folder, `start STATE --follow` with the plan on stdin; the
plan has the real pipeline's shape (convert, train, export with its manifest step, the Cloud Storage copy
built by bootstrap/results/publish.py and run by the real gcs_upload.py) and autostop on.

Every process of a case carries TPU_RL_CAMPAIGN_CASE in its environment, so a reboot finds and kills all of
them (the jobs run in sessions of their own), as a VM's restart does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from bootstrap.jobs.plan import _durable_record, runner_spec
from bootstrap.jobs.task import GSM8K, GSM8K_NAME, TASKS, Task
from bootstrap.remote import attempts, faults, gcs, jobrunner, manifest, processes
from bootstrap.remote.jobrunner import Layout
from bootstrap.results import publish
from bootstrap.vm.machine import TOOLS
from tests import campaign_jobs, hubstub
from tests.gcsemulator import BUCKET

REPO = Path(__file__).resolve().parents[1]
REMOTE = REPO / "bootstrap" / "remote"
JOBS = str(REPO / "tests" / "campaign_jobs.py")
GCLOUD = str(REPO / "tests" / "campaign_gcloud.py")
CASE_ENV = "TPU_RL_CAMPAIGN_CASE"
RUN = "r1"
STEPS = 3
CALL_SECONDS = 180  # one `fab train` on a busy machine; a clean one takes a few seconds
HANG_SECONDS = 15  # a follow still running this long after its driver ended will never end
WAIT_SECONDS = 90
AUTOSTOP_SECONDS = 0.3
MILESTONES = ("converted", *(f"committed-{s}" for s in range(1, STEPS + 1)), "exported", "copying")
JOB_AT = {"converted": "convert", "exported": "export", "copying": "publish-gcs"}  # the rest: train's
# With the Hub copy: between train's eval after training and the gate (train's job still running), and after
# the export the gate judges
GATE_MILESTONES = ("evaluated", "exported")
TOKEN = "hf_campaign" + "0" * 30
IMPROVED = "600,800,1319"  # 45.5% -> 60.7% of GSM8K's test split: beyond the noise
BEST = {  # what the repository holds in a "worse" case: run "best"'s model, 90% of 1,319 problems
    "README.md": hubstub.model_card("best", "90.0", "1319", "https://huggingface.co/tester/best", "# the best model"),
    "model.safetensors": b"the best weights",
}
SPEED = {  # test-only: retries back off from 10 ms, a request times out after 1 s (retry.py, gcs.py)
    "TPU_RL_RETRY_BACKOFF_SECONDS": "0.01",
    "TPU_RL_GCS_TIMEOUT_SECONDS": "1",
}


def wait_until(condition, seconds: float, what: str) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class Call:
    """One `fab train`: how it ended and what it printed; `cut` when a reboot killed it with the VM."""

    code: int
    out: str
    err: str
    cut: bool = False
    hung: bool = False  # still streaming long after its driver ended


@dataclass
class Case:
    root: Path
    emulator: str  # the layer's URL
    name: str  # the bucket prefix of this case's objects
    calls: list[Call] = field(default_factory=list)
    faults_made: list[str] = field(default_factory=list)

    broken: str = ""  # a deliberately broken trainer (campaign_jobs.BROKEN_ENV)
    # with the Hub copy (the real hub_upload.py against tests/hubstub.py, publish_if: improved): "better", a run
    # that improved on its base model; "worse", one that did too, but the repository holds a better model already
    hub: str = ""
    hub_state: object = None  # the Hub stand-in's state (hubstub.Hub), with its URL

    def __post_init__(self):
        self.state, self.shm, self.ledger, self.bin = (self.root / n for n in ("state", "shm", "ledger", "bin"))
        for folder in (self.shm, self.ledger, self.bin):
            folder.mkdir(parents=True, exist_ok=True)
        (self.bin / "gcloud").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{GCLOUD}" "$@"\n')
        (self.bin / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # the VM's python3
        for tool in ("gcloud", "python3"):
            (self.bin / tool).chmod(0o755)
        self.layout = Layout(str(self.state))
        self.durable = f"gs://{BUCKET}/{self.name}/work"
        self.ckpt = f"{self.durable}/mt-format/k1"
        self.actor = f"{self.durable}/post-train/{RUN}/checkpoints/actor"
        self.export_dir = f"{self.shm}/hf-trained/{RUN}"
        self.copy_url = f"gs://{BUCKET}/{self.name}/results/{RUN}"
        self.repo = f"tester/{self.name}"
        if self.hub == "worse":  # the repository holds run "best"'s model, better than this run's will be
            self.hub_state.repos[self.repo], self.hub_state.private[self.repo] = dict(BEST), True
        self.plan = self._plan()
        self.arm({})

    # --- the plan -----------------------------------------------------------------------------------

    def _job(self, name: str, job_dir: str, argv: list[str], outputs: list[str], needs: list[str], **extra) -> dict:
        spec = dict(runner_spec(self.layout, name, argv, outputs, cwd=str(self.root), **extra))
        if record := _durable_record(self.durable, self.layout, job_dir, outputs):
            spec["record"] = record
        uses_tpu = name in ("train", "export")
        return {"name": name, "job_dir": job_dir, "spec": spec, "needs": needs, "uses_tpu": uses_tpu, "start": True}

    def _plan(self) -> dict:
        """The plan as fab's driver_plan renders it (bootstrap/vm/pipeline.py), with stand-in jobs."""
        layout, stand_in, ledger = self.layout, [sys.executable, JOBS], str(self.ledger)
        convert = self._job(
            "convert",
            layout.shared("convert", "k1"),
            [*stand_in, "convert", self.ckpt, ledger],
            [f"{self.ckpt}/0/items"],
            [],
        )
        train = self._job(
            "train",
            layout.run_job(RUN, "train"),
            [*stand_in, "train", self.actor, f"{self.ckpt}/0/items", str(STEPS), ledger],
            [f"{self.actor}/*/model_params"],
            ["convert"],
            env={
                attempts.DIR_ENV: f"{self.durable}/post-train/{RUN}/attempts",
                attempts.CHECKPOINTS_ENV: self.actor,
                **({campaign_jobs.BROKEN_ENV: self.broken} if self.broken else {}),
                **({attempts.EVALS_ENV: self.evals, campaign_jobs.EVALS_ENV: IMPROVED} if self.hub else {}),
            },
            inputs=[f"{self.ckpt}/0/items"],
        )
        export = self._job(
            "export",
            layout.run_job(RUN, "export"),
            [*stand_in, "export", f"${{latest_step:{self.actor}}}", self.actor, self.export_dir, ledger],
            [f"{self.export_dir}/{name}" for name in ("config.json", "generation_config.json", "*.safetensors")],
            ["train"],
            after=[[sys.executable, layout.tool("manifest.py"), self.export_dir]],
            inputs=[f"{self.actor}/*/model_params"],
            files={"card.md": "what the job reads from its folder"},
        )
        copy = publish.gcs_job(SimpleNamespace(layout=layout, run_name=RUN), self.export_dir, self.copy_url)
        self.marker = copy.runner_spec["outputs"][0]
        copies = [copy, *([self._hub_job(train)] if self.hub else [])]
        entries = [
            {"name": job.name, "job_dir": job.job_dir, "spec": dict(job.runner_spec), "needs": list(job.needs),
             "uses_tpu": False, "start": True}
            for job in copies
        ]  # fmt: skip
        if self.hub:  # the Hub stand-in's address, as fab's HF_ENDPOINT reaches the VM
            entries[1]["spec"]["env"] = {**entries[1]["spec"]["env"], "HF_ENDPOINT": self.hub_state.url}
            self.hub_marker = entries[1]["spec"]["outputs"][0]
        preflight = {
            "chips": 0,
            "chip_glob": f"{self.root}/no-chips-*",
            "min_memory_gb": 0,
            "min_shm_gb": 0,
            "shm_path": str(self.shm),
            "libtpu_lockfile": f"{self.root}/libtpu_lockfile",
            "secrets": {},
            "bucket": self.durable,
        }
        body = {"run": RUN, "jobs": [convert, train, export, *entries], "preflight": preflight}
        shutdown = [sys.executable, JOBS, "shutdown", self.marker, ledger]
        kept_by = [entry["spec"]["outputs"][0] for entry in entries]
        return {
            **body,
            "digest": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16],
            "hint": "",
            "started_by": "the fault campaign",
            "autostop": {"idle_seconds": AUTOSTOP_SECONDS, "why": "campaign", "command": shutdown, "kept_by": kept_by},
        }

    @property
    def evals(self) -> str:
        """Where train's launcher records its evals: beside its checkpoints, in the bucket."""
        return f"{self.durable}/post-train/{RUN}/evals"

    def _hub_job(self, train: dict):
        """The Hub copy as publish.hub_job builds it for a plan of this shape (results.publish_if: improved)."""
        rendered = SimpleNamespace(env=train["spec"]["env"], progress={"total_steps": STEPS}, argv=["train_rl"])
        results = SimpleNamespace(hub_repo=self.repo, hub_private=True, publish_if="improved")
        plan = SimpleNamespace(
            spec=SimpleNamespace(results=results, environment=SimpleNamespace(python_path=sys.executable)),
            layout=self.layout,
            run_name=RUN,
            base_model="meta-llama/Llama-3.1-8B-Instruct",
            task=Task(GSM8K_NAME, GSM8K, Path(TASKS), {}),  # the default task
            job=lambda name: SimpleNamespace(rendered=rendered, lr_schedule=None),
        )
        return publish.hub_job(plan, self.export_dir)

    def jobs(self) -> dict[str, dict]:
        return {job["name"]: job for job in self.plan["jobs"]}

    # --- the VM -------------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_RL_")}
        env |= {"STORAGE_EMULATOR_HOST": self.emulator, "PATH": f"{self.bin}:{env.get('PATH', '')}", **SPEED}
        return env | {CASE_ENV: self.name, "CAMPAIGN_LEDGER": str(self.ledger), **extra}

    def kill_env(self, point: str) -> dict[str, str]:
        """The environment that makes the process reaching `point` (driver, runner or tool) die there, once
        in the whole process tree (each kill its own note)."""
        note = self.root / f"killed-{len(self.notes())}-{len(self.calls)}"
        return {faults.ENV: point, faults.NOTE_ENV: str(note), faults.ONCE_ENV: "1"}

    def killed(self) -> list[str]:
        """The points that killed a process, in the order their faults were made."""
        notes = sorted(self.notes(), key=lambda p: os.path.getmtime(p))
        return [point for note in notes for point in note.read_text().split()]

    def notes(self) -> list[Path]:
        return [note for note in self.root.glob("killed-*") if note.suffix != ".hits"]

    def install(self) -> None:
        """The tools in the VM's bin, and the token in its secrets folder, as fab puts them before a command."""
        os.makedirs(self.layout.bin, exist_ok=True)
        for tool in TOOLS:
            target = Path(self.layout.tool(tool))
            if not target.exists():
                shutil.copyfile(REMOTE / tool, target)
        if self.hub:
            os.makedirs(self.layout.secrets, exist_ok=True)
            Path(self.layout.secrets, "HF_TOKEN").write_text(TOKEN)

    def start(self, **extra: str) -> subprocess.Popen:
        """`fab train`'s command on the VM, started."""
        self.install()
        plan = self.root / "plan.json"  # what fab sends on the command's stdin
        plan.write_text(json.dumps(self.plan))
        argv = [sys.executable, self.layout.tool("driver.py"), "start", str(self.state), "--follow"]
        with open(plan) as stdin:
            return subprocess.Popen(
                argv, env=self.env(**extra), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                cwd=self.root,
            )  # fmt: skip

    def finish(self, process: subprocess.Popen, cut: bool = False) -> Call:
        """The call's end; one still streaming HANG_SECONDS after its driver ended (no `finished` will come)
        is stopped and marked hung."""
        deadline, gone_since, hung = time.monotonic() + CALL_SECONDS, None, False
        while True:
            try:
                out, err = process.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                record = self.driver_record()
                gone = bool(record) and not processes.alive(record) and record.get("state") != "running"
                gone_since = (gone_since or time.monotonic()) if gone else None
                if time.monotonic() > deadline or (gone_since and time.monotonic() - gone_since > HANG_SECONDS):
                    process.kill()
                    out, err = process.communicate()
                    hung = True
                    break
        call = Call(process.returncode, out, err, cut, hung)
        self.calls.append(call)
        return call

    def call(self, **extra: str) -> Call:
        return self.finish(self.start(**extra))

    def driver_record(self) -> dict | None:
        return jobrunner.read_json(os.path.join(self.layout.pipeline, "driver.json"))

    def wait_driver_gone(self) -> None:
        """The driver ends after its pass (and autostop's shutdown); a killed one is gone already."""
        wait_until(lambda: not processes.alive(self.driver_record()), WAIT_SECONDS, f"{self.name}'s driver to end")

    def ended(self) -> bool:
        """Every job done, and autostop's shutdown ran (and worked)."""
        record = self.driver_record() or {}
        return record.get("state") == "done" and (record.get("shutdown") or {}).get("exit_code") == 0

    def drive(self, calls: int = 3) -> bool:
        """`fab train` again until the pipeline has ended (at most `calls` times); whether it did."""
        for _ in range(calls):
            self.call()
            self.wait_driver_gone()
            if self.ended():
                return True
        return False

    def processes(self) -> list[int]:
        """Every live process of this case (its marker is in their environment)."""
        mark, found = f"{CASE_ENV}={self.name}\0".encode(), []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark in f.read():
                        found.append(int(pid))
            except OSError:
                continue
        return found

    def kill_all(self) -> None:
        """Every process of the pipeline SIGKILLed (a zombie reads no environment: it is gone already)."""

        def none_left() -> bool:
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not self.processes()

        wait_until(none_left, WAIT_SECONDS, f"{self.name}'s processes to die")

    def reboot(self, lose_vm: bool = False) -> None:
        """The VM restarts (every process killed, /dev/shm empty, the state folder kept), or is lost: a new
        VM with nothing of the old one's but the bucket (and the Hub)."""
        self.kill_all()
        shutil.rmtree(self.shm)
        self.shm.mkdir()
        if lose_vm:
            shutil.rmtree(self.state, ignore_errors=True)

    def milestones(self) -> list[str]:
        path = self.ledger / campaign_jobs.EVENTS
        return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []

    def at(self, milestone: str, action, **extra: str) -> Call:
        """`fab train` started, and `action` done while a job is held at `milestone` (or once the call ended,
        if the pipeline was past it); the call then runs on, or was cut with the VM."""
        hold, before = self.ledger / f"hold-{milestone}", len(self.milestones())
        hold.with_suffix(".new").write_text(uuid.uuid4().hex)  # each hold its own (campaign_jobs.milestone),
        os.replace(hold.with_suffix(".new"), hold)  # whole when a job reads it
        try:
            process = self.start(**extra)
            reached = lambda: milestone in self.milestones()[before:] or process.poll() is not None  # noqa: E731
            wait_until(reached, CALL_SECONDS, f"{self.name} to reach {milestone}")
            cut = action(process)
        finally:
            hold.unlink()
        return self.finish(process, cut=cut)

    def reboot_at(self, milestone: str, lose_vm: bool = False, **extra: str) -> Call:
        """The VM restarted (or lost) with a job at `milestone`."""
        return self.at(milestone, lambda _: self.reboot(lose_vm) or True, **extra)

    def laptop_gone_at(self, milestone: str, **extra: str) -> Call:
        """`fab train` itself killed (the laptop closed, its SSH session dropped); the pipeline goes on."""
        return self.at(milestone, lambda process: process.kill() or True, **extra)

    def kill_runner_at(self, milestone: str, **extra: str) -> Call:
        """The runner of the job at `milestone` SIGKILLed (its job runs on: the driver has a new runner adopt it)."""
        job = JOB_AT.get(milestone, "train")

        def kill(_process) -> bool:
            record = jobrunner.read_json(os.path.join(self.jobs()[job]["job_dir"], jobrunner.RUNNER))
            if record and processes.alive(record):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record["pid"], signal.SIGKILL)
            return False

        return self.at(milestone, kill, **extra)

    # --- the bucket ---------------------------------------------------------------------------------

    def arm(self, plan: dict) -> None:
        """Storage faults below this case's prefix (tests/gcslayer.py); {} keeps the journal only."""
        body = json.dumps({"prefix": f"{self.name}/", **plan}).encode()
        urllib.request.urlopen(urllib.request.Request(f"{self.emulator}/_faults", data=body), timeout=30).read()

    def journal(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.emulator}/_journal?prefix={self.name}/", timeout=30) as answer:
            return json.load(answer)

    def read(self, url: str) -> bytes | None:
        return gcs.read(url)


def object_name(url: str) -> str:
    return gcs.split(url)[1]


def export_files(folder: str) -> dict[str, bytes]:
    """The export as it stands: every file in its folder."""
    found = {}
    for root, _, files in os.walk(folder):
        for file in files:
            path = os.path.join(root, file)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


def attempts_of(case: Case, job: str) -> list[dict]:
    path = case.ledger / campaign_jobs.STARTS
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry for entry in map(json.loads, lines) if entry["job"] == job]


def violations(case: Case, reference: dict[str, bytes] | None, faulted: set[int] = frozenset()) -> list[str]:
    """Every invariant the case broke, one line each (empty: none). `faulted`: the calls a kill or a
    reboot may have cut (their exit is the fault's, not fab's)."""
    found: list[str] = []
    path = case.ledger / campaign_jobs.VIOLATIONS
    found += [f"(1) {json.loads(line)['violation']}" for line in path.read_text().splitlines()] if path.exists() else []
    jobs, journal = case.jobs(), case.journal()
    found += _outputs(case, jobs, reference)
    found += _durable(case, jobs, journal)
    found += _shutdowns(case, reference)
    found += _calls(case, faulted)
    found += _reruns(case, jobs, journal)
    found += _hub(case, reference) if case.hub else []
    return found


def _hub(case: Case, reference: dict[str, bytes] | None) -> list[str]:
    """(8) a better model is never held back for a lost log: it is on the Hub, whole; (9) a worse model never
    replaces a better one: the repository keeps the better model, and the gate says which run holds it."""
    marker = jobrunner.read_json(case.hub_marker) or {}
    there = case.hub_state.repos.get(case.repo, {})
    if case.hub == "better":
        if marker.get("held"):
            return [f"(8) a better model was held back: {marker['held']}"]
        weights = {name: data for name, data in there.items() if name != "README.md"}
        if reference is not None and weights != reference:
            return [f"(8) the Hub holds {sorted(weights)}, not the export"]
        return []
    found = [] if "what tester/" in marker.get("held", "") and "run best's model" in marker.get("held", "") else [
        f"(9) the gate did not hold the worse model for the better one there: {marker}"
    ]  # fmt: skip
    if there.get("model.safetensors") != BEST["model.safetensors"] or there.get("README.md") != BEST["README.md"]:
        found.append(f"(9) a worse model replaced the better one on the Hub: {sorted(there)}")
    return found


def _outputs(case: Case, jobs: dict[str, dict], reference: dict[str, bytes] | None) -> list[str]:
    """(2) a done job's outputs are complete and its latest attempt's; (4) the export and its copy are the
    fault-free run's."""
    found = []
    full = {name: jobrunner.job_state(job["job_dir"], job["spec"]) for name, job in jobs.items()}
    states = {name: state["state"] for name, state in full.items()}
    if states["export"] == "lost" and full["publish-gcs"].get("source_gone"):
        states.pop("export")  # a restart took the export after its copy was verified: the copy is the result
    found += [f"(2) {name} is {state} at the end" for name, state in states.items() if state != "done"]
    if states["convert"] == "done":
        made = json.loads(case.read(f"{case.ckpt}/0/items") or b"{}")
        latest = attempts_of(case, "convert")[-1]["attempt"] if attempts_of(case, "convert") else None
        if made.get("attempt") != latest:
            found.append(f"(2) convert is done with attempt {made.get('attempt')}'s model, its latest is {latest}")
    if states["train"] == "done":
        state = campaign_jobs.BASE_MODEL
        steps = jobrunner.finished_steps(case.actor)
        if steps != list(range(1, STEPS + 1)):
            found.append(f"(2) train is done with committed steps {steps}")
        for step in steps:
            state = campaign_jobs.state_after(state, step)
            data = json.loads(case.read(f"{case.actor}/{step}/model_params/data") or b"{}")
            if data.get("state") != state:
                found.append(f"(2) committed step {step} holds {data.get('state')}, not what step {step} makes")
    if states.get("export") == "done":
        files = export_files(case.export_dir)
        try:
            manifest.read_verified(case.export_dir)
        except (OSError, ValueError) as err:
            found.append(f"(2) export is done, its SHA256SUMS does not verify: {err}")
        made = Path(f"{case.export_dir}.attempt")
        latest = attempts_of(case, "export")[-1]["attempt"] if attempts_of(case, "export") else None
        if not made.exists() or int(made.read_text()) != latest:
            found.append(
                f"(2) export is done with attempt {made.exists() and made.read_text()}'s files, latest {latest}"
            )
        if reference is not None and files != reference:
            found.append(f"(4) the export differs from the fault-free run's: {sorted(files)} vs {sorted(reference)}")
    if states["publish-gcs"] == "done":
        copied = jobrunner.read_json(case.marker) or {}
        there = _copy(copied.get("url", case.copy_url))
        if reference is not None and there != {n: hashlib.sha256(d).hexdigest() for n, d in reference.items()}:
            found.append(f"(4) the copy at {copied.get('url')} differs from the export: {sorted(there)}")
    return found


def _copy(url: str) -> dict[str, str]:
    prefix = f"{url}/"
    return {n.removeprefix(prefix): hashlib.sha256(gcs.read(n) or b"").hexdigest() for n in gcs.names(prefix)}


def _durable(case: Case, jobs: dict[str, dict], journal: list[dict]) -> list[str]:
    """(3) nothing durable deleted or replaced by other bytes: a committed step (from its commit on), the
    converted model (from convert's record on), a copy's objects (from their first write on)."""
    writes = [entry for entry in journal if "op" in entry]
    since: dict[str, int] = {}  # a name, or a folder's prefix -> the journal index from which it is durable
    actor, copies = f"{object_name(case.actor)}/", f"{object_name(case.copy_url)}/"
    for index, entry in enumerate(writes):
        name = entry["name"]
        if entry["op"] == "write" and name.startswith(actor) and name.endswith("/commit_success.txt"):
            since.setdefault(name.removesuffix("commit_success.txt"), index)
        if entry["op"] == "write" and name == object_name(jobs["convert"]["spec"]["record"]):
            since.setdefault(f"{object_name(case.ckpt)}/0/items", index)
        if name.startswith(copies):
            since.setdefault(name, index)
    found = []
    for key, start in since.items():
        kept: dict[str, str | None] = {}  # what each object below `key` held when it became durable
        for index, entry in enumerate(writes):
            name, write = entry["name"], entry["op"] == "write"
            if not name.startswith(key):
                continue
            if index <= start:
                kept.update({name: entry.get("md5")}) if write else kept.pop(name, None)
            elif not write:
                found.append(f"(3) {name} deleted after it was durable")
            elif kept.setdefault(name, entry.get("md5")) != entry.get("md5"):
                found.append(f"(3) {name} replaced by other bytes after it was durable")
    return found


def _shutdowns(case: Case, reference: dict[str, bytes] | None) -> list[str]:
    """(5) autostop shut the VM down only once the copy was verified, and whole."""
    path = case.ledger / campaign_jobs.SHUTDOWNS
    seen = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    found = [] if seen else ["(5) autostop never shut the VM down"]
    expected = {n: hashlib.sha256(d).hexdigest() for n, d in (reference or {}).items()}
    for record in seen:
        if not record["marker"]:
            found.append("(5) autostop shut the VM down before the copy was verified (no marker)")
        elif reference is not None and record["objects"] != expected:
            found.append(f"(5) autostop shut the VM down with the copy incomplete: {sorted(record['objects'])}")
    return found


def _calls(case: Case, faulted: set[int]) -> list[str]:
    """(6) each `fab train` exits 0, or says why in one line; never a traceback."""
    found = []
    for number, call in enumerate(case.calls):
        if call.hung:
            found.append(f"(6) {HUNG}: call {number}")
        elif "Traceback" in call.err or "Traceback" in call.out:
            found.append(f"(6) call {number} printed a traceback: {call.err[-1500:]}")
        elif call.code == -signal.SIGKILL and (number in faulted or call.cut):
            continue
        elif call.code != 0 and len(call.err.strip().splitlines()) != 1:
            found.append(f"(6) call {number} exited {call.code} with {call.err[-500:]!r}")
    return found


HUNG = "fab train never ended: its driver was gone without `finished`"


def _reruns(case: Case, jobs: dict[str, dict], journal: list[dict]) -> list[str]:
    """(7) no job with a durable record of done (convert, train) starts again after that record."""
    found = []
    for name in ("convert", "train"):
        record = object_name(jobs[name]["spec"]["record"])
        written = [entry["t"] for entry in journal if entry.get("op") == "write" and entry["name"] == record]
        if written:
            again = [a["attempt"] for a in attempts_of(case, name) if a["t"] > written[0]]
            if again:
                found.append(f"(7) {name} ran again (attempts {again}) after its record said done")
    return found
