"""`fab runs`: this machine's run records, what the VM holds and what the bucket holds, one row a run.

Where a run's things are is never spelled here: the plan is rendered for a placeholder run name
and its paths go to the VM as places (remote/inventory.py reads them there, the bucket with the
VM's service account); the rows merge the three by run name.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from ..jobs.plan import PLACEHOLDER_RUN, Plan
from ..remote import attempts, evals, health, inventory, manifest, preempted
from ..remote.jobrunner import LOG
from . import goodput
from .publish import gcs_url
from .runs import RunRecord


def request(plan: Plan, outputs: dict | None) -> dict:
    """Where the plan, rendered for PLACEHOLDER_RUN, puts each run's evals, export, checkpoints, starts, records
    of done and copies of the export: driver.py's `runs` request."""
    if plan.run_name != PLACEHOLDER_RUN:
        raise ValueError(f"the places come from the plan for {PLACEHOLDER_RUN}, not {plan.run_name}")
    trainer = next((job for job in plan.jobs if job.rendered and job.rendered.progress), None)
    places = {
        inventory.RECORDS: [
            job.runner_spec["record"] for job in plan.jobs if job.runner_spec.get("record") and not job.shared
        ]
    }
    if trainer is not None:
        env = trainer.rendered.env
        places[inventory.EVALS] = f"{trainer.job_dir}/{LOG}"
        places[inventory.CHECKPOINTS] = env.get(attempts.CHECKPOINTS_ENV, "")
        places[inventory.ATTEMPTS] = f"{env[attempts.DIR_ENV]}/*.json" if env.get(attempts.DIR_ENV) else ""
        records = preempted.folder_of(env)
        places[inventory.PREEMPTIONS] = f"{records}/*.json" if records else ""
        places[inventory.STOP] = health.record_path(env) or ""
    if "export" in plan.names:
        places[inventory.EXPORT] = f"{plan.export_folder()}/{manifest.NAME}"
    if plan.spec.results.gcs:
        places[inventory.COPIES] = f"{gcs_url(plan, outputs)}/*/{manifest.NAME}"
    return {"placeholder": PLACEHOLDER_RUN, "places": {key: place for key, place in places.items() if place}}


def yaml_changes(specs: dict[str, dict], now: Plan | None) -> list[str]:
    """`JOB.WORD` for each argument (and `JOB.env.NAME=VALUE` for each variable) a run's planned jobs had that
    jobs/ renders differently now for that run and its --args: the YAML changes since, or before it."""
    if now is None:
        return []
    rendered = {job.name: job.runner_spec for job in now.jobs if job.rendered is not None}  # the YAML's jobs
    changes = []
    for name, spec in specs.items():
        if name not in rendered:
            continue
        default_argv, default_env = set(rendered[name].get("argv") or []), rendered[name].get("env") or {}
        changes += [f"{name}.{word}" for word in spec.get("argv") or [] if word not in default_argv]
        env = spec.get("env") or {}
        changes += [f"{name}.env.{key}={value}" for key, value in env.items() if default_env.get(key) != value]
    return changes


def _settings(record: RunRecord | None, vm: dict) -> list[str] | None:
    """The --args the run was last driven with: as the VM kept them with its plan, else as this machine noted
    (None: neither knows, a run known from the bucket alone)."""
    return vm["settings"] if vm.get("settings") is not None else (record.settings if record else None)


def _hours(seconds: float | None, chips: int) -> float | None:
    return round(seconds / 3600 * chips, 2) if seconds is not None and chips else None


def _estimated(record: RunRecord | None) -> dict | None:
    """What fab estimated when the run started (results/estimate.py): seconds, chip-hours, cost."""
    found = record.estimate if record else None
    if not found:
        return None
    keys = ("low_s", "high_s", "chip_hours", "cost", "price_per_chip_hour", "unknown", "idle_s", "goodput")
    return {key: found.get(key) for key in keys}


def _state(jobs: dict[str, dict], bucket: dict) -> str:
    unfinished = [f"{name} {job['state']}" for name, job in jobs.items() if job.get("state") != "done"]
    if jobs:
        return ", ".join(unfinished) or "done"
    said = [f"{job} done" for job, record in bucket.get("records", {}).items() if record]
    said += [f"checkpoint of step {bucket['steps'][-1]}"] if bucket.get("steps") else []
    return ", ".join(said) or ("started" if bucket.get("attempts") else "not started")


def _kept(record: RunRecord | None, vm: dict, bucket: dict, host: str) -> dict[str, str]:
    """Where the model is: the laptop's record of the durable copies, the VM's markers of them (a Hub commit's
    URL, or why it was held back), the bucket's copies, the VM's own export."""
    kept = dict(record.results) if record else {}
    for job, marker in vm.get("markers", {}).items():
        kept[job] = f"held back: {marker['held']}" if marker.get("held") else marker.get("url", "")
    if copies := [c for c in bucket.get("copies", []) if c not in kept.values()]:
        kept["bucket"] = ", ".join(copies)
    if vm.get("export"):
        kept["vm"] = f"{host}:{vm['export']}"
    return {job: place for job, place in kept.items() if place}


