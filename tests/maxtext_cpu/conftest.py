"""The real MaxText pipeline on CPU through the product, each release in RELEASES where it differs:
`pytest -m maxtext tests/maxtext_cpu` (`-k 0.2.5` for one release)."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootstrap.demo import SHIM, cpu
from bootstrap.jobs.schedule import Schedule
from bootstrap.remote import attempts
from tests import gcsemulator, hubstub
from tests.loopback import REPO, Fab, edit_yaml, loopback_host, write_test_jobs

HERE = Path(__file__).resolve().parent
# Cached between runs like the validator's venv: the setup job keeps a venv already built for its spec.
VENVS = Path(os.environ.get("TPU_RL_CPU_VENVS") or Path.home() / ".cache" / "tpu-rl")
HOST_ENV = {"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # no TPU, no Hub
# The tier's jobs run XLA's Eigen ops on the calling thread: four jobs side by side on two cores only contend (one run
# of test_real_pipeline beside two CPU burners: 171 s with it, 183 s without). Not in HOST_ENV: the benchmarks use that.
EIGEN_ONE_THREAD = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
# JAX's compiled programs, kept between runs like the venvs: the tier's programs are the same each run (JAX keys an
# entry by the program, not by the run), so a warm tier compiles none (a cold train job 67 CPU-s, a warm one 39).
# test_real_loss keeps train's own cache in the bucket: it proves that a new VM finds the lost one's there.
COMPILE_CACHE = VENVS / "jax-cache"


@dataclass(frozen=True)
class Release:
    """What the CPU tier does differently for one MaxText release; everything else is the same."""

    version: str
    pins: tuple[str, ...] = ()  # its CPU dependencies beyond bootstrap/demo/requirements-cpu.txt
    train: tuple[str, ...] = ()  # train settings that name one thing differently in this release
    unset_schedule_peak: float = 0.0  # the shipped run's highest learning rate with learning_rate_schedule_steps=-1

    @property
    def venv(self) -> Path:
        return VENVS / f"maxtext-{self.version}-cpu"


# Each release's CPU pins and train settings are the demo's (bootstrap/demo/cpu.py); the schedule's peak with
# learning_rate_schedule_steps=-1: 0.2.3's is base.yml's steps=150001 (the reference's schedule, as the check says),
# 0.2.5's the run's own length (rl.yml's learning_rate is reached).
PEAKS = {"0.2.3": 9.8e-9, "0.2.5": 3e-6}
RELEASES = {
    version: Release(version, found.pins, found.train, PEAKS[version]) for version, found in cpu.RELEASES.items()
}
DEFAULT = RELEASES["0.2.3"]
VENV = DEFAULT.venv  # the benchmarks' venv


def pytest_collection_modifyitems(items):
    """The tier's marker (with workers, each module and release runs on one: tests/conftest.py)."""
    for item in items:
        if "/tests/maxtext_cpu/" in str(item.fspath):
            item.add_marker(pytest.mark.maxtext)


def script_env() -> dict[str, str]:
    """Where a test runs a MaxText script of its own: on the CPU, with the shim's sampler and the tier's compile cache
    (every program kept: on a CPU most compile in under JAX's default 1 s)."""
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "MAXTEXT_CPU_ROLLOUT": "1",
        "PYTHONPATH": str(SHIM),
        "JAX_COMPILATION_CACHE_DIR": str(COMPILE_CACHE),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def environment(release: Release = DEFAULT) -> dict:
    """The CPU environment (bootstrap/demo/cpu.py) of `release`, in its cached venv."""
    return cpu.environment(release.venv, release.version, release.pins)


def overrides(
    inputs: Path, num_batches: int = 4, release: Release = DEFAULT, heads: tuple[int, int] = cpu.HEADS
) -> list[str]:
    """What a user passes with --arg to run the shipped jobs on the tiny model (made with `heads`), on CPU."""
    return [
        *cpu.model_overrides(inputs, heads=heads),
        f"vars.num_batches={num_batches}",
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
        *(f"train.{setting}" for setting in release.train),
    ]


@pytest.fixture(scope="session")
def cpu_host(tmp_path_factory, gcs_emulator):
    """The loopback "VM": no TPU (JAX on CPU), no Hub (the Hugging Face cache is read offline), and the
    Cloud Storage emulator as its bucket."""
    env = HOST_ENV | EIGEN_ONE_THREAD | gcsemulator.client_env(gcs_emulator)
    with loopback_host(tmp_path_factory.mktemp("sshd"), env) as host:
        yield host


