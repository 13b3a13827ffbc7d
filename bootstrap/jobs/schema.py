"""The facts about each supported MaxText version that the local checks read: maxtext/<version>.json,
generated from that version's wheel by scripts/generate_maxtext_schema.py (keys and types of each
config class, modules' flags, config files and classes, defaults, model configs).

The version is the one `environment.packages` pins: the checks, the learning-rate replay and the
validator on the VM all follow what the environment installs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

FACTS_DIR = Path(__file__).with_name("maxtext")
DEFAULT_VERSION = "0.2.3"  # the guide's
ADDING = "docs/jobs.md, 'Adding a MaxText version', says how to add one"
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PINNED = re.compile(r"\s*maxtext\s*(\[[A-Za-z0-9_,.\s-]*\])?\s*===?\s*([0-9][0-9A-Za-z.+!-]*)\s*", re.IGNORECASE)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"[0-9]+", version)[:3])


def supported() -> list[str]:
    """The versions with a facts file, oldest first."""
    return sorted((path.stem for path in FACTS_DIR.glob("*.json")), key=_release)


@dataclass(frozen=True)
class MaxText:
    """One MaxText version's facts, as its wheel states them."""

    version: str
    facts: dict = field(repr=False, compare=False, hash=False)

    @property
    def release(self) -> tuple[int, ...]:
        return _release(self.version)

    @property
    def modules(self) -> dict[str, dict]:
        return self.facts["modules"]

    def config(self, module: str) -> dict:
        """{fields, nested, routes_flat_keys} of the config class `module` parses its arguments with."""
        return self.facts["classes"][self.modules[module]["class"]]

    def defaults(self, module: str) -> dict:
        """The defaults (of the keys the local checks compute with) that `module` starts from."""
        return self.facts["defaults"].get(module, {})

    def model_keys(self, model: str) -> dict:
        return self.facts["model_keys"].get(model, {})

    def hf_id(self, model_name: str) -> str | None:
        return self.facts["hf_ids"].get(model_name)

    def spellings(self, module: str, key: str) -> list[str]:
        """The argument names that set `key` for `module`, the winning one first: where a config class
        routes flat keys into its groups (0.2.4's RLConfig), `num_iterations` sets `rl.num_iterations`."""
        config = self.config(module)
        head, dot, tail = key.partition(".")
        if not config["routes_flat_keys"]:
            return [key]
        name = tail if dot else key
        groups = [group for group, keys in config["nested"].items() if name in keys]
        return [name, *(f"{group}.{name}" for group in groups)]

    def value(self, args: dict[str, str], module: str, key: str) -> object:
        """`key` as `module` reads it: the job's argument (in any spelling that sets it), else its default."""
        for name in self.spellings(module, key):
            if name in args:
                return args[name]
        return self.defaults(module).get(key)


@cache
def load(version: str = DEFAULT_VERSION) -> MaxText:
    return MaxText(version, json.loads((FACTS_DIR / f"{version}.json").read_text(encoding="utf-8")))


def pinned(packages: list[str]) -> MaxText:
    """The MaxText an environment installs: a package named maxtext must be pinned with == to a supported
    version; without one (a local stand-in, a wheel file), the guide's version. ValueError says why not."""
    versions = supported()
    for package in packages:
        name = _NAME.match(package)
        if not name or re.sub(r"[-_.]+", "-", name.group(1).lower()) != "maxtext":
            continue
        exact = _PINNED.fullmatch(package)
        if not exact:
            raise ValueError(
                f"{package!r} does not pin one MaxText version; write maxtext[tpu-post-train]==VERSION with a "
                f"supported VERSION ({', '.join(versions)}): the checks, the schedule and the validator follow it"
            )
        if exact.group(2) not in versions:
            raise ValueError(f"MaxText {exact.group(2)} is not supported; supported: {', '.join(versions)} ({ADDING})")
        return load(exact.group(2))
    return load()
