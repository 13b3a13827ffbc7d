"""The plan as it would run, for people (text) and for scripts (JSON)."""

from __future__ import annotations

import shlex
from dataclasses import asdict

from ..results.runs import RunRecord
from ..secrets import REDACTED
from . import environment
from .load import RenderedJob
from .plan import PLACEHOLDER_RUN, Plan, expected_environment
from .schedule import Schedule

NOT_SET = "<not set>"  # a secret the jobs need that this machine holds nowhere


def _word(text: str) -> str:
    """One shell word as the shell should see it: quoted, but a leading ~/ left for the shell to expand."""
    return "~/" + shlex.quote(text[2:]) if text.startswith("~/") and text[2:] else shlex.quote(text)


def _run_info(plan: Plan, record: RunRecord | None) -> dict:
    if plan.run_name == PLACEHOLDER_RUN:
        return {"name": None, "new": True, "note": "a new run: its name is generated when fab train starts"}
    states = {job: info.get("state") for job, info in (record.jobs if record else {}).items()}
    has_checkpoints = states.get("train") in ("done", "running", "failed", "interrupted")
    return {
        "name": plan.run_name,
        "new": False,
        "last_seen": states,
        "has_checkpoints": has_checkpoints,
        "note": "MaxText resumes this run's checkpoints" if has_checkpoints else "no checkpoints seen for this run yet",
    }


def _env(job: RenderedJob, present: set[str]) -> dict[str, str]:
    """The job's environment as shown: a secret set here redacted, one set nowhere said to be missing."""
    return {**job.env, **{name: REDACTED if name in present else NOT_SET for name in job.secrets}}


def _schedule_dict(lr: Schedule) -> dict:
    return {**asdict(lr), "highest": lr.highest, "last": lr.rate(lr.train_steps)}


def plan_dict(
    plan: Plan, record: RunRecord | None, estimate: dict | None = None, notes: list[str] = (), present: set[str] = ()
) -> dict:
    jobs = [
        {
            **job.rendered.to_dict(),
            "env": _env(job.rendered, set(present)),
            "job_dir": job.job_dir,
            "shared": job.shared,
            **({"lr_schedule": _schedule_dict(job.lr_schedule)} if job.lr_schedule else {}),
        }
        for job in plan.jobs
        if job.rendered is not None
    ]
    setup = {
        "venv": plan.spec.environment.venv_path,
        "maxtext": plan.maxtext_version,
        "new_vm": environment_source(plan),
    }
    chips = plan.accelerator
    accelerator = {"name": chips.name, "chips": chips.chips, "device_kind": chips.device_kind,
                   "machine_type": chips.machine_type, "source": chips.source, "env": dict(chips.env)}  # fmt: skip
    task = plan.task
    return {
        "run": _run_info(plan, record),
        "task": {"name": task.name, "builtin": task.builtin, "digest": task.digest, "files": task.digests},
        "state_dir": plan.layout.root,
        "accelerator": accelerator,
        "environment": setup,
        "jobs": jobs,
        "before": list(notes),
        "estimate": estimate,
    }


def environment_source(plan: Plan) -> str:
    """Whether a new VM restores the environment or builds it (remote/envcache.py)."""
    cache = environment.cache_url(plan.durable_dir)
    if not cache:
        return "builds it (no bucket: set results.gcs to keep a built environment for the next new VM)"
    return (
        f"restores it from {cache} when a VM of the same image, architecture and spec kept it there (each part "
        "verified by SHA-256); otherwise builds it and keeps it there"
    )


def _validate_lines(plan: Plan) -> list[str]:
    """What the validate job proves once the environment exists, beside convert and before train."""
    vm, lines = plan.spec.vm, []
    if vm.validate_args:
        lines.append("   validate: then MaxText's own validator on every job's arguments, before train starts")
    if vm.check_environment:
        expected = expected_environment(plan.spec, plan.accelerator)
        chips = f"{expected.chips} TPU chips ({expected.chip_kind})" if expected.chips else "CPU only"
        packages = ", ".join(
            f"{n} ({v if v != 'maxtext' else 'as MaxText pins it'})" for n, v in expected.packages.items()
        )
        lines.append(
            f"   environment check: {'with it' if vm.validate_args else 'then'}, JAX sees {chips}; "
            f"{packages or 'no packages'} import; uv pip check finds no conflict but the "
            f"{len(expected.accepted)} accepted (environment.accepted_conflicts)"
        )
    return lines


def plan_text(
    plan: Plan, record: RunRecord | None, estimate: list[str] = (), notes: list[str] = (), present: set[str] = ()
) -> str:
    info = _run_info(plan, record)
    lines = [f"run: {info['name'] or '<new>'} ({info['note']})", f"chips: {plan.accelerator.line()}"]
    lines += plan.task.describe()
    if info.get("last_seen"):
        lines.append("last seen: " + ", ".join(f"{j} {s}" for j, s in info["last_seen"].items()))
    venv = plan.spec.environment.venv_path
    lines += ["", f"0. setup: build the environment {venv}, MaxText {plan.maxtext_version} (when its spec changed)"]
    lines.append(f"   new VM:  {environment_source(plan)}")
    lines += _validate_lines(plan)
    for number, planned in enumerate((j for j in plan.jobs if j.rendered is not None), 1):
        job = planned.rendered
        head = job.argv[:3] if job.module else job.argv[:1]
        lines += [
            "",
            f"{number}. {job.name}: {job.description}",
            f"   needs:   {', '.join(planned.needs) or '-'}",
            f"   folder:  {planned.job_dir}{' (shared by runs)' if planned.shared else ''}",
            "   env:     " + (" ".join(f"{k}={_word(v)}" for k, v in _env(job, set(present)).items()) or "-"),
            "   argv:    "
            + " \\\n              ".join([" ".join(map(_word, head)), *map(_word, job.argv[len(head) :])]),
            *(f"   then:    {' '.join(map(_word, a))}" for a in job.after),
            f"   inputs:  {', '.join(job.inputs) or '-'}",
            f"   outputs: {', '.join(job.outputs)}",
            *([f"   lr:      {planned.lr_schedule.line()}"] if planned.lr_schedule else []),
        ]
    lines += ["", "${hostname} and ${latest_step:DIR} are looked up on the VM when the job starts."]
    lines += ["", "before fab train:", *(f"  {line}" for line in notes)] if notes else []
    lines += ["", *estimate] if estimate else []
    return "\n".join(lines)
