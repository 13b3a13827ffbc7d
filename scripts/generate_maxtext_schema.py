"""Write bootstrap/jobs/maxtext/<version>.json from the real maxtext package of that version.

The local job check (bootstrap/jobs/check.py) validates MaxText keys without
importing MaxText (which needs JAX and Python 3.12). It reads the facts it
needs from these data files, one per supported MaxText version, and this
script is the only thing that writes them.

Run it with the Python of that version's config venv (scripts/maxtext_config_env.py):

    PY=$(python scripts/maxtext_config_env.py 0.2.5)
    $PY scripts/generate_maxtext_schema.py            # write bootstrap/jobs/maxtext/0.2.5.json
    $PY scripts/generate_maxtext_schema.py --check    # exit 1 if it differs
"""

from __future__ import annotations

import argparse
import enum
import importlib.metadata
import importlib.util
import json
import re
import sys
import types
import typing
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bootstrap.remote.maxtext_check import config_class_name  # noqa: E402  the VM's validator picks it the same way

FACTS_DIR = REPO / "bootstrap" / "jobs" / "maxtext"
FLAG_PATTERNS = (
    re.compile(r"add_argument\(\s*\"--([\w-]+)\""),
    re.compile(r"flags\.DEFINE_\w+\(\s*\"(\w+)\""),
)


def describe(annotation: object) -> dict:
    """Reduce a pydantic field annotation to a small JSON type description."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        described = describe(inner[0]) if len(inner) == 1 else {"type": "any"}
        return {**described, "nullable": True} if type(None) in args else described
    if origin is typing.Literal:
        return {"type": "enum", "choices": [str(a) for a in args]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"type": "enum", "choices": [str(m.value) for m in annotation]}
    for python_type, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if annotation is python_type:
            return {"type": name}
    return {"type": "any"}


def fields_of(model: type) -> dict:
    return {name: describe(field.annotation) for name, field in sorted(model.model_fields.items())}


def nested_models(model: type) -> dict[str, type]:
    """The groups of `model` (rl, debug, ...): fields whose type is itself a pydantic model."""
    from pydantic import BaseModel

    return {
        name: field.annotation
        for name, field in sorted(model.model_fields.items())
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }


def config_facts(model: type) -> dict:
    """The keys a config class accepts, its groups' keys, and whether a flat key also sets the group key
    of the same name (0.2.4's RLConfig routes `num_generations` into `rl.num_generations`; 0.2.3 ignores it)."""
    nested = nested_models(model)
    return {
        "fields": {name: desc for name, desc in fields_of(model).items() if name not in nested},
        "nested": {name: fields_of(group) for name, group in nested.items()},
        "routes_flat_keys": hasattr(model, "map_flat_fields_to_nested_models"),
    }


def module_source(module: str) -> str:
    return Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")


def module_flags(source: str) -> list[str]:
    return sorted({m for pattern in FLAG_PATTERNS for m in pattern.findall(source)})


def model_keys(configs_dir: Path) -> dict[str, dict]:
    """Keys and values each model's own yml sets: MaxText refuses other values for them."""
    keys = {}
    for path in sorted((configs_dir / "models").glob("*.yml")):
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        keys[path.stem] = {k: v for k, v in sorted(loaded.items())}
    return keys


# The defaults the local checks compute with (bootstrap/jobs/schedule.py: the RL learning-rate schedule),
# as each module's config file sets them after its base_config chain.
DEFAULT_KEYS = (
    "learning_rate",
    "learning_rate_schedule_steps",
    "steps",
    "warmup_steps_fraction",
    "num_batches",
    "train_fraction",
    "num_epoch",
    "rl.num_iterations",
)


def class_default(model: type, key: str):
    """The default a config class gives `key` (rl.num_iterations: its group's), or None."""
    from pydantic_core import PydanticUndefined

    head, _, tail = key.partition(".")
    field = model.model_fields.get(head)
    if field is not None and tail:
        field = nested_models(model).get(head, type("NoGroup", (), {"model_fields": {}})).model_fields.get(tail)
    if field is None or field.default is PydanticUndefined:
        return None
    return field.default.value if isinstance(field.default, enum.Enum) else field.default


def load_config(configs_dir: Path, config_file: str) -> dict:
    """A config file, loaded the way pyconfig loads it (its base_config chain merged)."""
    from maxtext.configs import pyconfig
    from omegaconf import OmegaConf

    return OmegaConf.to_container(pyconfig._load_config(str(configs_dir / config_file)))


def flat_over_groups(loaded: dict, model: type) -> list[str]:
    """Keys the config file sets flat that a group of `model` has too: a class that routes flat keys (0.2.4's
    RLConfig) copies the file's flat value over GROUP.KEY, so a GROUP.KEY argument is silently lost."""
    if not config_facts(model)["routes_flat_keys"]:
        return []
    grouped = {key for group in nested_models(model).values() for key in group.model_fields}
    return sorted(key for key in loaded if key in grouped)


def module_defaults(loaded: dict, model: type) -> dict:
    """DEFAULT_KEYS as a module starts with them: its loaded config file over its config class's defaults
    (0.2.4's rl.yml no longer names base.yml)."""
    values = {}
    for key in DEFAULT_KEYS:
        head, _, tail = key.partition(".")
        value = loaded.get(head)
        value = value.get(tail) if tail and isinstance(value, dict) else value
        value = class_default(model, key) if value is None else value
        if value is not None:
            values[key] = value
    return values


def build() -> dict:
    from maxtext.configs import pyconfig
    from maxtext.configs import types as config_types
    from maxtext.utils.globals import HF_IDS

    configs_dir = Path(pyconfig.MAXTEXT_CONFIGS_DIR)
    modules, classes, defaults = {}, {}, {}
    for module, config_file in sorted(pyconfig._CONFIG_FILE_MAPPING.items()):
        source = module_source(module)
        class_name = config_class_name(source)
        model = getattr(config_types, class_name)
        loaded = load_config(configs_dir, config_file)
        modules[module] = {
            "config": config_file,
            "class": class_name,
            "flags": module_flags(source),
            "flat_over_groups": flat_over_groups(loaded, model),
        }
        classes.setdefault(class_name, config_facts(model))
        defaults[module] = module_defaults(loaded, model)
    return {
        "maxtext_version": importlib.metadata.version("maxtext"),
        "modules": modules,
        "classes": classes,
        "model_keys": model_keys(configs_dir),
        "hf_ids": dict(sorted(HF_IDS.items())),  # model_name -> the Hugging Face repo it converts from
        "defaults": defaults,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--output", type=Path, help="default: bootstrap/jobs/maxtext/<the installed version>.json")
    args = parser.parse_args()
    facts = build()
    args.output = args.output or FACTS_DIR / f"{facts['maxtext_version']}.json"
    text = json.dumps(facts, indent=1, sort_keys=True) + "\n"
    if args.check:
        same = args.output.exists() and args.output.read_text(encoding="utf-8") == text
        print(f"{args.output}: {'up to date' if same else 'DIFFERS from the maxtext package'}")
        return 0 if same else 1
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