def _stopped(found: dict | None, record: RunRecord | None, billed: float | None) -> dict | None:
    """A health rule's stop of the run (remote/health.py's record): which rule, at which step, why, and the chip-hours
    it saved against what fab estimated the run would take (its middle)."""
    if not found or found.get("cleared_at"):
        return None
    estimated = (record.estimate or {}) if record else {}
    saved = None
    if estimated.get("chip_hours") and billed is not None and record.chips:
        saved = round(max(0.0, sum(estimated["chip_hours"]) / 2 - billed / 3600 * record.chips), 2)
    kept = {key: found.get(key) for key in ("rule", "step", "why", "committed_step")}
    return {**kept, "saved_chip_hours": saved}


def _preemptions(record: RunRecord | None, bucket: dict) -> list[dict]:
    """Each preemption: as fab metrics costed it, else as the VM's shutdown script recorded it in the bucket (what it
    cost not yet counted: lost_chip_hours None)."""
    costed = list(record.preemptions) if record else []
    known = {p.get("at") for p in costed}
    found = [{**p, "lost_chip_hours": None} for p in bucket.get("preemptions", []) if p.get("at") not in known]
    return sorted([*costed, *found], key=lambda p: p.get("at") or 0)


def row(
    name: str, record: RunRecord | None, listed: dict, changes: list[str], chips: int = 0, host: str = "", boot_s=0.0
) -> dict:
    """One run for `fab runs`: when, how far, with what settings, what it scored, what it cost and its goodput, where
    its model is, and who knows it (`listed`: what driver.py's `runs` said of it; `chips`: for a run known from the
    bucket alone; `boot_s`: its VM's boot, where it was the first run on it). The paid chip-hours are the result
    line's (results/goodput.py), where this machine's record has the run's times; else the VM's and bucket's span."""
    vm, bucket = listed.get("vm") or {}, listed.get("bucket") or {}
    jobs = {**(record.jobs if record else {}), **vm.get("jobs", {})}
    scored = evals.merged(record.evals if record else [], vm.get("evals", []))
    result = evals.outcome(scored) or {}
    ledger = record or RunRecord(name)
    # another run's time (a job done already), or a lost VM's (in its own span): not the current VM's
    earlier = {n for n, j in ledger.jobs.items() if j.get("ran") is False or j.get("lost_vm")}
    timed = {n: j for n, j in jobs.items() if n not in earlier}
    every = [*(j for n, j in ledger.jobs.items() if n not in earlier), *timed.values(), *bucket.get("attempts", [])]
    starts = [j["started"] for j in every if j.get("started")]  # an unrecorded lost VM's first start too
    ends = [j["finished"] for j in timed.values() if j.get("finished")]
    ends = ends or [r["finished"] for r in bucket.get("records", {}).values() if r and r.get("finished")]
    billed = ledger.billed_s(starts, ends)
    spent = goodput.measured(record, boot_s) if record and record.billed_s() is not None else None
    first = [*starts, *(vm["started"] for vm in ledger.lost_vms)]
    settings = _settings(record, vm)
    known = [where for where, found in (("laptop", record), ("VM", "vm" in listed), ("bucket", bucket)) if found]
    return {
        "run": name,
        "known": known,
        "started": datetime.fromtimestamp(min(first), UTC).strftime("%Y-%m-%d %H:%M") if first else None,
        "state": _state(jobs, bucket)
        + (f" (its files on the VM unreadable: {vm['error']})" if vm.get("error") else ""),
        "settings": None if settings is None else list(dict.fromkeys([*settings, *changes])),
        "measure": evals.measure_name(result) if result else None,  # what judges it: GSM8K's accuracy, a task's
        "accuracy": [result["before"], result["after"]] if result else None,  # that measure, before -> after
        "format_accuracy": [result["format_before"], result["format_after"]] if result else None,
        "mean_reward": result.get("mean_reward_after"),
        "chip_hours": spent.to_dict()["chip_hours"]
        if spent
        else _hours(billed, (record.chips if record else 0) or vm.get("chips") or chips),
        "goodput": spent.to_dict() if spent else None,
        "took_s": round(billed) if billed is not None else None,
        "vms": len(ledger.lost_vms) + 1,  # each billed while it ran: the lost ones' spans are in took_s
        "estimate": _estimated(record),
        "checkpoint_step": bucket["steps"][-1] if bucket.get("steps") else None,
        "train_starts": len(bucket.get("attempts", [])) or None,
        "preemptions": _preemptions(record, bucket),
        "stopped": _stopped(vm.get("stop") or bucket.get("stop"), record, billed),
        "kept": _kept(record, vm, bucket, host),
    }


def rows(
    records: list[RunRecord],
    found: dict | None,
    now: Callable[[str, list[str]], Plan | None] = lambda run, settings: None,
    chips: int = 0,
    host: str = "",
) -> list[dict]:
    """Every run the laptop, the VM and the bucket know, oldest first (`found`: driver.py's `runs` answer, None
    when the VM was not read; `now(run, settings)`: what jobs/ renders for that run today)."""
    listed = (found or {}).get("runs", {})
    by_name = {record.name: record for record in records}
    made = []
    for name in [*by_name, *sorted(set(listed) - set(by_name))]:
        here, record = listed.get(name, {}), by_name.get(name)
        vm = here.get("vm") or {}
        changes = yaml_changes(vm["specs"], now(name, _settings(record, vm) or [])) if vm.get("specs") else []
        made.append(row(name, record, here, changes, chips, host, goodput.boot_of(record, records) if record else 0.0))
    return sorted(made, key=lambda r: (r["started"] or "", r["run"]))
