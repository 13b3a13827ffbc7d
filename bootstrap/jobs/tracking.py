"""What results.wandb changes in the plan: the package the environment adds, train's W&B settings and its key.

tunix, MaxText's RL trainer, logs every scalar it writes to TensorBoard to W&B too whenever `wandb` imports. So
W&B is off in train unless asked for (WANDB_MODE=disabled: nothing leaves the VM for a third party by default),
and on, the launcher names the W&B run after this run (remote/wandb_run.py).
"""

from __future__ import annotations

import re

from .. import secrets
from ..remote import wandb_run
from ..remote.jobrunner import Layout
from .schedule import RL_TRAINER
from .spec import EnvironmentSpec, PipelineSpec, ResultsSpec

# The W&B the environment gets when the user's packages name none: a floor, as the shipped install resolves each
# package to its lowest version (environment.install_options); the CPU tier runs this one.
WANDB_PACKAGE = "wandb>=0.31.0"
KEY = "WANDB_API_KEY"


def with_wandb(environment: EnvironmentSpec, results: ResultsSpec) -> None:
    """Add W&B to the environment's packages when results.wandb is on and none of them is W&B already."""
    named = {re.match(r"[A-Za-z0-9._-]*", package).group().lower() for package in environment.packages}
    if results.wandb and "wandb" not in named:
        environment.packages = [*environment.packages, WANDB_PACKAGE]


def trainer_env(spec: PipelineSpec, module: str | None, run_name: str) -> dict[str, str]:
    """The RL trainer's W&B settings: off, or the project and this run's name, its files in the run's folder on
    the VM (kept there when W&B logs offline); nothing for any other job."""
    if module != RL_TRAINER:
        return {}
    if not spec.results.wandb:
        return {"WANDB_MODE": "disabled"}
    runs = Layout(spec.vm.state_dir).runs
    return {
        wandb_run.PROJECT_ENV: spec.results.wandb,
        wandb_run.RUN_ENV: run_name,
        "WANDB_DIR": f"{runs if runs.startswith('/') else f'~/{runs}'}/{run_name}/wandb",
        "WANDB_CONSOLE": "off",  # W&B would upload train's console unredacted: the log stays on the VM, redacted
    }


def optional_secrets(spec: PipelineSpec, module: str | None) -> list[str]:
    """The secrets a job gets when the VM holds them and runs without otherwise: the W&B key, for train."""
    return [KEY] if module == RL_TRAINER and spec.results.wandb else []


def secret_values(results: ResultsSpec) -> dict[str, str]:
    """The W&B key to store on the VM when results.wandb is on: the one set here, or none (empty: a key stored
    there before is replaced, and W&B logs offline)."""
    return {KEY: secrets.lookup(KEY) or ""} if results.wandb else {}
