"""The learning rate of every update of RL runs, as MaxText's own code builds it.

    MAXTEXT_CPU_ROLLOUT=1 PYTHONPATH=shim PYTHON maxtext_lr.py < CASES.json    # PYTHON: the CPU venv

CASES is a JSON list of train_rl argument lists. For each, MaxText's pyconfig reads the arguments
as train_rl would (its config file, 0.2.3's rewrite of an unset schedule length), train_rl counts the
run's updates (get_max_train_steps) and builds its optimizer (utils_rl.get_optimizer); the optimizer is
then stepped through the whole run with float32 parameters. Prints a JSON list of
{"train_steps": N, "rates": [the learning rate of update 1, ..., of update N]}.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import jax.numpy as jnp
from maxtext.configs import pyconfig
from maxtext.trainers.post_train.rl import train_rl, utils_rl


def rates(args: list[str]) -> dict:
    config = pyconfig.initialize([importlib.util.find_spec(train_rl.__name__).origin, *args])
    steps = train_rl.get_max_train_steps(config)
    optimizer = utils_rl.get_optimizer(config, steps)
    params = {"w": jnp.zeros(1, jnp.float32)}
    state, used = optimizer.init(params), []
    for _ in range(steps):
        _, state = optimizer.update({"w": jnp.ones(1, jnp.float32)}, state, params)
        used.append(float(state.hyperparams["learning_rate"]))  # what this update was made with
    return {"train_steps": steps, "rates": used}


if __name__ == "__main__":
    print(json.dumps([rates(case) for case in json.load(sys.stdin)]))
