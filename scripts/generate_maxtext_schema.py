"""Write bootstrap/jobs/maxtext_schema.json from the real maxtext package.

The local job check (bootstrap/jobcheck.py) validates MaxText keys without
importing MaxText (which needs JAX and Python 3.12). It reads the facts it
needs from this data file, and this script is the only thing that writes it.

Run it with the Python of the MaxText config venv (scripts/maxtext_config_env.py):

    PY=$(python scripts/maxtext_config_env.py)
    $PY scripts/generate_maxtext_schema.py            # rewrite the file
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

OUTPUT = Path(__file__).resolve().parent.parent / "bootstrap" / "jobs" / "maxtext_schema.json"
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


def module_flags(module: str) -> list[str]:
    spec = importlib.util.find_spec(module)
    source = Path(spec.origin).read_text(encoding="utf-8")
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


def config_defaults(configs_dir: Path, config_names: set[str]) -> dict[str, dict]:
    """DEFAULT_KEYS of each config file, loaded the way pyconfig loads it (its base_config chain merged)."""
    from maxtext.configs import pyconfig
    from omegaconf import OmegaConf

    defaults = {}
    for name in sorted(config_names):
        loaded = OmegaConf.to_container(pyconfig._load_config(str(configs_dir / name)))
        values = {}
        for key in DEFAULT_KEYS:
            head, _, tail = key.partition(".")
            value = loaded.get(head)
            value = value.get(tail) if tail and isinstance(value, dict) else value
            if value is not None:
                values[key] = value
        defaults[name] = values
    return defaults


def build() -> dict:
    from maxtext.configs import pyconfig
    from maxtext.configs.types import MaxTextConfig
    from maxtext.utils.globals import HF_IDS
    from pydantic import BaseModel

    top = MaxTextConfig.model_fields
    nested = {
        name: fields_of(field.annotation)
        for name, field in sorted(top.items())
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }
    modules = {
        module: {"config": config, "flags": module_flags(module)}
        for module, config in sorted(pyconfig._CONFIG_FILE_MAPPING.items())
    }
    return {
        "maxtext_version": importlib.metadata.version("maxtext"),
        "modules": modules,
        "fields": {name: desc for name, desc in fields_of(MaxTextConfig).items() if name not in nested},
        "nested": nested,
        "model_keys": model_keys(Path(pyconfig.MAXTEXT_CONFIGS_DIR)),
        "hf_ids": dict(sorted(HF_IDS.items())),  # model_name -> the Hugging Face repo it converts from
        "defaults": config_defaults(Path(pyconfig.MAXTEXT_CONFIGS_DIR), {m["config"] for m in modules.values()}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    text = json.dumps(build(), indent=1, sort_keys=True) + "\n"
    if args.check:
        same = args.output.exists() and args.output.read_text(encoding="utf-8") == text
        print(f"{args.output}: {'up to date' if same else 'DIFFERS from the maxtext package'}")
        return 0 if same else 1
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
