"""Keep the exported model: the VM's /dev/shm is lost on restart, and the VM on maintenance.

Each durable copy is one more detached, resumable job on the VM (run by the scheduler
like the others), so it survives a dropped connection and is marked done only after
it was verified.
"""

from __future__ import annotations

import os
import shlex

from ..errors import UserError
from ..gke.session import export_url
from ..jobs.plan import PlannedJob, runner_spec
from ..vm import connect
from ..vm.progress import eval_label
from ..vm.scheduler import Session, run_jobs

DATASET = "openai/gsm8k"


def _arg(argv: list[str], key: str, default: str = "") -> str:
    prefix = f"{key}="
    return next((a[len(prefix) :] for a in argv if a.startswith(prefix)), default)


def model_card(session: Session) -> str:
    """A Hub model card: base model, algorithm, steps, dataset and the eval numbers."""
    argv = session.plan.job("train").rendered.argv
    base_model = session.plan.base_model or _arg(argv, "model_name")
    algorithm = _arg(argv, "rl.loss_algo", "grpo").upper()
    steps = _arg(argv, "num_batches", "?")
    lr = session.plan.job("train").lr_schedule
    rows = "\n".join(
        f"| {eval_label(e)} "
        f"| {e['accuracy']:.2f} | {e['format_accuracy']:.2f} | {e['partial_accuracy']:.2f} | {e['mean_reward']:.3f} |"
        for e in session.record.evals
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

Trained with MaxText on a Cloud TPU v6e-8 by tpu-rl: run `{session.plan.run_name}`,
{algorithm} for {steps} batches of `{DATASET}` (config `main`), checkpoint exported back to Hugging Face format.
{f"Learning rate: {lr.line()}." if lr else ""}

| GSM8K eval | accuracy % | format accuracy % | partial accuracy % | mean reward |
|---|---|---|---|---|
{rows or "| (no eval results recorded) | | | | |"}
"""


def hub_job(session: Session, folder: str) -> PlannedJob:
    plan, results = session.plan, session.plan.spec.results
    job_dir = plan.layout.run_job(plan.run_name, f"publish-hub-{results.hub_repo.replace('/', '--')}")
    marker = f"{job_dir}/published.json"
    argv = [plan.spec.environment.python_path, plan.layout.tool("hub_upload.py"), folder, results.hub_repo]
    argv += ["--card", f"{job_dir}/card.md", "--marker", marker] + (["--private"] if results.hub_private else [])
    endpoint = os.environ.get("HF_ENDPOINT")
    env = {"HF_HUB_DISABLE_TELEMETRY": "1", **({"HF_ENDPOINT": endpoint} if endpoint else {})}
    spec = runner_spec(plan.layout, "hub_upload", argv, [marker], env=env, secrets=["HF_TOKEN"])
    target = f"{endpoint or 'https://huggingface.co'}/{results.hub_repo}"
    return PlannedJob("publish-hub", job_dir, spec, needs=("export",), target=target)


def gcs_url(session: Session) -> str:
    target = session.plan.spec.results.gcs
    if target == "stack":
        bucket = connect.stack_outputs().get("bucket")
        if not bucket:
            raise UserError(
                "results.gcs is 'stack' but the stack has no bucket: set tpu-rl:resultsBucket and run pulumi up"
            )
        target = f"gs://{bucket}"
    return f"{target.rstrip('/')}/{session.plan.run_name}"


def gcs_job(session: Session, folder: str, url: str) -> PlannedJob:
    plan = session.plan
    job_dir = plan.layout.run_job(plan.run_name, "publish-gcs")
    marker = f"{job_dir}/copied.json"
    argv = ["python3", plan.layout.tool("gcs_upload.py"), folder, url, "--marker", marker]
    return PlannedJob(
        "publish-gcs", job_dir, runner_spec(plan.layout, "gcs_upload", argv, [marker]), ("export",), target=url
    )


def publish_after_train(session: Session) -> None:
    """Run the configured durable copies, or say plainly that the model lives only in the VM's memory."""
    results = session.plan.spec.results
    kept = export_url(session.plan)
    if kept:  # the gke backend exports into the stack's bucket, SHA256SUMS beside it
        session.console.print(f"model kept at {kept} (verified: SHA256SUMS beside it)")
        if results.hub_repo:
            session.console.print("results.hub_repo: the Hub upload runs on the vm backend only, not yet on gke")
        return
    folder = session.plan.export_folder()
    jobs = []
    if results.hub_repo:
        job = hub_job(session, folder)
        session.vm.check(f"mkdir -p {shlex.quote(job.job_dir)}", "preparing the upload")
        session.vm.put_text(f"{job.job_dir}/card.md", model_card(session))
        jobs.append(job)
    if results.gcs:
        jobs.append(gcs_job(session, folder, gcs_url(session)))
    if not jobs:
        session.console.print(
            f"[bold yellow]The trained model lives only in the VM's memory[/] ({folder}) and is lost when the VM "
            "restarts or is deleted.\nKeep it: set results.hub_repo (Hugging Face Hub) or results.gcs in "
            "jobs/pipeline.yaml and run fab train again, or copy it here with fab download."
        )
        return
    for job in jobs:
        run_jobs(session, [job])
        session.record.results[job.name] = job.target
        session.record.save()
        session.console.print(f"model kept at {job.target} (verified)")
