"""`fab train`, `status` and `logs` on a gke stack, against a stand-in of the Kubernetes and Cloud Storage APIs.

The real `fab` with the official clients; tests/kubestub.py plays the cluster. The pods
print the real jobs' log lines (tests/fixtures/logs, from the real CPU run), so progress
is parsed as on the VM.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time

import pytest
import yaml
from google.api_core.exceptions import Conflict

from bootstrap.gke import jobsets
from bootstrap.gke.jobsets import name_of as js
from bootstrap.remote import eval_recorder, manifest
from tests import fabfork, gcsemulator, hubstub, kubestub, tbevents
from tests.kubestub import Run
from tests.loopback import REPO

LOGS = REPO / "tests" / "fixtures" / "logs"
IMAGE = "us-docker.pkg.dev/my-project/tpu-rl/maxtext:0.2.3"
OUTPUTS = {
    "backend": "gke",
    "cluster_name": "tpu-rl",
    "project": "my-project",
    "zone": "us-east5-b",
    "topology": "4x4",
    "bucket": "my-results",
    "namespace": "tpu-rl",
    "queue": "multislice-queue",
}


def log(name: str) -> list[str]:
    return (LOGS / f"{name}.log").read_text().splitlines()


@pytest.fixture
def cluster(gcs_emulator):
    kube, servers = kubestub.serve()
    kube.storage, kube.storage_url = gcsemulator.client(gcs_emulator), gcs_emulator
    with contextlib.suppress(Conflict):
        kube.storage.create_bucket(OUTPUTS["bucket"])
    hub, hub_server = hubstub.serve()
    yield kube, hub
    for server in (*servers, hub_server):
        server.shutdown()


@pytest.fixture
def fab(cluster, tmp_path, gcs_emulator):
    kube, hub = cluster
    token = "hf_gke" + "x" * 30
    hub.tokens[token] = hubstub.Token()
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    pipeline = jobs / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace('  image: ""', f"  image: {IMAGE}"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(OUTPUTS)}\nEOF\n")
    (bin_dir / "pulumi").chmod(0o755)
    context = "gke_my-project_us-east5-b_tpu-rl"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": kube.url}}],
        "users": [{"name": context, "user": {"token": "stand-in"}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(tmp_path / "kubeconfig"),
        "STORAGE_EMULATOR_HOST": gcs_emulator,
        "TPU_RL_GKE_POLL_SECONDS": kubestub.POLL_SECONDS,  # the stand-in cluster answers at once
        "TPU_RL_JOBS": str(jobs),
        "TPU_RL_RUNS": str(tmp_path / "runs"),
        "HF_TOKEN": token,
        "HF_ENDPOINT": hub.url,
        "COLUMNS": "200",
    }

    command = [fabfork.FAB, "-r", str(REPO)]

    def run(*args: str) -> subprocess.CompletedProcess:
        return fabfork.run(
            [*command, *args], env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )

    def popen(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [*command, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )

    run.kube, run.hub, run.token, run.popen = kube, hub, token, popen
    return run


def script(kube, train: list[Run] | None = None) -> None:
    kube.scripts.update(
        convert=[Run(log("convert"), "complete")],
        train=train or [Run(log("train"), "complete")],
        export=[Run(log("export"), "complete")],
        pipeline=[Run([], "exec")],  # the driver in the cluster: gke_driver.py, really run
    )


def test_a_run_goes_through_pod_restart_and_lost_watch_then_is_a_no_op(fab):
    lines = log("train")
    script(fab.kube, [Run(lines[:150], "restart"), Run(lines[150:160], "drop"), Run(lines, "complete")])
    result = fab("train", "--run-name", "r1")
    assert result.returncode == 0, result.stdout + result.stderr
    driver = jobsets.driver_name("r1")
    assert fab.kube.created == [driver, js("convert", "r1"), js("train", "r1"), js("export", "r1")]  # once each
    assert (
        fab.kube.pods[js("train", "r1")] == 2 and not fab.kube.runs[js("train", "r1")]
    )  # restarted pod, dropped watch: followed on
    assert "training steps" in result.stdout and "model kept at gs://my-results/llama3.1-8b-Instruct/hf-trained/r1" in (
        result.stdout
    )
    export = fab.kube.jobsets[js("export", "r1")]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    script_text = export["containers"][0]["command"][2]
    assert (
        "load_parameters_path=gs://my-results/llama3.1-8b-Instruct/post-train/r1/checkpoints/actor/4/model_params"
        in (script_text)
    )  # ${latest_step:...} looked up in the bucket
    assert "/tpu-rl/tools/manifest.py /gcs/llama3.1-8b-Instruct/hf-trained/r1" in script_text
    secret = fab.kube.secrets["tpu-rl-hf-token"]
    assert secret["stringData"] == {"HF_TOKEN": fab.token}
    assert fab.token not in json.dumps(fab.kube.jobsets)  # only the Secret holds it
    tools = fab.kube.config_maps["tpu-rl-tools"]["data"]
    assert tools == {name: (REPO / "bootstrap" / "remote" / name).read_text() for name in jobsets.TOOLS}

    again = fab("train", "--run-name", "r1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("done already") == 3 and fab.kube.created[4:] == [driver]  # a new pass, no job

    status = fab("status", "--run-name", "r1")
    assert status.returncode == 0 and status.stdout.count("done") >= 3
    logs = fab("logs", "--job", "train", "--run-name", "r1")
    assert logs.returncode == 0 and "last line" in logs.stdout
    export = fab("export", "--run-name", "r1")
    assert export.returncode == 0 and "export: done already" in export.stdout, export.stdout + export.stderr


def test_download_and_metrics_read_the_bucket(fab, tmp_path):
    """The export, verified by its SHA256SUMS, and the TensorBoard events, straight from the bucket."""
    script(fab.kube)
    assert fab("train", "--run-name", "r4").returncode == 0
    download = fab("download", "--run-name", "r4")
    assert download.returncode == 0, download.stderr
    model = tmp_path / "runs" / "r4" / "model"
    export = "gs://my-results/llama3.1-8b-Instruct/hf-trained/r4"
    assert (model / "config.json").read_text() == f"{export}/config.json\n"  # what the export pod wrote there
    assert sorted(p.name for p in model.iterdir()) == sorted(
        ["SHA256SUMS", "config.json", "generation_config.json", "4.safetensors"]
    )
    bucket = fab.kube.storage.bucket("my-results")
    bucket.blob("llama3.1-8b-Instruct/hf-trained/r4/config.json").upload_from_string(b"damaged\n")
    (model / "config.json").unlink()
    damaged = fab("download", "--run-name", "r4")
    assert damaged.returncode == 2 and "config.json: SHA-256 of the copy differs from" in damaged.stderr
    assert not (model / "config.json").exists()  # nothing unverified is kept

    steps = [tbevents.scalar_event(step, "actor/train/loss", step / 4) for step in (1, 2, 3, 4)]
    events = tbevents.write(tmp_path / "pod-tensorboard", steps)  # as train's pod writes them into the bucket
    bucket.blob(f"llama3.1-8b-Instruct/post-train/r4/tensorboard/{events.name}").upload_from_filename(str(events))
    metrics = fab("metrics", "--run-name", "r4")
    assert metrics.returncode == 0, metrics.stderr
    served = fab("tensorboard", "--run-name", "r4")  # the vm backend's live copy: on gke, one line, nothing served
    assert served.returncode == 2 and "fab tensorboard reads the vm backend's VM; on gke" in served.stderr
    assert "copying event files from gs://my-results/llama3.1-8b-Instruct/post-train/r4/tensorboard" in metrics.stdout
    assert (tmp_path / "runs" / "r4" / "metrics.csv").read_text().splitlines()[1:] == [
        "1,0.25",
        "2,0.5",
        "3,0.75",
        "4,1.0",
    ]


def test_a_failed_jobset_is_reported_then_replaced_on_retry(fab):
    script(fab.kube, [Run(log("train")[:150], "fail")])
    failed = fab("train", "--run-name", "r2")
    assert failed.returncode == 2
    assert "train failed on gke_my-project_us-east5-b_tpu-rl: a pod failed" in failed.stderr
    assert "fab logs --job train --run-name r2" in failed.stderr
    fab.kube.scripts["train"] = [Run(log("train"), "complete")]
    retried = fab("train", "--run-name", "r2")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "train: last attempt failed (a pod failed), retrying" in retried.stdout
    assert fab.kube.deleted == [jobsets.driver_name("r2"), js("train", "r2")]  # the ended driver, the failed train
    assert fab.kube.created.count(js("train", "r2")) == 2


def test_a_jobset_completed_without_its_outputs_is_not_done(fab):
    script(fab.kube)
    for blob in fab.kube.storage.list_blobs("my-results"):  # the converted model is shared by runs: none yet
        blob.delete()
    fab.kube.without_outputs.add("convert")
    result = fab("train", "--run-name", "r3")
    assert result.returncode == 2
    assert "convert failed" in result.stderr and "it completed without gs://my-results/" in result.stderr


def test_a_missing_kubeconfig_context_is_one_line(fab, tmp_path):
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "contexts": []}))
    script(fab.kube)
    result = fab("status")
    assert result.returncode == 2
    assert "no kubeconfig context gke_my-project_us-east5-b_tpu-rl: run gcloud container clusters get-credentials" in (
        result.stderr
    )


def test_the_hub_upload_runs_in_the_cluster_after_export_and_sends_the_exported_model(fab, tmp_path):
    """The publish-hub JobSet really runs hub_upload.py (the stub runs its container's command on the bucket),
    so what reaches the Hub is what export left in the bucket, verified by its SHA256SUMS."""
    repo = "tester/grpo-gke"
    pipeline = tmp_path / "jobs" / "pipeline.yaml"
    spec = yaml.safe_load(pipeline.read_text())
    spec["results"].update(hub_repo=repo, publish_if="always")  # train's log is not kept on gke: no evals
    pipeline.write_text(yaml.safe_dump(spec, sort_keys=False))
    script(fab.kube)
    fab.kube.scripts["publish-hub"] = [Run([], "exec")]
    result = fab("train", "--run-name", "r5")
    assert result.returncode == 0, result.stdout + result.stderr
    assert fab.kube.created[-1] == js(f"publish-hub{repo}", "r5")  # after export, and only once
    assert f"HF_TOKEN: can write {repo}" in result.stdout and "[publish-hub] [tpu-rl] uploaded" in result.stdout
    assert f"model kept at {fab.hub.url}/{repo} (verified)" in result.stdout
    bucket = fab.kube.storage.bucket("my-results")
    export = "llama3.1-8b-Instruct/hf-trained/r5/"
    exported = {b.name.removeprefix(export): b.download_as_bytes() for b in bucket.list_blobs(prefix=export)}
    files = dict(fab.hub.repos[repo])
    card = files.pop("README.md").decode()
    assert files == exported and len(files) == 4
    assert fab.hub.private[repo] is True
    assert "GRPO for " in card and "| (no eval results recorded) |" in card
    assert fab.token not in json.dumps(fab.kube.jobsets)  # the pod read it from the Secret
    marker = json.loads(bucket.blob("published/r5/hub-tester--grpo-gke.json").download_as_text())
    assert marker["files"] == 5 and marker["repo"] == repo

    again = fab("train", "--run-name", "r5")
    assert again.returncode == 0 and "publish-hub: done already" in again.stdout, again.stdout + again.stderr
    assert fab.kube.created.count(js(f"publish-hub{repo}", "r5")) == 1

    exported["config.json"] = b'{"made": "again"}\n'  # the export made again: another SHA256SUMS
    bucket.blob(f"{export}config.json").upload_from_string(exported["config.json"])
    sums = manifest.render(
        {name: hashlib.sha256(data).hexdigest() for name, data in exported.items() if name != "SHA256SUMS"}
    )
    bucket.blob(f"{export}SHA256SUMS").upload_from_string(sums)
    redone = fab("train", "--run-name", "r5")
    assert redone.returncode == 0, redone.stdout + redone.stderr
    assert "publish-hub: was done for inputs that have changed since" in redone.stdout
    assert fab.hub.repos[repo]["config.json"] == exported["config.json"]  # the Hub has the new export
    assert fab.hub.repos[repo]["SHA256SUMS"] == sums.encode()


def wait_until(condition, what: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.2)


def with_hub_repo(tmp_path, repo: str) -> None:
    pipeline = tmp_path / "jobs" / "pipeline.yaml"
    spec = yaml.safe_load(pipeline.read_text())
    spec["results"].update(hub_repo=repo, publish_if="always")  # train's log is not kept on gke: no evals
    pipeline.write_text(yaml.safe_dump(spec, sort_keys=False))


def test_detach_hands_the_pipeline_to_a_driver_in_the_cluster_that_finishes_it_with_fab_gone(fab, tmp_path):
    """fab train --detach returns once the driver's JobSet exists. The stand-in then really runs its command,
    gke_driver.py, as a cluster would with no one watching: over HTTPS with its service account's token, held
    to the Role infra/gke.py declares, and Cloud Storage (the emulator). The driver alone creates convert, train,
    export and the Hub upload, each once its needs are done, and the Hub ends up with what export left."""
    repo = "tester/grpo-unattended"
    with_hub_repo(tmp_path, repo)
    fab.kube.autoplay |= {"convert", "train", "export", "publish-hub"}  # pods run by themselves; no fab follows
    script(fab.kube)
    fab.kube.scripts.update(pipeline=[Run([], "exec")], **{"publish-hub": [Run([], "exec")]})
    detached = fab("train", "--run-name", "r6", "--detach")
    assert detached.returncode == 0, detached.stdout + detached.stderr
    driver = jobsets.driver_name("r6")
    assert f"pipeline started in the cluster, driven by the JobSet tpu-rl/{driver}" in detached.stdout
    assert fab.kube.created[0] == driver

    wait_until(lambda: fab.kube.jobsets[driver].get("status"), "the driver's pod ended")
    events = [json.loads(line) for line in fab.kube.logs[driver].decode().splitlines()]
    assert events[-1]["event"] == "finished" and events[-1]["state"] == "done", events
    assert fab.kube.jobsets[driver]["status"]["conditions"][0]["type"] == "Completed"
    jobs = [js("convert", "r6"), js("train", "r6"), js("export", "r6"), js(f"publish-hub{repo}", "r6")]
    assert fab.kube.created == [driver, *jobs]  # in order, once each
    creates = [(token, path) for token, verb, path in fab.kube.requests if verb == "create"]
    assert len(creates) == 4 and {token for token, _ in creates} == {fab.kube.token_of("tpu-rl-driver")}
    assert all(fab.kube.allowed(*request) for request in fab.kube.requests)  # nothing beyond its Role was needed
    export = fab.kube.jobsets[js("export", "r6")]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert "post-train/r6/checkpoints/actor/4/model_params" in export["spec"]["containers"][0]["command"][2]
    bucket = fab.kube.storage.bucket("my-results")
    prefix = "llama3.1-8b-Instruct/hf-trained/r6/"
    exported = {b.name.removeprefix(prefix): b.download_as_bytes() for b in bucket.list_blobs(prefix=prefix)}
    uploaded = dict(fab.hub.repos[repo])
    uploaded.pop("README.md")
    assert uploaded == exported and len(exported) == 4
    assert fab.token not in json.dumps(fab.kube.jobsets)  # the driver's plan names the Secret, never the token

    again = fab("train", "--run-name", "r6")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("done already") == 4 and fab.kube.created[5:] == [driver]  # a new pass, no job
    status = fab("status", "--run-name", "r6")
    assert status.returncode == 0 and f"pipeline: done in the cluster by the JobSet tpu-rl/{driver}" in status.stdout


def test_one_driver_per_run_the_same_plan_again_attaches_another_is_refused(fab):
    """While the run's driver runs in the cluster, the same --detach keeps it, and another plan of the run is
    refused, attached or detached, before anything is created."""
    script(fab.kube)
    fab.kube.scripts["pipeline"] = []  # its pod runs on and on
    assert fab("train", "--run-name", "r7", "--detach").returncode == 0
    driver = jobsets.driver_name("r7")
    same = fab("train", "--run-name", "r7", "--detach")
    assert (
        same.returncode == 0
        and f"attached to the pipeline in the cluster: its driver is the JobSet tpu-rl/{driver}" in same.stdout
    )
    for detach in (["--detach"], []):
        other = fab("train", "--run-name", "r7", *detach, "--arg", "train.steps=3")
        assert other.returncode == 2 and f"the driver tpu-rl/{driver} runs another plan of this run" in other.stderr
    assert fab.kube.created == [driver]  # nothing else was started
    status = fab("status", "--run-name", "r7")
    assert f"pipeline: running in the cluster, driven by the JobSet tpu-rl/{driver}" in status.stdout


def test_a_job_failing_in_the_clusters_pipeline_ends_it_and_the_next_detach_retries_it(fab):
    """The driver in the cluster stops at a failed train (export is never created, the driver's pod fails,
    fab status says so); the next fab train --detach replaces the ended driver, whose pass keeps convert
    and retries train, then runs export."""
    fab.kube.autoplay |= {"convert", "train", "export"}
    script(fab.kube, [Run(log("train")[:150], "fail")])
    fab.kube.scripts["pipeline"] = [Run([], "exec")]
    assert fab("train", "--run-name", "r8", "--detach").returncode == 0
    driver = jobsets.driver_name("r8")
    wait_until(lambda: fab.kube.jobsets[driver].get("status"), "the driver's pod ended")
    assert fab.kube.jobsets[driver]["status"]["conditions"][0]["type"] == "Failed"
    events = [json.loads(line) for line in fab.kube.logs[driver].decode().splitlines()]
    assert {"event": "blocked", "job": "export", "needs": "train"} in [{k: e[k] for k in e if k != "t"} for e in events]
    assert fab.kube.created == [driver, js("convert", "r8"), js("train", "r8")]
    status = fab("status", "--run-name", "r8")
    assert f"pipeline: failed in the cluster (the JobSet tpu-rl/{driver}: a pod failed)" in status.stdout

    fab.kube.scripts["train"] = [Run(log("train"), "complete")]
    assert fab("train", "--run-name", "r8", "--detach").returncode == 0
    wait_until(lambda: fab.kube.jobsets.get(driver, {}).get("status"), "the second driver's pod ended")
    assert fab.kube.jobsets[driver]["status"]["conditions"][0]["type"] == "Completed"
    assert fab.kube.deleted == [driver, js("train", "r8")]  # the ended driver, then the failed train
    assert fab.kube.created[3:] == [driver, js("train", "r8"), js("export", "r8")]  # convert kept


def test_a_driver_that_crashed_is_started_again_and_adopts_the_running_train(fab):
    """The driver's pod crashes while train runs (an answer it cannot use: a bug); its Job starts another pod
    (podFailurePolicy: a crash is not the pipeline's failure), whose pass adopts train instead of starting
    it again, then runs export; fab, watching all along, shows it through."""
    fab.kube.autoplay |= {"convert", "train", "export"}
    fab.kube.hold["train"] = threading.Event()  # train runs until released
    script(fab.kube)
    train = js("train", "r9")
    fab.kube.garble[f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/tpu-rl/jobsets/{train}"] = 0
    watching = fab.popen("train", "--run-name", "r9")
    driver = jobsets.driver_name("r9")
    wait_until(lambda: train in fab.kube.jobsets, "train was created")
    fab.kube.garble[f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/tpu-rl/jobsets/{train}"] = 1
    wait_until(lambda: b"train: already running since" in fab.kube.logs[driver], "the new pass adopted train")
    assert fab.kube.pods[driver] == 2  # a second pod of the driver's Job
    fab.kube.hold["train"].set()
    out, err = watching.communicate(timeout=120)
    assert watching.returncode == 0, out + err
    assert "driver: stopped (KeyError: 'metadata'); restarting" in out and "train: already running since" in out, out
    assert fab.kube.created == [driver, js("convert", "r9"), train, js("export", "r9")]  # train once
    assert fab.kube.jobsets[driver]["status"]["conditions"][0]["type"] == "Completed"


def test_fab_killed_while_watching_loses_nothing_the_cluster_runs_the_rest(fab):
    """fab train SIGKILLed during convert (the laptop closed): train and export are still created, once each,
    by the driver in the cluster, and the next fab train finds them done."""
    fab.kube.autoplay |= {"convert", "train", "export"}
    fab.kube.hold["convert"] = threading.Event()
    script(fab.kube)
    watching = fab.popen("train", "--run-name", "r10")
    wait_until(lambda: js("convert", "r10") in fab.kube.jobsets, "convert was created")
    watching.kill()
    watching.communicate(timeout=60)
    assert js("train", "r10") not in fab.kube.created  # fab went while convert still ran
    fab.kube.hold["convert"].set()
    driver = jobsets.driver_name("r10")
    wait_until(lambda: fab.kube.jobsets[driver].get("status"), "the driver's pod ended")
    assert fab.kube.created == [driver, js("convert", "r10"), js("train", "r10"), js("export", "r10")]
    again = fab("train", "--run-name", "r10")
    assert again.returncode == 0 and again.stdout.count("done already") == 3, again.stdout + again.stderr


def test_the_api_lost_while_watching_ends_the_watch_in_one_line_and_the_pipeline_goes_on(fab):
    """fab's way to the API breaks while train runs: fab stops watching with one line saying how to watch
    again (no hang, no traceback), the driver carries on, and the next fab train finds everything done."""
    fab.kube.autoplay |= {"convert", "train", "export"}
    fab.kube.hold["train"] = threading.Event()
    script(fab.kube)
    watching = fab.popen("train", "--run-name", "r11")
    wait_until(lambda: js("train", "r11") in fab.kube.jobsets, "train was created")
    fab.kube.unreachable = True
    out, err = watching.communicate(timeout=120)
    assert watching.returncode == 2, out + err
    assert "the Kubernetes API refused: 503" in err and "the pipeline goes on in the cluster" in err
    assert "Traceback" not in err and "fab train --run-name r11" in err
    fab.kube.unreachable = False
    fab.kube.hold["train"].set()
    driver = jobsets.driver_name("r11")
    wait_until(lambda: fab.kube.jobsets[driver].get("status"), "the driver's pod ended")
    again = fab("train", "--run-name", "r11")
    assert again.returncode == 0 and again.stdout.count("done already") == 3, again.stdout + again.stderr


def test_on_gke_the_hub_job_judges_the_run_from_the_evals_train_recorded_in_the_bucket(
    fab, tmp_path, gcs_emulator, monkeypatch
):
    """train's log goes with its pod, but its launcher records each eval beside the checkpoints, in the bucket:
    the Hub job reads them there. A run with none recorded is held back with that reason (results.publish_if:
    improved, the default), never a silent upload; one whose records show it improved is uploaded."""
    repo = "tester/grpo-gke-gated"
    pipeline = tmp_path / "jobs" / "pipeline.yaml"
    spec = yaml.safe_load(pipeline.read_text())
    spec["results"]["hub_repo"] = repo
    pipeline.write_text(yaml.safe_dump(spec, sort_keys=False))
    script(fab.kube)
    fab.kube.scripts["publish-hub"] = [Run([], "exec")]
    result = fab("train", "--run-name", "r9")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"not uploaded to {repo}: no held-out eval was recorded for this run" in " ".join(result.stdout.split())
    assert repo not in fab.hub.repos

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)  # as train's pod reaches the bucket
    recorder = eval_recorder.EvalRecorder("gs://my-results/llama3.1-8b-Instruct/post-train/r10/evals")
    for phase, correct in (("Pre RL Training", 600), ("Post RL Training", 800)):  # as train_rl logs them
        recorder.read(f"W1203 10:00:00.0 1 train_rl.py:716] {phase}: corr={correct}, total=1319, "
                      f"accuracy={correct / 13.19}%, partial_accuracy=50.0%, format_accuracy=90.0%, mean_reward=1.0")  # fmt: skip
    script(fab.kube)
    fab.kube.scripts["publish-hub"] = [Run([], "exec")]
    better = fab("train", "--run-name", "r10")
    assert better.returncode == 0, better.stdout + better.stderr
    card = fab.hub.repos[repo]["README.md"].decode()
    assert "| before training | 45.49 |" in card and "value: 60.65" in card and "name: tpu-rl run r10" in card


def test_notify_on_a_gke_stack_is_refused_in_one_line_before_its_variables_are_asked_for(fab, tmp_path):
    """The review: results.notify was silently ignored on gke while fab train still demanded its variables."""
    pipeline = tmp_path / "jobs" / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace("  notify: []", "  notify: [TPU_RL_UNSET_HOOK]"))
    script(fab.kube)
    result = fab("train", "--detach")
    assert result.returncode == 2 and not fab.kube.jobsets, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "results.notify: the gke backend tells no receiver yet" in line and "TPU_RL_UNSET_HOOK" not in line
