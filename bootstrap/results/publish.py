"""Keep the exported model: the VM's /dev/shm is lost on restart, and the VM on maintenance.

Each durable copy is one more job of the VM's pipeline, after export (so it runs without
the laptop too), marked done only after it was verified, and done only for the export it
copied: its input is the export's SHA256SUMS, so a model exported again is copied again.
On gke the export is in the bucket already; the Hub upload is one more JobSet there.
"""

from __future__ import annotations

import os
from types import MappingProxyType

from rich.markup import escape

from ..errors import UserError
from ..jobs.plan import DURABLE_DIR, Plan, PlannedJob, runner_spec
from ..jobs.spec import PipelineSpec
from ..remote import attempts, evals, manifest
from ..remote.jobset_state import OUTPUTS_ANNOTATION
from ..vm import connect

DATASET = "openai/gsm8k"
DURABLE_PREFIX = "publish-"  # the names of the durable copies' jobs
HUB_MARKER = "published.json"  # the Hub job's output: what it uploaded, or why results.publish_if held it back


def _arg(argv: list[str], key: str, default: str = "") -> str:
    prefix = f"{key}="
    return next((a[len(prefix) :] for a in argv if a.startswith(prefix)), default)


def model_card(plan: Plan) -> str:
    """A Hub model card: base model, algorithm, steps, the task and its data; the VM fills in the eval rows and the
    run's result (evals.CARD_ROWS, evals.CARD_RESULT)."""
    argv = plan.job("train").rendered.argv
    base_model = plan.base_model or _arg(argv, "model_name")
    algorithm = _arg(argv, "rl.loss_algo", "grpo").upper()
    steps = _arg(argv, "num_batches", "?")
    lr = plan.job("train").lr_schedule
    task = plan.task
    if task.builtin:
        data, trained_on, source = DATASET, "GSM8K", f"`{DATASET}` (config `main`)"
        header = (
            "| GSM8K eval | accuracy % | format accuracy % | partial accuracy % | mean reward |\n|---|---|---|---|---|"
        )
    else:
        data = task.spec.data.hub or f"tpu-rl-task/{task.name}"
        trained_on, source = f"the task {task.name}", f"`{data}` (task digest {task.digest[:12]})"
        header = f"| eval | {task.spec.measure} | mean reward |\n|---|---|---|"
    return f"""---
base_model: {base_model}
datasets:
- {data}
library_name: transformers
tags:
- maxtext
- {algorithm.lower()}
- reinforcement-learning
---

# {base_model}, post-trained with {algorithm} on {trained_on}

Trained with MaxText on a Cloud TPU by tpu-rl: run `{plan.run_name}`,
{algorithm} for {steps} batches of {source}, checkpoint exported back to Hugging Face format.
{f"Learning rate: {lr.line()}." if lr else ""}

{evals.CARD_RESULT}

{header}
{evals.CARD_ROWS}
"""


def _train_steps(plan: Plan) -> int | None:
    progress = plan.job("train").rendered.progress
    return int(progress["total_steps"]) if progress else None


def _hub_env() -> dict[str, str]:
    endpoint = os.environ.get("HF_ENDPOINT")
    return {"HF_HUB_DISABLE_TELEMETRY": "1", **({"HF_ENDPOINT": endpoint} if endpoint else {})}


def _hub_target(plan: Plan) -> str:
    return f"{os.environ.get('HF_ENDPOINT') or 'https://huggingface.co'}/{plan.spec.results.hub_repo}"


def _hub_flags(plan: Plan, publish_if: str | None = None) -> list[str]:
    """How hub_upload.py judges the run: results.publish_if (or `publish_if`: fab publish's "always"), from the
    run's durable eval records (train's environment names their folder), for the run's own name."""
    rule = publish_if or str(plan.spec.results.publish_if)
    flags = [*(["--private"] if plan.spec.results.hub_private else []), "--publish-if", rule, "--run", plan.run_name]
    if records := plan.job("train").rendered.env.get(attempts.EVALS_ENV):
        flags += ["--evals-from", records]
    if (steps := _train_steps(plan)) is not None:
        flags += ["--steps", str(steps)]
    return flags


def hub_job(plan: Plan, folder: str, publish_if: str | None = None) -> PlannedJob:
    """The Hub upload as a job of the VM's pipeline; it judges the run there (results.publish_if) and fills the
    card's eval rows from the run's durable eval records."""
    repo = plan.spec.results.hub_repo
    job_dir = plan.layout.run_job(plan.run_name, f"publish-hub-{repo.replace('/', '--')}")
    marker = f"{job_dir}/{HUB_MARKER}"
    argv = [plan.spec.environment.python_path, plan.layout.tool("hub_upload.py"), folder, repo]
    argv += [*_hub_flags(plan, publish_if), "--card", f"{job_dir}/card.md", "--marker", marker]
    spec = runner_spec(
        plan.layout,
        "hub_upload",
        argv,
        [marker],
        env=_hub_env(),
        secrets=["HF_TOKEN"],
        inputs=[f"{folder}/{manifest.NAME}"],
        files={"card.md": model_card(plan)},
        may_hold=True,  # its marker may say it held the model back: then it is no copy (jobrunner.held)
    )
    return PlannedJob(f"{DURABLE_PREFIX}hub", job_dir, spec, needs=("export",), target=_hub_target(plan))