@pytest.fixture(scope="session", params=sorted(RELEASES))
def release(request) -> Release:
    """Each release, for a module that runs each (a module that runs one overrides this)."""
    return RELEASES[request.param]


def set_up(fab: Fab, release: Release, command=None) -> None:
    """`fab setup` of the release's cached venv (or `command`, the same through a stack), one test worker at a time:
    a venv that is not built yet is built by the first, found built by the others."""
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / f".{release.venv.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = (command or fab)("setup", timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


@contextmanager
def cpu_fab_at(host, tmp: Path, release: Release = DEFAULT, compile_cache: bool = True) -> Iterator[Fab]:
    """fab for the CPU tier, with its own folders in `tmp` ("VM" state, /dev/shm, runs) and the release's venv; train
    compiles into the tier's COMPILE_CACHE unless not `compile_cache` (then into the product's, beside the runs)."""
    state, server = hubstub.serve()
    token = "hf_cpu" + uuid.uuid4().hex
    state.tokens[token] = hubstub.Token()
    jobs = tmp / "jobs"
    write_test_jobs(jobs, tmp, [])
    edit_yaml(jobs / "pipeline.yaml", lambda data: data.update(environment=environment(release)))
    edit_yaml(jobs / "pipeline.yaml", lambda data: data["vm"].update(validate_args=True, check_environment=True))
    # the tier's tiny model is built to be wrong: greedy, it repeats a tag (a smoke rollout would stop it, rightly)
    edit_yaml(jobs / "pipeline.yaml", lambda data: data.update(health={"smoke": False}))
    if compile_cache:
        edit_yaml(jobs / "train.yaml", lambda data: data["args"].update(jax_cache_dir=str(COMPILE_CACHE)))
    try:
        yield Fab(host, tmp, token, jobs, state)
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def cpu_fab(cpu_host, tmp_path_factory, release: Release) -> Iterator[Fab]:
    with cpu_fab_at(cpu_host, tmp_path_factory.mktemp(f"cpu-{release.version}"), release) as fab:
        yield fab


REWARD = "rewards/train/score/mean"
BF16 = 2**-7  # relative resolution of a bfloat16 (8 significant bits), with room for rounding both ways
WANDB_PROJECT = "tpu-rl-cpu-tier"


def planned_schedule(fab: Fab, args: list[str]) -> Schedule:
    """The schedule `fab plan` shows for a run of `args` (the product's own prediction)."""
    plan = fab("plan", "--json", *args)
    assert plan.returncode == 0, plan.stderr
    (train,) = [job for job in json.loads(plan.stdout)["jobs"] if job["name"] == "train"]
    return Schedule(**{k: v for k, v in train["lr_schedule"].items() if k in Schedule.__dataclass_fields__})


def run_identity(fab: Fab, run: str) -> str:
    """The run's identity in the trackers, from its first start's record (as fab metrics copied the records)."""
    return attempts.run_identity([path.name for path in (fab.tmp / "runs" / run / "attempts").glob("*.json")])


def assert_logged_to_wandb_offline(fab: Fab, run: str, release: Release, why: str) -> dict[int, float]:
    """W&B's own run file of `run`, written offline on the "VM", holds the reward series `fab metrics` wrote
    (tunix logs a rollout's metrics one step early: metrics.py) under the run's name, its id the run's identity;
    train's log says `why` it went offline. The reward of each step logged."""
    train_log = (fab.job_dir(run, "train") / "log").read_text(errors="replace")
    assert f"[tpu-rl] W&B: {why}: logging offline in" in train_log, train_log[-3000:]
    (path,) = list((fab.tmp / "state" / "runs" / run / "wandb").rglob("run-*.wandb"))
    read = subprocess.run(
        [release.venv / "bin" / "python", HERE / "wandb_file.py", path], capture_output=True, text=True, check=True
    )
    found = json.loads(read.stdout)
    assert found["runs"] == [{"id": run_identity(fab, run), "name": run, "project": WANDB_PROJECT}]
    with (fab.tmp / "runs" / run / "metrics.csv").open() as f:
        shown = {int(row["step"]): float(row[REWARD]) for row in csv.DictReader(f) if row[REWARD]}
    logged = {row["_step"] + 1: row[REWARD] for row in found["history"] if REWARD in row}
    assert shown and logged.keys() == shown.keys()
    assert all(logged[step] == pytest.approx(shown[step], rel=1e-6) for step in shown), (logged, shown)
    return logged


__all__ = ["REPO", "Release", "overrides"]
