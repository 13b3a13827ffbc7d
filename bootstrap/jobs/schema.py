"""The facts about MaxText that the local checks read: maxtext_schema.json, generated from the real
package by scripts/generate_maxtext_schema.py (keys, types, modules' flags and configs, defaults)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

SCHEMA_FILE = Path(__file__).with_name("maxtext_schema.json")


@cache
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def version() -> tuple[int, ...]:
    """The MaxText version the schema was generated from, e.g. (0, 2, 3)."""
    return tuple(int(part) for part in schema()["maxtext_version"].split(".")[:3] if part.isdigit())


def defaults(module: str) -> dict:
    """The defaults (of the keys the local checks compute with) that `module`'s config file sets."""
    facts = schema()
    return facts["defaults"].get(facts["modules"].get(module, {}).get("config", ""), {})
