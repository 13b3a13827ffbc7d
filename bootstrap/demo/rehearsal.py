"""The demo's folder and its jobs: the user's own jobs/, with only what this machine's CPU needs changed.

Everything the demo makes lives in one folder (its layout is `Folder`'s): the CPU environment, the tiny inputs,
the run's work folder and state, the run records. `fab demo --clean` removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import UserError
from ..jobs.task import GSM8K_NAME
from ..paths import JOBS_ENV, REPO, RUNS_ENV
from . import MAKE_LEARNABLE_INPUTS, cpu

ROOT_ENV = "TPU_RL_DEMO"  # where the demo's folder is (default ~/.cache/tpu-rl/demo)
MARKER = ".tpu-rl-demo"  # in a folder the demo made: the only kind it writes into or removes
# What this machine offers the jobs, as a VM's environment would: no TPU (JAX on the CPU), no Hub.
MACHINE_ENV = {"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
STEPS = 8
LEARNING_RATE = "3e-2"
# The control's: fab refuses 0 (a run that changes nothing); Adam's steps of about 1e-12 round away in float32
# weights of this size, so the control's weights stay exactly as they were.
CONTROL_LEARNING_RATE = "1e-12"
# The run, sized for 2 CPU cores: 2 prompts x 8 completions a step, float32 weights (bf16 would round the small
# updates away), and MaxText's greedy eval of 64 held-out problems before and after training.
TRAIN = (
    f"vars.num_batches={STEPS}",
    "train.batch_size=2",
    "train.rl.num_generations=8",
    "train.weight_dtype=float32",
    "train.max_prefill_predict_length=112",
    "train.max_target_length=128",
    "train.num_test_batches=1",
    "train.eval_batch_size=64",
    "train.eval_interval=0",
    f"train.checkpoint_period={STEPS}",
)
# A task of your own: room for its prompts in the tiny tokenizer's tokens (trained on them), the answer chain's 16.
TASK_LENGTHS = ("train.max_prefill_predict_length=192", "train.max_target_length=208")
TASK_TEXTS = 512  # rows of a task's train split the tiny tokenizer learns its prompts' words from


@dataclass(frozen=True)
class Folder:
    """The demo's one folder and what is in it."""

    root: Path

    @classmethod
    def default(cls) -> Folder:
        return cls(Path(os.environ.get(ROOT_ENV) or Path.home() / ".cache" / "tpu-rl" / "demo").expanduser().absolute())

    @classmethod
    def ran(cls) -> Folder:
        """The default folder, once a demo has run in it; else one line saying that fab demo runs one."""
        folder = cls.default()
        if not (folder.root / MARKER).exists():
            raise UserError(f"no demo has run here ({folder.root} holds none): fab demo runs one")
        return folder

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    def venv(self, release: cpu.Release) -> Path:
        return self.root / f"maxtext-{release.version}-cpu"

    @property
    def texts(self) -> Path:
        """A task of your own's prompts, a line each: what the tiny tokenizer learns its words from."""
        return self.root / "task-texts.txt"

    def pipeline(self) -> dict:
        """The demo's copy of pipeline.yaml (written by write_jobs)."""
        return yaml.safe_load((self.jobs / "pipeline.yaml").read_text()) or {}

    def release(self) -> cpu.Release:
        """The MaxText the demo's jobs run: the user's pin where the CPU runs it, else the shipped one."""
        return cpu.release_for((self.pipeline().get("environment") or {}).get("packages") or [])

    def task(self) -> str:
        """The task the demo's jobs train (gsm8k: MaxText's own)."""
        return str(self.pipeline().get("task") or GSM8K_NAME)

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def startup_marker(self) -> Path:
        return self.root / "startup.done"  # this machine has no startup script to wait for


def use(folder: Folder) -> dict[str, str]:
    """Point this fab at the demo's jobs and runs (in its folder), and return what its commands see as the VM's
    environment: MACHINE_ENV, and a Python 3.12 that runs first on PATH where this machine has one (a pyenv shim of
    another version would leave uv to download one)."""
    os.environ[JOBS_ENV], os.environ[RUNS_ENV] = str(folder.jobs), str(folder.runs)
    os.environ.setdefault("MPLCONFIGDIR", str(folder.root / "matplotlib"))  # the plot's font cache: not in ~/.cache
    python = cpu.real_python()
    return {**MACHINE_ENV, **({"PATH": str(Path(python).parent)} if python else {})}


