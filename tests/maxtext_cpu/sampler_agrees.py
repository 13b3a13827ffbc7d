"""The CPU sampler's log-probabilities are the trainer's, on a model whose attention matters.

    MAXTEXT_CPU_ROLLOUT=1 PYTHONPATH=shim PYTHON sampler_agrees.py TOKENIZER < ARGS.json    # PYTHON: the CPU venv

ARGS: train_rl's arguments for the tiny model. MaxText builds it with its own random initialization: the tier's
inputs have weights so small that attention is nearly uniform, and there a sampler that did not rotate its keys
agreed with the trainer as well as a right one. The rollout (shim/cpu_rollout.py) samples greedily from prompts of
different lengths, left-padded as train_rl gives them; tunix scores each sampled token with the model's full
forward pass, as the trainer does. Prints JSON: "most" and "mean", the largest and the mean difference of a
sampled token's log-probability, and "spread", the standard deviation of those log-probabilities.
"""

from __future__ import annotations

import json
import sys

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

PROMPTS = [  # lengths apart, so that the rows' padding differs
    "What is 7 times 6?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
]


def differences(tokenizer_path: str, args: list[str]) -> dict:
    tokenizer = tokenizer_adapter.TokenizerAdapter(AutoTokenizer.from_pretrained(tokenizer_path))
    config = config_of(args)
    model = TunixMaxTextAdapter(model_creation_utils.from_config(config, rngs=nnx.Rngs(0)), pad_id=tokenizer.pad_id())
    rollout = MaxTextVllmRollout(model, tokenizer)
    settings = base_rollout.RolloutConfig(
        max_prompt_length=config.max_prefill_predict_length,
        max_tokens_to_generate=config.max_target_length - config.max_prefill_predict_length,
        temperature=0.0,
        return_logprobs=True,
    )
    sampled = rollout.generate(PROMPTS, settings)
    width = max(len(tokens) for tokens in sampled.tokens)
    completions = np.full((len(PROMPTS), width), rollout.pad_id(), dtype=np.int32)
    for row, tokens in enumerate(sampled.tokens):
        completions[row, : len(tokens)] = tokens
    scored = np.asarray(rollout.get_per_token_logps(jnp.asarray(sampled.left_padded_prompt_tokens), completions))
    sampler = np.concatenate(sampled.logprobs)
    trainer = np.concatenate([scored[row, : len(tokens)] for row, tokens in enumerate(sampled.tokens)])
    gap = np.abs(sampler - trainer)
    return {"most": float(gap.max()), "mean": float(gap.mean()), "spread": float(trainer.std()), "tokens": gap.size}


if __name__ == "__main__":
    print(json.dumps(differences(sys.argv[1], json.load(sys.stdin))))
