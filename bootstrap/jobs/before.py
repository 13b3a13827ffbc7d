"""What a run will have and lack, said by `fab plan` before anything is paid for: the VM's user, the secrets this
machine holds, where the model will be kept, and whether the VM stops itself (autostop, decided here for fab
train too)."""

from __future__ import annotations

import re

from .. import secrets
from . import tracking
from .plan import Plan

# What a guest shutdown saves, by provisioning model (docs/recovery.md: Autostop). Seconds idle, or None: off.
AUTOSTOP_BY_MODEL = {"STANDARD": 1800, "SPOT": 1800, "FLEX_START": 1800, "RESERVATION_BOUND": None}
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
NOTHING_KEPT = "nothing keeps the model outside the VM (results.hub_repo, results.gcs), so it stays up"


def autostop_of(setting: str, model: str | None, kept: bool, unknown: str) -> tuple[int | None, str]:
    """vm.autostop `setting` for a VM of provisioning `model` (None: `unknown` says why): seconds idle, or None for
    off, and why. Only a pipeline that keeps the model elsewhere (`kept`: a Hub or GCS copy) may stop the VM: a stop
    empties /dev/shm, the only other copy."""
    if setting == "off":
        return None, "off (vm.autostop in jobs/pipeline.yaml)"
    if not kept:
        return None, f"off: {NOTHING_KEPT}"
    if setting == "auto" and not model:
        return None, f"off: {unknown}"
    if setting == "auto":
        seconds = AUTOSTOP_BY_MODEL.get(model)
        return seconds, f"auto for {model}" if seconds else f"off: {model} (the reservation is billed either way)"
    number, unit = re.fullmatch(r"(\d+)([smh])", setting).groups()
    return int(number) * UNIT_SECONDS[unit], f"vm.autostop {setting}"


GIVEN_HOST = "a VM given with -H (its provisioning model is unknown; set vm.autostop to choose)"


def notes(plan: Plan, user: str, model: str | None, present: set[str], given_host: bool = False) -> list[str]:
    """`fab plan`'s lines on what fab train will use, lack or refuse (`user`: whose folders, and why that user;
    `model`: the stack's provisioning model, None without a stack; `present`: the secrets set here; `given_host`:
    a VM given with -H)."""
    results = plan.spec.results
    lines = [f"user:     {user}"]
    for name in sorted({name for job in plan.rendered for name in job.secrets}):
        said = "set on this machine" if name in present else f"not set: fab train refuses; {secrets.KNOWN[name]}"
        lines.append(f"{name + ':':<9} {said}")
    for entry in results.notify:
        name = entry.split(":", 1)[0]
        said = "set on this machine" if name in present else f"not set: fab train refuses; export {name}=YOUR_URL"
        lines.append(f"notify:   {name} {said}")
    if results.wandb:
        key = "its key set here" if tracking.KEY in present else f"no {tracking.KEY} here: logged offline on the VM"
        lines.append(f"W&B:      train logs live to project {results.wandb}, run {plan.run_name} ({key})")
    if results.mlflow:
        lines.append(f"MLflow:   fab logs the run to {results.mlflow} at its end and with fab metrics")
    kept = [where for where, value in (("the Hub", results.hub_repo), ("the bucket", results.gcs)) if value]
    lines.append(
        f"results:  kept on {' and '.join(kept)}"
        if kept
        else "results:  none: the model lives only in the VM's memory (/dev/shm) until fab download; lost with the VM "
        "(set results.hub_repo or results.gcs)"
    )
    if model is None and plan.spec.vm.autostop == "auto" and kept and not given_host:
        why = "auto: follows the stack's provisioning model (30 min idle on STANDARD, SPOT, FLEX_START; off on "
        why += "RESERVATION_BOUND): pass --stack STACK"
    else:
        seconds, why = autostop_of(plan.spec.vm.autostop, model, bool(kept), GIVEN_HOST)
        why = f"after {seconds // 60} min idle ({why})" if seconds else why
    return [*lines, f"autostop: {why}"]