def claim(folder: Folder) -> None:
    """Make the folder the demo's, or refuse one that holds anything the demo did not make (TPU_RL_DEMO=. would
    otherwise replace this repository's jobs/)."""
    root = folder.root
    if root.resolve().is_relative_to(REPO.resolve()) or REPO.resolve().is_relative_to(root.resolve()):
        raise UserError(f"{root} is not a demo folder: it is in this repository or holds it; set {ROOT_ENV} elsewhere")
    if root.exists() and any(root.iterdir()) and not (root / MARKER).exists():
        raise UserError(f"{root} is not a demo folder (no {MARKER} in it): left as it is; set {ROOT_ENV} to another")
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("made by fab demo: fab demo --clean removes this folder\n")


def write_jobs(source: Path, folder: Folder) -> list[str]:
    """Copy the user's jobs into the demo's folder (claimed) with what a CPU needs changed; what changed, one line
    each."""
    if folder.root.resolve().is_relative_to(source.resolve()):
        raise UserError(f"{folder.root} is inside the jobs folder {source}: set {ROOT_ENV} elsewhere")
    claim(folder)
    if folder.jobs.exists():
        shutil.rmtree(folder.jobs)
    shutil.copytree(source, folder.jobs, ignore=shutil.ignore_patterns("*~", ".*"))
    packages = (yaml.safe_load((source / "pipeline.yaml").read_text()) or {}).get("environment", {}).get("packages")
    release = cpu.release_for(packages or [])
    pipeline = _edit(folder.jobs / "pipeline.yaml", lambda data: _pipeline(data, folder, release))
    for name in pipeline.get("jobs") or []:
        _edit(folder.jobs / f"{name}.yaml", lambda data: _job(data, folder))
    task = folder.task()
    folder.texts.write_text("\n".join(task_texts(folder.jobs, task)) + "\n")
    (folder.jobs / "prefetch.yaml").write_text(yaml.safe_dump(_prefetch(folder), sort_keys=False))
    folder.startup_marker.write_text("fab demo: nothing to start on this machine\n")
    problems = (
        "problems whose answer is 7"
        if task == GSM8K_NAME
        else f"a tokenizer that knows your task's words (your task {task}'s rows are yours, and it only ever answers 5 "
        "or 7)"
    )
    return [
        f"environment: MaxText {release.version} for the CPU (bootstrap/demo/requirements-cpu.txt), in "
        f"{folder.venv(release)}",
        f"prefetch: makes a tiny Llama 3.1 built to learn (width 64), {problems}, instead of the Hub's 16 GB",
        "secrets: none (nothing is read from the Hub)",
        f"vm: this machine's CPU (accelerator cpu, state in {folder.state}, no memory minimums, autostop off)",
        "results: nothing leaves this machine (no Hub upload, no bucket, no notifications, no W&B or MLflow)",
        "health: smoke_right 0 (the tiny model answers every problem wrong before training, on purpose)"
        if task != GSM8K_NAME
        else "health: smoke off (the tiny model's answers loop before training, on purpose: it learns the format)",
        f"train: {STEPS} steps of 2 prompts x 8 completions, float32 weights, greedy eval of 64 problems "
        "before and after (the tiny model's settings: fab runs shows each one)",
    ]


def _edit(path: Path, change) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return data


