"""The real MaxText 0.2.3 pipeline on CPU through the product: `pytest -m maxtext tests/maxtext_cpu`."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import gcsemulator, hubstub
from tests.loopback import REPO, Fab, edit_yaml, loopback_host, write_test_jobs

HERE = Path(__file__).resolve().parent
# Cached between runs like the validator's venv: the setup job keeps a venv already built for its spec.
VENV = Path(os.environ.get("TPU_RL_CPU_VENV") or Path.home() / ".cache" / "tpu-rl" / "maxtext-0.2.3-cpu")
HOST_ENV = {"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # no TPU, no Hub
TINY = [
    "override_model_config=True",
    "base_emb_dim=64",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=128",  # the converter takes head_dim and the layer count (32) from its 8B table
    "base_mlp_dim=128",
    "vocab_size=512",
]


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/maxtext_cpu/" in str(item.fspath):
            item.add_marker(pytest.mark.maxtext)


# What `uv pip check` finds in that environment: tunix 0.1.7 (PyPI's metadata) installed without its dependencies.
TUNIX_UNMET = ["hf-transfer", "kagglehub", "numba", "tensorflow-datasets"]
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


def environment() -> dict:
    """maxtext 0.2.3 without extras, the CPU dependency set (pinned), tunix without its dependencies; the
    environment check proves the tunix it installs (no vLLM, no tpu-inference: the CPU rollout replaces them)."""
    pins = (HERE / "requirements-cpu.txt").read_text().split()
    return {
        "python": "3.12",
        "venv": str(VENV),
        "packages": ["maxtext==0.2.3", *pins],
        "post_install": ["uv pip install --no-deps google-tunix==0.1.7"],
        "check_packages": {"google-tunix": "==0.1.7"},
        "accepted_conflicts": ACCEPTED_CONFLICTS,
    }


def overrides(inputs: Path, num_batches: int = 4) -> list[str]:
    """What a user passes with --arg to run the shipped jobs on the tiny model, on CPU."""
    args = [f"{job}.{setting}" for job in ("convert", "train", "export") for setting in TINY]
    return [
        *args,
        f"vars.num_batches={num_batches}",
        f"vars.hf_home={inputs}/hf_home",
        "convert.--lazy_load_tensors=True",
        f"convert.--hf_model_path={inputs}/hf_model",
        f"train.tokenizer_path={inputs}/tokenizer",
        f"train.hf_train_files={inputs}/gsm8k/train.parquet",
        f"train.hf_eval_files={inputs}/gsm8k/test.parquet",
        "train.max_prefill_predict_length=128",
        "train.max_target_length=160",
        "train.num_test_batches=2",
        "train.eval_batch_size=1",  # 2 problems: the tiny model on CPU
        "train.rl.num_generations=4",
        # A learning signal on the tiny model (make_inputs.py gives it a prior for the format tags): rl.yml
        # scores the format 0 either way; a tag seen exactly once earns 0.5, any other count costs 0.5.
        "train.reward_partial_format_match=0.5",
        "train.penalty_incorrect_format=-0.5",
        # A learning rate that moves these weights (about 0.02) past bf16's resolution in a few steps (at 1e-3 the
        # first update wipes out the tag prior and every later group scores alike), and no weight decay:
        # whatever moves the weights is then the GRPO gradient, nothing else.
        "train.learning_rate=3e-4",
        "train.adam_weight_decay=0.0",
        "train.checkpoint_period=1",  # every step's optimizer state: the learning rate each update used
        "train.max_num_checkpoints_to_keep=4",
        "train.eval_interval=2",
        "train.log_period=1",
        "train.debug.rl=false",
        "train.use_standalone_converter=true",  # the branch that takes a rollout class: the CPU sampler
        "train.env.MAXTEXT_CPU_ROLLOUT=1",
        f"train.env.PYTHONPATH={HERE / 'shim'}",
        f"convert.env.PYTHONPATH={HERE / 'shim'}",  # a gs:// folder made as TensorFlow's gfile makes it
        "export.--override_model_architecture=true",  # the tiny widths instead of the 8B table's
    ]


@pytest.fixture(scope="session")
def cpu_host(tmp_path_factory, gcs_emulator):
    """The loopback "VM": no TPU (JAX on CPU), no Hub (the Hugging Face cache is read offline), and the
    Cloud Storage emulator as its bucket."""
    with loopback_host(tmp_path_factory.mktemp("sshd"), HOST_ENV | gcsemulator.client_env(gcs_emulator)) as host:
        yield host


@contextmanager
def cpu_fab_at(host, tmp: Path) -> Iterator[Fab]:
    """fab for the CPU tier, with its own folders in `tmp` ("VM" state, /dev/shm, runs) and the CPU venv."""
    state, server = hubstub.serve()
    token = "hf_cpu" + uuid.uuid4().hex
    state.tokens[token] = hubstub.Token()
    jobs = tmp / "jobs"
    write_test_jobs(jobs, tmp, [])
    edit_yaml(jobs / "pipeline.yaml", lambda data: data.update(environment=environment()))
    edit_yaml(jobs / "pipeline.yaml", lambda data: data["vm"].update(validate_args=True, check_environment=True))
    try:
        yield Fab(host, tmp, token, jobs, state)
    finally:
        server.shutdown()


@pytest.fixture(scope="session")
def cpu_fab(cpu_host, tmp_path_factory) -> Iterator[Fab]:
    with cpu_fab_at(cpu_host, tmp_path_factory.mktemp("cpu")) as fab:
        yield fab


__all__ = ["REPO", "overrides"]
