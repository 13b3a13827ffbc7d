"""Keep the exported model: the VM's /dev/shm is lost on restart, and the VM on maintenance.

Each durable copy is one more detached, resumable job on the VM (see pipeline_run.Stage),
so it survives a dropped connection and is marked done only after it was verified.
"""

from __future__ import annotations

import os
import shlex

from . import hosts
from .errors import UserError
from .jobs import RenderedJob
from .pipeline_run import Session, Stage
from .progress import eval_label

DATASET = "openai/gsm8k"


def _arg(job: RenderedJob, key: str, default: str = "") -> str:
    prefix = f"{key}="
    return next((a[len(prefix) :] for a in job.argv if a.startswith(prefix)), default)


def model_card(session: Session) -> str:
    """A Hub model card: base model, algorithm, steps, dataset and the eval numbers."""
    train = session.rendered(session.workers[0])["train"]
    base_model = session.base_model or _arg(train, "model_name")
    algorithm = _arg(train, "rl.loss_algo", "grpo").upper()
    steps = _arg(train, "num_batches", "?")
    rows = "\n".join(
        f"| {eval_label(e)} "
        f"| {e['accuracy']:.2f} | {e['format_accuracy']:.2f} | {e['partial_accuracy']:.2f} | {e['mean_reward']:.3f} |"
        for e in session.run.evals
    )
    return f"""---
base_model: {base_model}
datasets:
- {DATASET}
library_name: transformers
tags:
- maxtext
- {algorithm.lower()}
- reinforcement-learning
---

# {base_model}, post-trained with {algorithm} on GSM8K

Trained with MaxText on a Cloud TPU v6e-8 by tpu-rl: run `{session.run.name}`,
{algorithm} for {steps} batches of `{DATASET}` (config `main`), checkpoint exported back to Hugging Face format.

| GSM8K eval | accuracy % | format accuracy % | partial accuracy % | mean reward |
|---|---|---|---|---|
{rows or "| (no eval results recorded) | | | | |"}
"""


def export_folder(session: Session) -> str:
    """Where the export job writes the model on the VM: the folder of its first output."""
    export = session.rendered(session.workers[0]).get("export")
    if export is None:
        raise UserError("the pipeline has no export job")
    return os.path.dirname(export.outputs[0])


def hub_stage(session: Session, folder: str, python: str, card: str) -> Stage:
    results = session.spec.results
    job_dir = f"{session.state_dir}/runs/{session.run.name}/publish-hub-{results.hub_repo.replace('/', '--')}"
    marker = f"{job_dir}/published.json"
    script = f"{session.state_dir}/bin/hub_upload.py"
    argv = [python, script, folder, results.hub_repo, "--card", f"{job_dir}/card.md", "--marker", marker]
    endpoint = os.environ.get("HF_ENDPOINT")
    env = {"HF_HUB_DISABLE_TELEMETRY": "1", **({"HF_ENDPOINT": endpoint} if endpoint else {})}
    spec = session.runner_spec(
        "hub_upload", argv + (["--private"] if results.hub_private else []), [marker], env, ["HF_TOKEN"]
    )

    def write_card() -> None:
        worker = session.workers[0]
        worker.check(f"mkdir -p {shlex.quote(job_dir)}", "preparing the upload")
        worker.put_text(f"{job_dir}/card.md", card)

    target = f"{endpoint or 'https://huggingface.co'}/{results.hub_repo}"
    return Stage(session, "publish-hub", job_dir, [spec], write_card, target)


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
    return Stage(session, "publish-gcs", job_dir, [session.runner_spec("gcs_upload", argv, [marker])], target=url)


def publish_after_train(session: Session) -> None:
    """Run the configured durable copies (on worker 0, which holds the export), or warn plainly."""
    results = session.spec.results
    folder = export_folder(session)
    stages = []
    if results.hub_repo:
        python = session.rendered(session.workers[0])["export"].argv[0]  # the venv's, which has huggingface_hub
        stages.append(hub_stage(session, folder, python, model_card(session)))
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
        stage.run()
        session.run.results[stage.name] = stage.target
        session.run.save()
        session.console.print(f"model kept at {stage.target} (verified)")
