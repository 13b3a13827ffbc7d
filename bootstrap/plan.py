"""The pipeline as it would run, for people (text) and for scripts (JSON)."""

from __future__ import annotations

import shlex

from .jobs import RenderedJob
from .runs import RunRecord
from .secrets import REDACTED


def _run_info(name: str | None, record: RunRecord | None) -> dict:
    if not name:
        return {"name": None, "new": True, "note": "a new run: its name is generated when fab train starts"}
    states = {job: info.get("state") for job, info in (record.jobs if record else {}).items()}
    has_checkpoints = states.get("train") in ("done", "running", "failed", "interrupted")
    return {
        "name": name,
        "new": False,
        "last_seen": states,
        "has_checkpoints": has_checkpoints,
        "note": "MaxText resumes this run's checkpoints" if has_checkpoints else "no checkpoints seen for this run yet",
    }


def _env(job: RenderedJob) -> dict[str, str]:
    return {**job.env, **{name: REDACTED for name in job.secrets}}


def plan_dict(jobs: list[RenderedJob], name: str | None, record: RunRecord | None) -> dict:
    return {"run": _run_info(name, record), "jobs": [{**job.to_dict(), "env": _env(job)} for job in jobs]}


def plan_text(jobs: list[RenderedJob], name: str | None, record: RunRecord | None) -> str:
    info = _run_info(name, record)
    lines = [f"run: {info['name'] or '<new>'} ({info['note']})"]
    if info.get("last_seen"):
        lines.append("last seen: " + ", ".join(f"{j} {s}" for j, s in info["last_seen"].items()))
    for number, job in enumerate(jobs, 1):
        lines += [
            "",
            f"{number}. {job.name}: {job.description}",
            f"   needs:   {', '.join(job.needs) or '-'}",
            f"   cwd:     {job.cwd}",
            "   env:     " + (" ".join(f"{k}={shlex.quote(v)}" for k, v in _env(job).items()) or "-"),
            "   argv:    "
            + " \\\n              ".join([shlex.join(job.argv[:3]), *(shlex.quote(a) for a in job.argv[3:])]),
            f"   inputs:  {', '.join(job.inputs) or '-'}",
            f"   outputs: {', '.join(job.outputs)}",
        ]
    lines += ["", "${hostname} and ${latest_step:DIR} are looked up on the VM when the job starts."]
    return "\n".join(lines)
