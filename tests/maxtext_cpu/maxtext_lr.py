"""The learning rate of every update of RL runs, as MaxText's own code builds it.

    MAXTEXT_CPU_ROLLOUT=1 PYTHONPATH=shim PYTHON maxtext_lr.py < CASES.json    # PYTHON: the CPU venv

CASES is a JSON list of train_rl argument lists. For each, MaxText's pyconfig reads the arguments
as train_rl would (its config file and config class, and their rewrite of an unset schedule length),
MaxText counts the run's updates (0.2.3: train_rl.get_max_train_steps; 0.2.4 on: the config's own
train_steps) and train_rl builds its optimizer (utils_rl.get_optimizer); the optimizer is then stepped
through the whole run with float32 parameters. Prints a JSON list of
{"train_steps": N, "rates": [the learning rate of update 1, ..., of update N]}.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import jax.numpy as jnp
import optax
from maxtext.configs import pyconfig, types
from maxtext.trainers.post_train.rl import train_rl, utils_rl


def config_of(args: list[str]):
    """train_rl's config from its arguments, as the installed train_rl reads them."""
    argv = [importlib.util.find_spec(train_rl.__name__).origin, *args]
    if hasattr(types, "RLConfig"):  # 0.2.4 on: train_rl's own config class, which counts the updates
        return pyconfig.initialize_pydantic(argv, config_class=types.RLConfig)
    return pyconfig.initialize(argv)


def optimizer_of(args: list[str]) -> tuple[int, optax.GradientTransformation]:
    """(the run's updates, its optimizer), as the installed train_rl makes them."""
    config = config_of(args)
    if hasattr(types, "RLConfig"):
        return config.train_steps, utils_rl.get_optimizer(config)
    steps = train_rl.get_max_train_steps(config)
    return steps, utils_rl.get_optimizer(config, steps)


def rates(args: list[str]) -> dict:
    steps, optimizer = optimizer_of(args)
    params = {"w": jnp.zeros(1, jnp.float32)}
    state, used = optimizer.init(params), []
    for _ in range(steps):
        _, state = optimizer.update({"w": jnp.ones(1, jnp.float32)}, state, params)
        used.append(float(state.hyperparams["learning_rate"]))  # what this update was made with
    return {"train_steps": steps, "rates": used}


if __name__ == "__main__":
    print(json.dumps([rates(case) for case in json.load(sys.stdin)]))
