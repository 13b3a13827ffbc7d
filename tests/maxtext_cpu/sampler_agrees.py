"""The CPU sampler's log-probabilities are the trainer's, on a model whose attention matters.

    MAXTEXT_CPU_ROLLOUT=1 PYTHONPATH=shim PYTHON sampler_agrees.py TOKENIZER < ARGS.json    # PYTHON: the CPU venv

ARGS: train_rl's arguments for the tiny model. MaxText builds it with its own random initialization, every weight
then scaled by 1 + 0.3 N(0, 1): the tier's inputs have weights so small that attention is nearly uniform (there a
sampler that did not rotate its keys agreed with the trainer as well as a right one), and MaxText's norm scales start
at ones (under which swapped or missing scales agree). The rollout (shim/cpu_rollout.py) samples from prompts of
different lengths, left-padded as train_rl gives them (greedily, then at temperature 1 beside a prompt cut to the
prompt area); tunix scores each sampled token with the model's full forward pass, as the trainer does. Prints
JSON: "most" and "mean", the largest and the mean difference of a sampled token's log-probability; "spread", the
standard deviation of those log-probabilities; "tokens", how many.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from maxtext.integration.tunix.tunix_adapter import TunixMaxTextAdapter
from maxtext.integration.vllm.maxtext_vllm_rollout import MaxTextVllmRollout  # the shim's, MAXTEXT_CPU_ROLLOUT=1
from maxtext.utils import model_creation_utils
from maxtext_lr import config_of
from transformers import AutoTokenizer
from tunix.generate import tokenizer_adapter
from tunix.rl.rollout import base_rollout

SHORT = [  # lengths apart, so that the rows' padding differs: the sampler reads only the columns they use
    "What is 7 times 6?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
]
LONG = " ".join(SHORT * 12)  # longer than the prompt area: cut to its last columns, and the sampler reads them all
BATCHES = [(SHORT, 0.0), ([LONG, *SHORT[:2]], 1.0)]  # (prompts, temperature): greedy, then sampled


def perturb(model: nnx.Module, seed: int = 1) -> None:
    """Every weight of `model` times 1 + 0.3 N(0, 1)."""
    leaves, tree = jax.tree.flatten(nnx.state(model, nnx.Param))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    scaled = [
        leaf * (1 + 0.3 * jax.random.normal(key, leaf.shape, leaf.dtype))
        for leaf, key in zip(leaves, keys, strict=True)
    ]
    nnx.update(model, jax.tree.unflatten(tree, scaled))


def gaps(rollout: MaxTextVllmRollout, prompts: list[str], settings) -> tuple[np.ndarray, np.ndarray]:
    """(|the sampler's log-probability - the trainer's|, the trainer's) of each token sampled for `prompts`."""
    sampled = rollout.generate(prompts, settings)
    completions = np.full((len(prompts), max(map(len, sampled.tokens))), rollout.pad_id(), dtype=np.int32)
    for row, tokens in enumerate(sampled.tokens):
        completions[row, : len(tokens)] = tokens
    scored = np.asarray(rollout.get_per_token_logps(jnp.asarray(sampled.left_padded_prompt_tokens), completions))
    trainer = np.concatenate([scored[row, : len(tokens)] for row, tokens in enumerate(sampled.tokens)])
    return np.abs(np.concatenate(sampled.logprobs) - trainer), trainer


def differences(tokenizer_path: str, args: list[str]) -> dict:
    tokenizer = tokenizer_adapter.TokenizerAdapter(AutoTokenizer.from_pretrained(tokenizer_path))
    config = config_of(args)
    model = TunixMaxTextAdapter(model_creation_utils.from_config(config, rngs=nnx.Rngs(0)), pad_id=tokenizer.pad_id())
    perturb(model)
    rollout = MaxTextVllmRollout(model, tokenizer)
    found, scores = [], []
    for prompts, temperature in BATCHES:
        settings = base_rollout.RolloutConfig(
            max_prompt_length=config.max_prefill_predict_length,
            max_tokens_to_generate=config.max_target_length - config.max_prefill_predict_length,
            temperature=temperature,
            return_logprobs=True,
        )
        gap, trainer = gaps(rollout, prompts, settings)
        found.append(gap)
        scores.append(trainer)
    gap, trainer = np.concatenate(found), np.concatenate(scores)
    return {"most": float(gap.max()), "mean": float(gap.mean()), "spread": float(trainer.std()), "tokens": gap.size}


if __name__ == "__main__":
    print(json.dumps(differences(sys.argv[1], json.load(sys.stdin))))
