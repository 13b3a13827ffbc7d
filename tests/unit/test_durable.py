"""The converted model and checkpoints in the bucket: what the VM's runner sees there, and what it restores.

Against a real Cloud Storage emulator (tests/gcsemulator.py), with objects laid out as
MaxText's Orbax writes them to a bucket: a step's files, then its commit_success.txt.
"""

from __future__ import annotations

import json
import threading
import types
import urllib.error
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bootstrap.jobs import load
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from bootstrap.remote import gcs, jobrunner, jobset_state, preflight, retry
from bootstrap.results.publish import durable_overrides
from tests import gcsemulator


@pytest.fixture
def bucket(gcs_emulator, monkeypatch) -> str:
    """A fresh prefix in the emulator's bucket."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    return f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}"


def put(url: str, *names: str) -> None:
    for name in names:
        gcs.write(f"{url}/{name}", b"x")


def test_a_glob_matches_objects_and_folders_segment_by_segment(bucket):
    actor = f"{bucket}/r1/checkpoints/actor"
    put(actor, "2/model_params/manifest.ocdbt", "4/model_params/d/x", "4/optimizer_state/x", "40x/model_params/y")
    assert jobrunner.matches(f"{actor}/*/model_params") == [
        f"{actor}/2/model_params",
        f"{actor}/4/model_params",
        f"{actor}/40x/model_params",
    ]
    assert jobrunner.matches(f"{actor}/?/model_params") == [f"{actor}/2/model_params", f"{actor}/4/model_params"]
    assert jobrunner.matches(f"{bucket}/r1/*/model_params") == []  # * stays within one folder
    put(bucket, "a/c/x", "abc/x")
    assert jobrunner.matches(f"{bucket}/a?c") == [f"{bucket}/abc"] == jobrunner.matches(f"{bucket}/a[bx]c")
    assert jobrunner.missing_outputs([f"{actor}/*/model_params", f"{actor}/*/nothing"]) == [f"{actor}/*/nothing"]


def test_the_latest_step_in_a_bucket_is_the_last_committed_one(bucket):
    actor = f"{bucket}/actor"
    put(actor, "2/model_params/x", "2/commit_success.txt", "3/model_params/x", "3/commit_success.txt")
    put(actor, "4/model_params/x")  # being written when the VM was lost: no commit_success.txt yet
    assert jobrunner.latest_step(actor) == "3"
    assert jobrunner.resolve_runtime(f"{actor}/${{latest_step:{actor}}}/model_params") == f"{actor}/3/model_params"
    with pytest.raises(LookupError, match="no checkpoint step under"):
        jobrunner.latest_step(f"{bucket}/empty")
    # the gke driver's export JobSet (its $ escaped for the kubelet), from the same bucket: the same committed step, never 4
    pod = {"containers": [{"command": ["python3", f"load_parameters_path={actor}/$${{latest_step:{actor}}}/x"]}]}
    manifest = {"metadata": {"name": "export", "annotations": {}},
                "spec": {"replicatedJobs": [{"template": {"spec": {"template": {"spec": pod}}}}]}}  # fmt: skip
    created = jobset_state.to_create(manifest, types.SimpleNamespace(names=gcs.names))
    (container,) = created["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][1] == f"load_parameters_path={actor}/3/x"


@pytest.mark.parametrize(("lifetime", "fetches"), [(3600, 1), (200, 2)])
def test_the_vms_token_is_fetched_again_near_its_end(monkeypatch, lifetime, fetches):
    """A runner lives as long as its job (hours): the metadata server's token, an hour long, is renewed."""
    asked = []

    class Metadata(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            asked.append((self.path, self.headers["Metadata-Flavor"]))
            body = json.dumps({"access_token": f"t{len(asked)}", "expires_in": lifetime}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(gcs, "_token", ("", 0.0))
    headers = [gcs._headers(), gcs._headers()]
    server.shutdown()
    assert len(asked) == fetches and asked[0] == (gcs.TOKEN_PATH, "Google")
    assert headers[-1] == {"Authorization": f"Bearer t{fetches}"}


def test_a_busy_bucket_is_asked_again_and_a_refusal_is_not(monkeypatch):
    """Cloud Storage's advice: retry 429 and 5xx with backoff; a 404 or 403 is the answer."""
    answers = [503, 429, 200, 404]
    asked = []

    class Busy(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            asked.append(self.path)
            code = answers.pop(0)
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(retry.time, "sleep", lambda seconds: None)
    assert gcs.read("gs://b/o") == b"ok" and len(asked) == 3
    assert gcs.read("gs://b/o") is None and len(asked) == 4  # 404: no object, asked once
    server.shutdown()


def test_a_storage_outage_of_minutes_is_waited_out_and_a_longer_one_is_the_error(monkeypatch):
    """The VM's runner and driver ride out what the gke driver rides out (retry.py): ten 503s in a row (a
    minute and a half of backoff; the old client gave up after two retries, 3 s) are waited out; past
    RETRY_SECONDS of them, the 503 is the error."""
    clock = [0.0]
    monkeypatch.setattr(retry.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    monkeypatch.setattr(retry.time, "monotonic", lambda: clock[0])
    answers = [503] * 10 + [200]
    server = _answering(answers)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_address[1]}")
    assert gcs.read("gs://b/o") == b"ok" and not answers
    answers += [503] * 1000
    clock[0] = 0.0
    with pytest.raises(urllib.error.HTTPError, match="503"):
        gcs.read("gs://b/o")
    assert retry.RETRY_SECONDS < clock[0] < retry.RETRY_SECONDS + 2 * retry.MAX_BACKOFF_SECONDS
    clock[0] = 0.0
    with gcs.quick(), pytest.raises(urllib.error.HTTPError, match="503"):  # fab's own reads: within its timeout
        gcs.read("gs://b/o")
    assert gcs.QUICK_SECONDS < clock[0] < gcs.QUICK_SECONDS + 2 * retry.MAX_BACKOFF_SECONDS < 120
    server.shutdown()


def _answering(answers: list[int]) -> ThreadingHTTPServer:
    """A bucket endpoint answering each request with the next code of `answers` (and b"ok")."""

    class Answers(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(answers.pop(0))
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def spec(bucket: str, record: str) -> dict:
    return {"name": "convert", "argv": ["true"], "env": {}, "outputs": [f"{bucket}/mt/0/items"], "record": record}


def test_a_job_recorded_done_in_the_bucket_is_restored_on_a_new_vm_with_its_outputs_verified(bucket, tmp_path):
    record = f"{bucket}/tpu-rl/shared/convert-k.json"
    put(bucket, "mt/0/items/manifest.ocdbt")
    gcs.write(record, json.dumps({"finished": 1.0, "outputs": [f"{bucket}/mt/0/items"], "inputs": "h"}).encode())
    state = jobrunner.job_state(str(tmp_path / "convert"), spec(bucket, record))
    assert state["state"] == "done" and state["restored_from"] == record and state["finished"] == 1.0
    assert jobrunner.job_state(str(tmp_path / "convert"))["state"] == "done"  # kept on this VM from now on


@pytest.mark.parametrize("what", ["no record", "no outputs"])
def test_without_its_record_or_its_outputs_a_job_is_not_taken_as_done(bucket, tmp_path, what):
    record = f"{bucket}/tpu-rl/shared/convert-k.json"
    if what == "no outputs":
        gcs.write(record, json.dumps({"finished": 1.0, "outputs": [], "inputs": "h"}).encode())
    else:
        put(bucket, "mt/0/items/manifest.ocdbt")
    state = jobrunner.job_state(str(tmp_path / "convert"), spec(bucket, record))
    assert state["state"] == "pending" and not (tmp_path / "convert").exists()


def test_a_job_writes_its_record_only_after_its_outputs_were_verified_in_the_bucket(bucket, tmp_path):
    record = f"{bucket}/tpu-rl/runs/r1/train.json"
    job_dir = tmp_path / "train"
    job_dir.mkdir()
    for made in (False, True):
        command = ["python3", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); from bootstrap.remote import gcs; "
                   f"gcs.write({bucket!r} + '/out/x', b'1')"] if made else ["true"]  # fmt: skip
        outputs = [f"{bucket}/out"]
        (job_dir / "spec.json").write_text(json.dumps({**spec(bucket, record), "argv": command, "outputs": outputs}))
        jobrunner._Job(str(job_dir)).run()
        state = jobrunner.job_state(str(job_dir))
        assert state["state"] == ("done" if made else "failed")
        assert (gcs.read(record) is not None) is made
    assert json.loads(gcs.read(record))["outputs"] == [f"{bucket}/out"]


def test_results_gcs_puts_the_durable_folder_in_the_bucket_and_records_only_its_jobs():
    files = load.read(REPO / "jobs")
    spec_ = load.resolve(files).spec.model_copy(
        update={"results": load.resolve(files).spec.results.model_copy(update={"gcs": "gs://b/p/"})}
    )
    overrides = durable_overrides(spec_, None)
    assert overrides == ["vars.durable_dir=gs://b/p/${model_name}"]
    plan = build(files, overrides, "r1")
    durable = "gs://b/p/llama3.1-8b-Instruct"
    records = {job.name: job.runner_spec.get("record") for job in plan.jobs}
    convert = plan.job("convert")
    assert records == {
        "setup": None,
        "validate": None,
        "prefetch": None,  # the Hugging Face cache: on the VM
        "convert": f"{durable}/tpu-rl/shared/{convert.job_dir.rsplit('/', 1)[1]}.json",
        "train": f"{durable}/tpu-rl/runs/r1/train.json",
        "export": None,  # /dev/shm, copied by the durable copy jobs
    }
    assert convert.runner_spec["outputs"] == [f"{durable}/mt-format/{convert.rendered.key}/0/items"]
    assert (
        build(files, [*overrides, "vars.durable_dir=/dev/shm/mine"], "r1").job("train").runner_spec.get("record")
        is None
    )
    assert durable_overrides(load.resolve(files).spec, None) == []  # results.gcs unset: all of it in /dev/shm


def test_the_preflight_checks_the_vm_may_use_the_bucket_as_maxtext_will(bucket, tmp_path):
    """Before the first TPU job, in seconds: the bucket's metadata (MaxText's get_bucket), a write, a read."""
    request = {"chips": 0, "chip_glob": str(tmp_path / "none*"), "min_memory_gb": 0, "min_shm_gb": 0}
    request |= {"shm_path": str(tmp_path), "libtpu_lockfile": str(tmp_path / "lock")}
    ok = {c["check"]: c for c in preflight.checks({**request, "bucket": f"{bucket}/m"})}["bucket"]
    assert ok == {"check": "bucket", "ok": True, "message": f"the VM may read and write {bucket}/m"}
    missing = {c["check"]: c for c in preflight.checks({**request, "bucket": "gs://no-such-bucket-here/m"})}
    assert missing["bucket"]["ok"] is False
    assert missing["bucket"]["message"].startswith("the VM cannot use gs://no-such-bucket-here/m (HTTP 404")
    assert "roles/storage.objectAdmin and roles/storage.legacyBucketReader" in missing["bucket"]["message"]


def test_copy_down_copies_a_folder_of_the_bucket_without_its_placeholders_and_again_what_grew(bucket, tmp_path):
    events = f"{bucket}/post-train/r1/tensorboard"
    gcs.write(f"{events}/events.out.tfevents.1.vm", b"first")
    gcs.write(f"{events}/sub/events.out.tfevents.2.vm", b"second")
    gcs.write(f"{events}/", b"-")  # the folder's placeholder, as TensorFlow's gfile makes one (empty there)
    target = tmp_path / "copy"
    assert gcs.copy_down(events, str(target)) == 2
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "copy/events.out.tfevents.1.vm",
        "copy/sub/events.out.tfevents.2.vm",
    ]
    gcs.write(f"{events}/events.out.tfevents.1.vm", b"first, grown")
    (target / "stale").write_bytes(b"an object deleted since")
    assert gcs.copy_down(events, str(target)) == 1  # only what changed in size
    assert (target / "events.out.tfevents.1.vm").read_bytes() == b"first, grown"
    assert not (target / "stale").exists()


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "/etc/passwd", "", "sub/", "a\nb"])
def test_an_object_name_that_would_land_outside_the_copy_or_is_a_folder_is_not_copied(name, tmp_path):
    """The emulator refuses such names; Cloud Storage takes any but `.` and `..` alone."""
    assert gcs.local_target(str(tmp_path / "copy"), name) is None
    assert gcs.local_target(str(tmp_path / "copy"), "a/./b") == str(tmp_path / "copy" / "a" / "b")
