"""Keep the exported model: the VM's /dev/shm is lost on restart, and the VM on maintenance.

Each durable copy is one more detached, resumable job on the VM (see pipeline_run.Stage),
so it survives a dropped connection and is marked done only after it was verified.
"""

from __future__ import annotations

import os
import shlex

from . import hosts, hub
from .errors import UserError
from .jobs import RenderedJob
from .pipeline_run import Session, Stage

DATASET = "openai/gsm8k"


def _arg(job: RenderedJob, key: str, default: str = "") -> str:
    prefix = f"{key}="
    return next((a[len(prefix) :] for a in job.argv if a.startswith(prefix)), default)


def model_card(session: Session, base_model: str | None) -> str:
    """A Hub model card: base model, algorithm, steps, dataset and the eval numbers."""
    jobs = session.rendered(session.workers[0])
    train = jobs["train"]
    algorithm = _arg(train, "rl.loss_algo", "grpo").upper()
    steps = _arg(train, "num_batches", "?")
    rows = "\n".join(
        f"| {({'pre': 'before training', 'post': 'after training'}).get(e['phase'], 'step ' + str(e['step']))} "
        f"| {e['accuracy']:.2f} | {e['format_accuracy']:.2f} | {e['partial_accuracy']:.2f} | {e['mean_reward']:.3f} |"
        for e in session.run.evals
    )
    return f"""---
base_model: {base_model or _arg(train, "model_name")}
datasets:
- {DATASET}
library_name: transformers
tags:
- maxtext
- {algorithm.lower()}
- reinforcement-learning
---

# {base_model or _arg(train, "model_name")}, post-trained with {algorithm} on GSM8K

Trained with MaxText on a Cloud TPU v6e-8 by tpu-rl: run `{session.run.name}`,
{algorithm} for {steps} batches of `{DATASET}` (config `main`), checkpoint exported back to Hugging Face format.

| GSM8K eval | accuracy % | format accuracy % | partial accuracy % | mean reward |
|---|---|---|---|---|
{rows or "| (no eval results recorded) | | | | |"}
"""


def hub_stage(session: Session, folder: str, python: str, card: str) -> Stage:
    results = session.spec.results
    job_dir = f"{session.state_dir}/runs/{session.run.name}/publish-hub-{results.hub_repo.replace('/', '--')}"
    marker = f"{job_dir}/published.json"
    argv = [
        python,
        f"{session.state_dir}/bin/hub_upload.py",
        folder,
        results.hub_repo,
        "--card",
        f"{job_dir}/card.md",
        "--marker",
        marker,
    ]
    env = {
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **({"HF_ENDPOINT": os.environ["HF_ENDPOINT"]} if os.environ.get("HF_ENDPOINT") else {}),
    }
    spec = {
        "module": "hub_upload",
        "argv": argv + (["--private"] if results.hub_private else []),
        "env": env,
        "secrets": ["HF_TOKEN"],
        "secrets_dir": f"{session.state_dir}/secrets",
        "outputs": [marker],
        "cwd": "~",
    }
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    stage = Stage(session, "publish-hub", job_dir, [spec], target=f"{endpoint}/{results.hub_repo}")

    def write_card() -> None:
        worker = session.workers[0]
        worker.check(f"mkdir -p {shlex.quote(job_dir)}", "preparing the upload")
        worker.put_text(f"{job_dir}/card.md", card)

    stage.before_start = write_card
    return stage


def gcs_url(session: Session) -> str:
    target = session.spec.results.gcs
    if target == "stack":
        bucket = hosts.stack_outputs().get("bucket")
        if not bucket:
            raise UserError(
                "results.gcs is 'stack' but the stack has no bucket: set tpu-rl:resultsBucket and run pulumi up"
            )
        target = f"gs://{bucket}"
    return f"{target.rstrip('/')}/{session.run.name}"


def gcs_stage(session: Session, folder: str, url: str) -> Stage:
    job_dir = f"{session.state_dir}/runs/{session.run.name}/publish-gcs"
    marker = f"{job_dir}/copied.json"
    argv = ["python3", f"{session.state_dir}/bin/gcs_upload.py", folder, url, "--marker", marker]
    spec = {"module": "gcs_upload", "argv": argv, "env": {}, "secrets": [], "outputs": [marker], "cwd": "~"}
    return Stage(session, "publish-gcs", job_dir, [spec], target=url)


def publish_after_train(session: Session) -> None:
    """Run the configured durable copies (on worker 0, which holds the export), or warn plainly."""
    results = session.spec.results
    jobs = session.rendered(session.workers[0])
    export = jobs["export"]
    base_model = hub.base_model(_arg(jobs["train"], "model_name"))
    folder = os.path.dirname(export.outputs[0])
    stages = []
    if results.hub_repo:
        stages.append(hub_stage(session, folder, export.argv[0], model_card(session, base_model)))
    if results.gcs:
        stages.append(gcs_stage(session, folder, gcs_url(session)))
    if not stages:
        session.console.print(
            f"[bold yellow]The trained model lives only in the VM's memory[/] ({folder}) and is lost when the VM "
            "restarts or is deleted.\nKeep it: set results.hub_repo (Hugging Face Hub) or results.gcs in "
            "jobs/pipeline.yaml and run fab train again, or copy it here with fab download."
        )
        return
    for stage in stages:
        stage.run(stage.before_start)
        session.run.results[stage.name] = stage.target
        session.run.save()
        session.console.print(f"model kept at {stage.target} (verified)")
