"""What the shipped jobs need changed to run on a CPU with the tiny model: the environment, the model's widths,
the inputs' paths and the CPU sampler. One place for `fab demo` and the CPU tier's tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import REQUIREMENTS, SHIM

VERSION = "0.2.3"  # the MaxText the demo runs (the shipped jobs' pin)
PYTHON = "3.12"  # MaxText's least
TUNIX = "0.1.7"  # PyPI's newest google-tunix, installed without its dependencies (no vLLM: the CPU sampler)
# One grader worker: MaxText starts min(8, cores), each its own Python with math_verify and sympy (on 0.2.3, jax and
# MaxText too: 7 CPU-s), for a tiny model's handful of short answers a step. A CPU's setting: a chip's host keeps
# MaxText's own.
ONE_GRADER = "train.math_verify_num_procs=1"
# The tiny model's widths, make_inputs.py's: the converters take head_dim and the layer count (32) from their 8B table.
TINY = ("override_model_config=True", "base_emb_dim=64", "head_dim=128", "base_mlp_dim=128", "vocab_size=512")
HEADS = (2, 1)  # its query and key-value heads, make_inputs.py's HEADS (why these: there)


@dataclass(frozen=True)
class Release:
    """What one MaxText release needs on a CPU besides requirements-cpu.txt: its own pins and train settings."""

    version: str
    pins: tuple[str, ...] = ()
    train: tuple[str, ...] = ()


RELEASES = {
    release.version: release
    for release in (
        # 0.2.3: its standalone converter's branch takes a rollout class (the CPU sampler)
        Release("0.2.3", train=("debug.rl=false", "use_standalone_converter=true")),
        # 0.2.5: drjax imported by the trainer's model code from 0.2.4 on; debug a flag of RLConfig
        Release("0.2.5", pins=("drjax==0.2.1",), train=("debug=false",)),
    )
}
TRAIN_0_2_3 = RELEASES["0.2.3"].train


def release_for(packages: list[str]) -> Release:
    """The release environment.packages pins, where the CPU runs it; else the shipped one (0.2.3)."""
    for package in packages:
        if found := re.search(r"maxtext(?:\[[^]]*\])?==([0-9.]+)", package):
            return RELEASES.get(found[1], RELEASES[VERSION])
    return RELEASES[VERSION]


# What `uv pip check` finds in the CPU environment: tunix (PyPI's metadata) installed without its dependencies.
TUNIX_UNMET = ("hf-transfer", "kagglehub", "numba", "tensorflow-datasets")
ACCEPTED_CONFLICTS = [
    *(
        {
            "conflict": f"The package `google-tunix` requires `{name}`, but it's not installed",
            "why": "tunix is installed with --no-deps; the CPU tier's trainer never imports it",
        }
        for name in TUNIX_UNMET
    ),
    {
        "conflict": "The package `google-tunix` requires `safetensors<0.8`, but `0.8.0` is installed",
        "why": "the CPU set's transformers 5.24 needs safetensors 0.8; the tiny model's files load with it",
    },
]


def environment(venv: Path, version: str = VERSION, pins: tuple[str, ...] = ()) -> dict:
    """jobs/pipeline.yaml's `environment` for a CPU: maxtext without extras, its CPU dependencies (pinned), tunix
    without its dependencies; the environment check proves the tunix it installs."""
    return {
        "python": "3.12",
        "venv": str(venv),
        "packages": [f"maxtext=={version}", *REQUIREMENTS.read_text().split(), *pins],
        "post_install": [f"uv pip install --no-deps google-tunix=={TUNIX}"],
        "check_packages": {"google-tunix": f"=={TUNIX}"},
        "accepted_conflicts": ACCEPTED_CONFLICTS,
    }


def widths(heads: tuple[int, int] = HEADS) -> tuple[str, ...]:
    """The tiny model's settings, with `heads` (query, key-value) as make_inputs.py was given them."""
    return (*TINY, f"base_num_query_heads={heads[0]}", f"base_num_kv_heads={heads[1]}")


def model_overrides(inputs: Path, gsm8k: bool = True, heads: tuple[int, int] = HEADS) -> list[str]:
    """--args for the tiny model at `inputs` (make_inputs.py's layout, made with `heads`): its widths, files and CPU
    sampler, and (for the built-in task, `gsm8k`) its problems in place of the Hub's."""
    return [
        *(f"{job}.{setting}" for job in ("convert", "train", "export") for setting in widths(heads)),
        f"vars.hf_home={inputs}/hf_home",
        "convert.--lazy_load_tensors=True",
        f"convert.--hf_model_path={inputs}/hf_model",
        f"train.tokenizer_path={inputs}/tokenizer",
        *(
            [f"train.hf_train_files={inputs}/gsm8k/train.parquet", f"train.hf_eval_files={inputs}/gsm8k/test.parquet"]
            if gsm8k
            else []
        ),  # fmt: skip
        # every compile kept in the JAX cache, not only those over its default 1 s: on a CPU they are many and short,
        # and the next run's in the same folder (the control, a resume) are the same programs
        *(f"{job}.env.JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0" for job in ("convert", "train", "export")),
        "train.env.MAXTEXT_CPU_ROLLOUT=1",
        ONE_GRADER,
        f"train.env.PYTHONPATH={SHIM}",
        f"convert.env.PYTHONPATH={SHIM}",  # a gs:// folder made as TensorFlow's gfile makes it
        "export.--override_model_architecture=true",  # the tiny widths instead of the 8B table's
    ]


def real_python(version: str = PYTHON) -> str | None:
    """A Python `version` that runs: pythonX.Y on PATH when it answers (a pyenv shim whose active version is another
    does not), else pyenv's own install of it; None when there is neither (uv then fetches one)."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-V"], capture_output=True).returncode == 0:
        return found
    try:
        prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True).stdout.strip()
    except OSError:  # no pyenv
        return None
    candidate = Path(prefix.splitlines()[-1] if prefix else "/nonexistent") / "bin" / f"python{version}"
    return str(candidate) if candidate.exists() else None