def _pipeline(data: dict, folder: Folder, release: cpu.Release) -> None:
    if "prefetch" not in (data.get("jobs") or []):  # the tiny inputs are made by the demo's prefetch
        data["jobs"] = ["prefetch", *(data.get("jobs") or [])]
    data["environment"] = cpu.environment(folder.venv(release), release.version, release.pins)
    work = f"{folder.root}/work/${{model_name}}"  # everything the jobs make, in the demo's folder: never a bucket
    data.setdefault("vars", {}).update(work_dir=work, durable_dir=work, export_dir=f"{work}/hf-trained/${{run_name}}")
    data.setdefault("vm", {}).update(
        state_dir=str(folder.state),
        startup_marker=str(folder.startup_marker),
        accelerator="cpu",
        min_memory_gb=0,
        min_shm_gb=0,
        shm_path=str(folder.root),
        autostop="off",  # never shut this machine down
    )
    data["results"] = {**data.get("results", {}), "hub_repo": "", "gcs": "", "notify": [], "wandb": "", "mlflow": ""}
    # the tiny model starts wrong, on purpose; on GSM8K its answers loop too (make_learnable_inputs.py)
    builtin = str(data.get("task") or GSM8K_NAME) == GSM8K_NAME
    data["health"] = {**(data.get("health") or {}), "smoke_right": 0, **({"smoke": False} if builtin else {})}


def _job(data: dict, folder: Folder) -> None:
    """A job as the demo runs it: no secrets, and JAX's compile cache in the demo's folder (MaxText's default is
    ~/jax_cache: every MaxText module sets it, convert and export too)."""
    data.pop("secrets", None)
    if "module" in data:
        data["args"] = {"jax_cache_dir": f"{folder.root}/jax-cache", **(data.get("args") or {})}


def _prefetch(folder: Folder) -> dict:
    """The tiny inputs made here, by the environment's Python, where prefetch would have put the Hub's files."""
    return {
        "description": "Make the tiny model built to learn, its tokenizer and problems (here, not from the Hub)",
        "command": ["${python}", str(MAKE_LEARNABLE_INPUTS), str(folder.inputs), str(folder.texts)],
        "outputs": [
            "${hf_snapshots}/*/config.json",
            "${hf_snapshots}/*/*.safetensors",
            f"{folder.inputs}/gsm8k/train.parquet",
            f"{folder.inputs}/gsm8k/test.parquet",
        ],
    }


def task_texts(jobs: Path, task: str) -> list[str]:
    """A task of your own's prompts (its template over its train split's first rows, a local JSONL file): the tiny
    tokenizer learns their words, so they fit the demo's prompt length; none for GSM8K, or rows read elsewhere."""
    spec = yaml.safe_load((jobs / "tasks" / f"{task}.yaml").read_text()) if task != GSM8K_NAME else None
    train = ((spec or {}).get("data") or {}).get("train", "")
    path = jobs / "tasks" / train
    if not spec or not spec.get("prompt") or not train.endswith(".jsonl") or not path.is_file():
        return []
    texts = []
    with path.open(errors="replace") as f:
        for line in f:
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                texts.append(str(spec["prompt"]).format(**json.loads(line)).replace("\n", " "))
            if len(texts) >= TASK_TEXTS:
                break
    return texts


def shared_overrides(folder: Folder) -> list[str]:
    """The --args every demo run has: the tiny model and its training, as its MaxText release and its task need."""
    gsm8k = folder.task() == GSM8K_NAME
    release = folder.release()
    return [
        *cpu.model_overrides(folder.inputs, gsm8k),
        *TRAIN,
        *(f"train.{setting}" for setting in release.train),
        *(() if gsm8k else TASK_LENGTHS),
    ]


def overrides(folder: Folder, learning_rate: str = LEARNING_RATE) -> list[str]:
    """The --args of a demo run: the shared ones, and its learning rate."""
    return [*shared_overrides(folder), f"train.learning_rate={learning_rate}"]


def stop(folder: Folder) -> int:
    """Stop what the demo's pipeline runs (its driver, runners and jobs), as a deleted VM would; how many."""
    from ..remote import jobrunner, processes

    stopped = 0
    for path in [folder.state / "pipeline" / "driver.json", *folder.state.glob("**/runner.json"),
                 *folder.state.glob("**/process.json")]:  # fmt: skip
        record = jobrunner.read_json(str(path))
        if record and isinstance(record.get("pid"), int) and processes.alive(record):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill = os.killpg if path.name == jobrunner.PROCESS else os.kill  # a job: its whole process group
                kill(record["pid"], signal.SIGKILL)
                stopped += 1
    return stopped
