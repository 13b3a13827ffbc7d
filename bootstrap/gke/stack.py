"""Which backend a Pulumi stack is, read offline from its Pulumi.<stack>.yaml with the program's own checks."""

from __future__ import annotations

import json

import yaml

from infra import settings

from ..errors import UserError
from ..jobs.spec import PipelineSpec
from ..paths import REPO
from .jobsets import Slice
from .session import target_of


def stack_config(stack: str) -> dict[str, str]:
    """The stack's config as `pulumi config` hands it to the program: strings, lists as JSON."""
    path = REPO / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise UserError(f"--stack {stack}: no {path.name} in {REPO}")
    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}


def slice_of(stack: str, spec: PipelineSpec) -> Slice | None:
    """The gke stack's slice, or None for the vm backend; config mistakes are the program's own errors."""
    try:
        checked = settings.read(stack_config(stack))
    except settings.ConfigError as err:
        raise UserError(f"Pulumi.{stack}.yaml: {err}") from None
    if checked.gke is None:
        return None
    return target_of({"bucket": checked.results_bucket, "topology": checked.gke.topology}, spec)
