"""A Spot preemption said before the VM goes: the real shutdown script (bootstrap/shutdown.sh), asked by a metadata
server whether the VM is being preempted, runs each registered pipeline's preempted.py as its user; the record
lands in the bucket (a real Cloud Storage emulator) with the last committed step, and the receivers are told."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
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


OWNER = "tpu-rl-owner"  # an account of the test machine's that is not root: the VM's SSH user


@pytest.fixture(scope="session")
def owner() -> pwd.struct_passwd:
    """The VM's user, a real account other than root (the tests run as root, as CI does): the tool must run as it."""
    if os.geteuid() != 0:
        pytest.fail("tests/unit/test_preempted.py runs the VM's shutdown script as root, as the VM does: run as root")
    try:
        return pwd.getpwnam(OWNER)
    except KeyError:  # another worker may make it at the same time: then it exists
        subprocess.run(["useradd", "--system", "--no-create-home", OWNER], capture_output=True)
        return pwd.getpwnam(OWNER)


def give(path: Path, user: pwd.struct_passwd) -> None:
    """`path` and everything below it, the user's."""
    for found in [path, *path.rglob("*")]:
        os.chown(found, user.pw_uid, user.pw_gid, follow_symlinks=False)


@pytest.fixture
def vm(tmp_path, gcs_emulator, monkeypatch, owner):
    """A VM's user with a pipeline running train at step 5 of a run whose checkpoints are in the bucket (steps 2 and
    4 committed, 5 not yet), told to a receiver: its home (in a folder of homes, as /home), state folder and bucket
    folder, all the user's."""
    homes = Path(
        tempfile.mkdtemp(prefix="tpu-rl-homes-")
    )  # not in pytest's folder: root's alone, the user could not enter
    homes.chmod(0o755)
    home = homes / "user"
    home.mkdir(mode=0o750)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.setenv("HOME", str(home))
    run_dir = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/post-train/r1"
    for step in (2, 4):
        gcs.write(f"{run_dir}/checkpoints/actor/{step}/commit_success.txt", b"ok")
    gcs.write(f"{run_dir}/checkpoints/actor/5/model_params/part", b"uncommitted")
    layout = jobrunner.Layout(str(home / "tpu-rl"))
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
    give(home, owner)
    yield {"layout": layout, "run_dir": run_dir, "receiver": receiver, "home": homes, "owner": owner}
    receiver.close()
    shutil.rmtree(homes)


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
    told = Path(vm["layout"].pipeline, "notifications.jsonl")  # written by the tool: as the user, never as root
    assert told.stat().st_uid == vm["owner"].pw_uid


def test_any_other_stop_records_nothing_and_tells_no_one(vm):
    done = shutdown(vm, "FALSE")  # autostop, pulumi destroy, a user's shutdown
    assert done.returncode == 0, done.stderr
    assert gcs.names(f"{vm['run_dir']}/preemptions/") == [] and vm["receiver"].posts == []


def test_a_vm_with_no_pipeline_running_records_nothing(vm):
    jobrunner.write_json(f"{vm['layout'].pipeline}/driver.json", {"state": "done", "running": []})
    assert shutdown(vm, "TRUE").returncode == 0
    assert gcs.names(f"{vm['run_dir']}/preemptions/") == [] and vm["receiver"].posts == []


OTHER = "tpu-rl-other"  # another account of the VM: one that could make a folder in /dev/shm or /tmp first


def account(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", name], capture_output=True)
        return pwd.getpwnam(name)


def nothing_recorded(vm: dict, done: subprocess.CompletedProcess, said: str) -> None:
    assert done.returncode == 0, done.stderr
    assert said in done.stderr, done.stderr
    assert gcs.names(f"{vm['run_dir']}/preemptions/") == [] and vm["receiver"].posts == []


def test_a_linked_registry_is_skipped(vm):
    registry = Path(os.path.expanduser(preempted.REGISTRY))
    real = registry.with_name("elsewhere")
    registry.rename(real)
    registry.symlink_to(real)
    nothing_recorded(vm, shutdown(vm, "TRUE"), f"skipped {registry}: {registry} is a link")


def test_a_registry_not_its_homes_owners_is_skipped(vm):
    registry = Path(os.path.expanduser(preempted.REGISTRY))
    other = account(OTHER)
    os.chown(registry, other.pw_uid, other.pw_gid)  # the home is the VM user's: the registry is someone else's
    nothing_recorded(vm, shutdown(vm, "TRUE"), f"skipped {registry}: {registry} belongs to uid {other.pw_uid}")


def test_a_registry_in_roots_home_is_never_run_as_root(vm):
    home = Path(os.path.expanduser("~"))
    give(home, pwd.getpwnam("root"))
    nothing_recorded(vm, shutdown(vm, "TRUE"), "skipped")


def remade_by_another_account(vm: dict) -> str:
    """After a restart emptied /dev/shm, another account made the state folder again, with a tool of its own."""
    state = Path(vm["layout"].root)
    give(state, account(OTHER))
    return f"skipped {state}: {state} belongs to uid {account(OTHER).pw_uid}"


def writable_by_others(vm: dict) -> str:
    Path(vm["layout"].bin).chmod(0o777)
    return f"skipped {vm['layout'].root}: {vm['layout'].bin} may be written by others (mode 777)"


def tool_another_accounts(vm: dict) -> str:
    tool = Path(vm["layout"].bin, "preempted.py")
    os.chown(tool, account(OTHER).pw_uid, account(OTHER).pw_gid)
    return f"skipped {vm['layout'].root}: {tool} belongs to uid {account(OTHER).pw_uid}"


def linked_bin(vm: dict) -> str:
    bin_dir = Path(vm["layout"].bin)
    bin_dir.rename(bin_dir.with_name("real-bin"))
    bin_dir.symlink_to(bin_dir.with_name("real-bin"))
    return f"skipped {vm['layout'].root}: {bin_dir} is a link"


def a_folder_above_writable(vm: dict) -> str:
    home = Path(os.path.expanduser("~"))
    home.chmod(0o777)  # not a shared root (no sticky bit, not root's): anyone could replace the state folder
    return f"skipped {preempted.REGISTRY.replace('~', str(home))}: {home} may be written by others (mode 777)"


@pytest.mark.parametrize(
    "unsafe",
    [remade_by_another_account, writable_by_others, tool_another_accounts, linked_bin, a_folder_above_writable],
)
def test_root_runs_no_tool_that_is_not_its_owners_alone(vm, unsafe):
    """The shutdown script runs as root: a state folder another account made or may change is skipped, and said."""
    why = unsafe(vm)
    nothing_recorded(vm, shutdown(vm, "TRUE"), why)


def test_a_state_folder_in_a_shared_root_of_its_own_is_run(vm, owner):
    """/dev/shm and /tmp are root's with the sticky bit: a state folder the user made there is the user's alone."""
    shared = Path(tempfile.mkdtemp(prefix="tpu-rl-shm-"))  # as /dev/shm: root's, anyone may write, sticky
    shared.chmod(0o1777)
    try:
        state = shared / "tpu-rl"
        shutil.copytree(vm["layout"].root, state)
        give(state, owner)
        Path(os.path.expanduser(preempted.REGISTRY)).write_text(f"{state}\n")
        done = shutdown(vm, "TRUE")
        assert done.returncode == 0 and "skipped" not in done.stderr, done.stderr
        (name,) = gcs.names(f"{vm['run_dir']}/preemptions/")
        assert json.loads(gcs.read(name))["committed_step"] == 4
    finally:
        shutil.rmtree(shared)
