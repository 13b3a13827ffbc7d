"""A Spot preemption said before the VM goes: the real shutdown script (bootstrap/shutdown.sh), asked by a metadata
server whether the VM is being preempted, runs each registered pipeline's preempted.py as its user; the record
lands in the bucket (a real Cloud Storage emulator) with the last committed step, and the receivers are told."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bootstrap.paths import REPO
from bootstrap.remote import gcs, jobrunner, preempted
from bootstrap.vm.machine import REMOTE_SCRIPTS, TOOLS
from tests import gcsemulator
from tests.webhook import Receiver

SHUTDOWN = REPO / "bootstrap" / "shutdown.sh"


class Metadata:
    """The metadata server's one answer the script asks for: instance/preempted."""

    def __init__(self, preempted: str):
        answer = preempted.encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                ok = (
                    self.path == "/computeMetadata/v1/instance/preempted"
                    and self.headers["Metadata-Flavor"] == "Google"
                )
                self.send_response(200 if ok else 404)
                self.end_headers()
                self.wfile.write(answer if ok else b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/computeMetadata/v1"


@pytest.fixture
def vm(tmp_path, gcs_emulator, monkeypatch):
    """A VM's user with a pipeline running train at step 5 of a run whose checkpoints are in the bucket (steps 2 and
    4 committed, 5 not yet), told to a receiver: its home, state folder and bucket folder."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "user"))
    run_dir = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/post-train/r1"
    for step in (2, 4):
        gcs.write(f"{run_dir}/checkpoints/actor/{step}/commit_success.txt", b"ok")
    gcs.write(f"{run_dir}/checkpoints/actor/5/model_params/part", b"uncommitted")
    layout = jobrunner.Layout(str(tmp_path / "state"))
    for folder in (layout.bin, layout.pipeline, layout.secrets):
        os.makedirs(folder, mode=0o700)
    for tool in TOOLS:
        shutil.copy(REMOTE_SCRIPTS / tool, layout.bin)
    receiver = Receiver()
    Path(layout.secrets, "NOTIFY_HOOK").write_text(receiver.url)
    env = {"TPU_RL_ATTEMPTS_DIR": f"{run_dir}/attempts", "TPU_RL_CHECKPOINT_DIR": f"{run_dir}/checkpoints/actor"}
    plan = {"run": "r1", "notify": [{"name": "HOOK", "secret": "NOTIFY_HOOK", "kind": "json"}]}
    plan["jobs"] = [{"name": "train", "job_dir": str(tmp_path / "train"), "spec": {"env": env, "outputs": []}}]
    jobrunner.write_json(f"{layout.pipeline}/plan.json", plan)
    jobrunner.write_json(f"{layout.pipeline}/driver.json", {"state": "running", "running": ["train"]})
    preempted.register(layout)
    preempted.register(layout)  # every start registers: once is kept
    yield {"layout": layout, "run_dir": run_dir, "receiver": receiver, "home": tmp_path / "home"}
    receiver.close()


def shutdown(vm: dict, answer: str) -> subprocess.CompletedProcess:
    metadata = Metadata(answer)
    env = {**os.environ, "TPU_RL_METADATA_URL": metadata.url, "TPU_RL_HOMES": str(vm["home"])}
    try:
        return subprocess.run(["bash", SHUTDOWN], env=env, capture_output=True, text=True, timeout=60)
    finally:
        metadata.server.shutdown()


def test_a_preemption_is_recorded_in_the_bucket_with_the_last_committed_step_and_told(vm):
    registry = Path(os.path.expanduser(preempted.REGISTRY))
    assert registry.read_text() == f"{vm['layout'].root}\n"
    done = shutdown(vm, "TRUE")
    assert done.returncode == 0, done.stderr
    (name,) = gcs.names(f"{vm['run_dir']}/preemptions/")
    found = json.loads(gcs.read(name))
    assert found["run"] == "r1" and found["committed_step"] == 4 and found["running"] == ["train"]
    (post,) = vm["receiver"].posts
    assert post["body"]["kind"] == "preempted" and post["body"]["committed_step"] == 4
    assert "preempted during train (last committed checkpoint: step 4)" in post["body"]["text"]
    assert vm["receiver"].secret not in done.stdout + done.stderr


def test_any_other_stop_records_nothing_and_tells_no_one(vm):
    done = shutdown(vm, "FALSE")  # autostop, pulumi destroy, a user's shutdown
    assert done.returncode == 0, done.stderr
    assert gcs.names(f"{vm['run_dir']}/preemptions/") == [] and vm["receiver"].posts == []


def test_a_vm_with_no_pipeline_running_records_nothing(vm):
    jobrunner.write_json(f"{vm['layout'].pipeline}/driver.json", {"state": "done", "running": []})
    assert shutdown(vm, "TRUE").returncode == 0
    assert gcs.names(f"{vm['run_dir']}/preemptions/") == [] and vm["receiver"].posts == []
