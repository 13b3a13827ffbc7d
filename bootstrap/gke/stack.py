"""Which backend a Pulumi stack is, read offline from its Pulumi.<stack>.yaml with the program's own checks."""

from __future__ import annotations

import json
import re

from infra import settings

from ..errors import UserError
from ..jobs import yamlfile
from ..jobs.spec import PipelineSpec
from ..paths import REPO
from .jobsets import Slice
from .session import target_of

STACK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def stack_config(stack: str) -> dict[str, str]:
    """The stack's config as `pulumi config` hands it to the program: strings, lists as JSON.

    Read with the job files' hardened loader: one line with file and line for a syntax error, a tag,
    an alias or a duplicate key (which would otherwise win silently)."""
    if not STACK_NAME.fullmatch(stack) or ".." in stack:
        raise UserError(f"--stack {stack!r}: not a stack name (letters, digits, '_', '.', '-')")
    path = REPO / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise UserError(f"--stack {stack}: no {path.name} in {REPO}")
    data, lines = yamlfile.load(path)
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise UserError(f"{path}:{lines.get(('config',), '?')}: config: must be a mapping of keys to values")
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}


def read(stack: str) -> settings.Settings:
    """The stack's settings, checked as the Pulumi program checks them (its own errors, in one line)."""
    try:
        return settings.read(stack_config(stack))
    except settings.ConfigError as err:
        raise UserError(f"Pulumi.{stack}.yaml: {err}") from None


def slice_of(checked: settings.Settings, spec: PipelineSpec) -> Slice | None:
    """The gke stack's slice, or None for the vm backend."""
    if checked.gke is None:
        return None
    outputs = {"bucket": checked.results_bucket, "topology": checked.gke.topology}
    return target_of({**outputs, "provisioning_model": checked.provisioning_model}, spec)