def gke_hub_job(plan: Plan, outputs: dict) -> PlannedJob:
    """The Hub upload as a JobSet after export's, judging the run from its eval records in the bucket."""
    from ..gke import jobsets, session  # a gke stack only

    name = f"{DURABLE_PREFIX}hub"
    jobset = jobsets.hub_jobset(
        name,
        plan.export_folder(),
        plan.spec.results.hub_repo,
        _hub_flags(plan),
        _hub_env(),
        model_card(plan),
        session.target_of(outputs, plan.spec),
        plan.run_name,
    )
    return PlannedJob(name, jobset["metadata"]["name"], MappingProxyType(jobset), ("export",), target=_hub_target(plan))


def export_url(plan: Plan) -> str | None:
    """Where a gke plan's export lands in Cloud Storage (None for a VM plan)."""
    export = next((job for job in plan.jobs if job.name == "export"), None)
    if export is None or export.runner_spec.get("kind") != "JobSet":
        return None
    return export.runner_spec["metadata"]["annotations"][OUTPUTS_ANNOTATION].split()[0].rsplit("/", 1)[0]


STACK_BUCKET = "gs://<stack-bucket>"  # what `fab plan` shows offline for results.gcs: stack


def gcs_root(spec: PipelineSpec, outputs: dict | None, offline: bool = False) -> str | None:
    """results.gcs as a gs:// URL: for "stack" the stack's bucket (from its `outputs`, read now if None;
    `offline`: a placeholder). None when results.gcs is unset."""
    target = spec.results.gcs
    if target == "stack":
        if offline:
            return STACK_BUCKET
        bucket = (outputs if outputs is not None else connect.stack_outputs()).get("bucket")
        if not bucket:
            raise UserError(
                "results.gcs is 'stack' but the stack has no bucket: set tpu-rl:resultsBucket and run pulumi up"
            )
        target = f"gs://{bucket}"
    return target.rstrip("/") or None


def durable_overrides(spec: PipelineSpec, outputs: dict | None, offline: bool = False) -> list[str]:
    """With results.gcs set, the converted model and the checkpoints live in that bucket (vars.durable_dir);
    the user's own --arg vars.durable_dir, given after these, wins."""
    root = gcs_root(spec, outputs, offline)
    return [f"vars.{DURABLE_DIR}={root}/${{model_name}}"] if root else []


def gcs_url(plan: Plan, outputs: dict | None) -> str:
    """Where the GCS copy of the export goes: below results.gcs, in the run's folder."""
    return f"{gcs_root(plan.spec, outputs)}/{plan.run_name}"


def gcs_job(plan: Plan, folder: str, url: str) -> PlannedJob:
    job_dir = plan.layout.run_job(plan.run_name, "publish-gcs")
    marker = f"{job_dir}/copied.json"
    argv = ["python3", plan.layout.tool("gcs_upload.py"), folder, url, "--by-export", "--marker", marker]
    spec = runner_spec(plan.layout, "gcs_upload", argv, [marker], inputs=[f"{folder}/{manifest.NAME}"])
    return PlannedJob(f"{DURABLE_PREFIX}gcs", job_dir, spec, ("export",), target=url)


def durable_jobs(plan: Plan, outputs: dict | None) -> list[PlannedJob]:
    """The copies of the export that results.* asks for, as jobs of the pipeline (on gke only the Hub's: the
    export lands in the bucket there)."""
    if export_url(plan):
        return (
            [gke_hub_job(plan, outputs if outputs is not None else connect.stack_outputs())]
            if plan.spec.results.hub_repo
            else []
        )
    results, folder = plan.spec.results, plan.export_folder()
    jobs = [hub_job(plan, folder)] if results.hub_repo else []
    return jobs + ([gcs_job(plan, folder, gcs_url(plan, outputs))] if results.gcs else [])


def _marker_path(job: PlannedJob) -> str:
    """Where a durable copy's job leaves its marker: its first output on a VM, its JobSet's on gke."""
    spec = job.runner_spec
    if "outputs" in spec:
        return spec["outputs"][0]
    return spec["metadata"]["annotations"][OUTPUTS_ANNOTATION].split()[0]


def report(plan: Plan, durable: list[PlannedJob], say, read_marker) -> dict[str, str]:
    """Where the model is kept (a GCS copy's folder, named by the export, from its marker), or plainly
    that it lives only in the VM's memory; returns each copy's place (or why it was held back) by job."""
    kept_at = {}
    kept = export_url(plan)
    if kept:  # the gke backend exports into the stack's bucket, SHA256SUMS beside it
        say(f"model kept at {kept} (verified: SHA256SUMS beside it)")
    held = []
    for job in durable:
        marker = read_marker(_marker_path(job))
        if marker.get("held"):
            held.append(f"not uploaded to {marker['repo']}: {marker['held']}")
            kept_at[job.name] = f"held back: {marker['held']}"
            continue
        kept_at[job.name] = marker.get("url", job.target) if job.name == "publish-gcs" else job.target
        say(f"model kept at {kept_at[job.name]} (verified)")
    for line in held:
        say(f"[bold yellow]{escape(line)}[/]")
        say(f"The model stays at {plan.export_folder()}. Publish it anyway: fab publish --run-name {plan.run_name}")
    if not durable and not kept:
        say(
            f"[bold yellow]The trained model lives only in the VM's memory[/] ({plan.export_folder()}) and is lost "
            "when the VM restarts or is deleted.\nKeep it: set results.hub_repo (Hugging Face Hub) or results.gcs "
            "in jobs/pipeline.yaml and run fab train again, or copy it here with fab download."
        )
    return kept_at
