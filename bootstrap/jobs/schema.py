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
_PINNED = re.compile(r"\s*maxtext\s*(\[[A-Za-z0-9_,.\s-]*\])?\s*===?\s*([0-9][0-9A-Za-z.+!-]*)\s*", re.IGNORECASE)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"[0-9]+", version)[:3])


def numbers(version: str) -> tuple[int, ...]:
    """A release as pip compares it: 0.2.5.0 is 0.2.5, 0.2.5.1 is not."""
    parts = [int(part) for part in re.findall(r"[0-9]+", version)]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


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
        if name in self.flat_over_groups(module):  # the config file's flat value wins over any GROUP.name
            return [name]
        groups = [group for group, keys in config["nested"].items() if name in keys]
        return [name, *(f"{group}.{name}" for group in groups)]

    def flat_over_groups(self, module: str) -> list[str]:
        """Keys `module`'s config file sets flat that its class copies over the same key of any group."""
        return self.modules[module].get("flat_over_groups", [])

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
    """The MaxText an environment installs: the one entry that names maxtext (by name, URL or file) must pin
    a supported version with ==; without one (a local stand-in), the guide's version. ValueError says why not."""
    versions = supported()
    named = [package for package in packages if "maxtext" in package.lower()]
    if len(named) > 1:
        raise ValueError(f"names maxtext twice ({', '.join(map(repr, named))}); keep one pin")
    if not named:
        return load()
    exact = _PINNED.fullmatch(named[0].split(";", 1)[0])  # an environment marker does not change the version
    if not exact:
        raise ValueError(
            f"{named[0]!r} does not pin one MaxText version; write maxtext[tpu-post-train]==VERSION with a "
            f"supported VERSION ({', '.join(versions)}): the checks, the schedule and the validator follow it"
        )
    same = [version for version in versions if numbers(version) == numbers(exact.group(2))]
    if not same or re.search(r"[A-Za-z]", exact.group(2)):  # 0.2.5rc1 is not 0.2.5
        raise ValueError(f"MaxText {exact.group(2)} is not supported; supported: {', '.join(versions)} ({ADDING})")
    return load(same[0])
