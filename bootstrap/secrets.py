"""Secrets the jobs need, found on the user's machine and never printed.

The Hugging Face token comes from HF_TOKEN or the token that `hf auth login`
stored; it reaches the VM inside an SFTP stream and the jobs through their
environment, never a command line (see vm.Worker.put_secret).
"""

from __future__ import annotations

import os

from .errors import Problem, UserError
from .remote import jobrunner

KNOWN = {"HF_TOKEN": "the Hugging Face token (export HF_TOKEN=... or run `hf auth login`)"}
REDACTED = jobrunner.REDACTED.decode()


def lookup(name: str) -> str | None:
    if name == "HF_TOKEN":
        if value := os.environ.get("HF_TOKEN"):
            return value
        import huggingface_hub  # a third of a second to import: only for the token `hf auth login` stored

        return huggingface_hub.get_token()
    return None


def redact(text: str) -> str:
    """`text` with the value of every secret set on this machine replaced."""
    for name in KNOWN:
        if value := lookup(name):
            text = text.replace(value, REDACTED)
    return text


def require(names_by_source: dict[str, list[str]]) -> dict[str, str]:
    """The values of every secret the job files declare; one error listing all that are missing."""
    values, problems = {}, []
    for source, names in names_by_source.items():
        for name in names:
            if (value := lookup(name)) is None:
                problems.append(
                    Problem(source, "secrets", f"{name} is required but not set: {KNOWN.get(name, 'unknown secret')}")
                )
            else:
                values[name] = value
    if problems:
        raise UserError(problems)
    return values


def available(names_by_source: dict[str, list[str]]) -> dict[str, str]:
    """The secrets the job files declare that are set here: only to redact them from what is shown."""
    names = {name for names in names_by_source.values() for name in names}
    return {name: value for name in names if (value := lookup(name)) is not None}
