"""A plain-JAX rollout for train_rl on CPU, in place of MaxText's vLLM rollout (test environment only).

tunix calls it through the `rollout_engine` hook for BaseRollout subclasses, which train_rl
takes when `use_standalone_converter=true` (0.2.3) or always (0.2.4 on). It samples from the weights
the trainer updates, with a key-value cache (llama_decode.py): the prompt in one pass, then one column per token.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

import jax.numpy as jnp
import llama_decode  # beside this file, on the shim's PYTHONPATH
import numpy as np
from flax import nnx
from tunix.generate import tokenizer_adapter
from tunix.rl import common
from tunix.rl.rollout import base_rollout


def _seed(prompts) -> int:
    """Sampling seeded by what is sampled for, not by how many calls came before: a resumed run samples its
    steps as the run that was never lost did, so what differs between them is MaxText's and tunix's doing."""
    digest = hashlib.sha256("\0".join(str(p) for p in prompts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _sample(rng, probs):
    """One token from `probs`; from weights gone NaN (a diverged run), token 0, as a served model samples on where
    nothing crashes, and the trainer's loss says it."""
    return rng.choice(len(probs), p=probs / probs.sum()) if np.isfinite(probs).all() and probs.sum() > 0 else 0


PREFILL_STEP = 16  # the prompt columns a generate reads: a multiple of this, or all of them (a compile per length)


def _masks_padding(model, pad: int) -> bool:
    """Whether the trainer's forward pass keeps padding out of attention, as the sampler must too: tunix gives its
    segment ids to a model whose __call__ takes `segment_ids` or **kwargs (MaxText 0.2.5's adapter); an older adapter
    makes them from its own pad id."""
    try:
        taken = inspect.signature(model.__call__).parameters.values()
    except (TypeError, ValueError):
        taken = []
    takes_segments = any(p.name == "segment_ids" or p.kind is inspect.Parameter.VAR_KEYWORD for p in taken)
    return takes_segments or getattr(model, "_pad_id", None) == pad


class MaxTextVllmRollout(base_rollout.BaseRollout):
    """The name train_rl imports: greedy or temperature sampling (numpy) from a JAX forward pass with a cache."""

    def __init__(self, rollout_actor: Any, tokenizer: Any, mesh=None, rollout_config=None, maxtext_config=None, **_):
        self._model = rollout_actor
        if not isinstance(tokenizer, tokenizer_adapter.TokenizerAdapter):
            tokenizer = tokenizer_adapter.TokenizerAdapter(tokenizer)
        self._tokenizer = tokenizer

    def generate(self, prompts, rollout_config, **kwargs) -> base_rollout.RolloutOutput:
        if isinstance(prompts, str):
            prompts = [prompts]
        prompt_len, new_tokens = rollout_config.max_prompt_length, max(1, rollout_config.max_tokens_to_generate)
        pad, eos = self.pad_id(), self.eos_id()
        stops = {eos, *(rollout_config.eos_tokens or [])}
        buffer = np.full((len(prompts), prompt_len + new_tokens), pad, dtype=np.int32)
        for row, prompt in enumerate(prompts):
            ids = self._tokenizer.encode(prompt)[-prompt_len:]
            buffer[row, prompt_len - len(ids) : prompt_len] = ids
        finished = np.zeros(len(prompts), dtype=bool)
        logprobs = np.zeros((len(prompts), new_tokens), dtype=np.float32)
        temperature = float(rollout_config.temperature or 0.0)
        rng = np.random.default_rng(_seed(prompts))
        params = llama_decode.weights(nnx.state(self._model))  # this call's weights: the trainer updates them
        shape = llama_decode.Shape.of(self._model.base.config)
        # the first column any prompt uses; 0 (only the future left out) if the model does not mask the padding
        masks_padding = _masks_padding(self._model, pad)
        first = int((buffer[:, :prompt_len] != pad).argmax(axis=1).min()) if masks_padding else 0
        prefill = min(prompt_len, -(-(prompt_len - first) // PREFILL_STEP) * PREFILL_STEP)
        window = buffer[:, prompt_len - prefill :]  # a view: the tokens chosen are written into buffer
        cache = llama_decode.empty_cache(params, len(prompts), window.shape[1], shape)
        for step in range(new_tokens):
            start, end = (0, prefill) if step == 0 else (prefill + step - 1, prefill + step)
            real = window != pad
            positions = np.maximum(np.cumsum(real, axis=1) - 1, 0)[:, start:end].astype(np.int32)
            segments = real if masks_padding else np.ones_like(real)  # MaxText's decoder_segment_ids: pads get 0
            logits, cache = llama_decode.forward(
                params, cache, jnp.asarray(window[:, start:end]), jnp.asarray(positions), start, segments, shape=shape
            )
            log_probs = np.asarray(logits) - np.logaddexp.reduce(np.asarray(logits), axis=-1, keepdims=True)
            if temperature > 0:
                scaled = log_probs / temperature
                probs = np.exp(scaled - np.logaddexp.reduce(scaled, axis=-1, keepdims=True))
                chosen = np.array([_sample(rng, p) for p in probs], dtype=np.int32)
            else:
                chosen = log_probs.argmax(axis=-1).astype(np.int32)
            chosen = np.where(finished, pad, chosen)
            window[:, prefill + step] = chosen
            logprobs[:, step] = log_probs[np.arange(len(prompts)), chosen]
            finished |= np.isin(chosen, list(stops))
            if finished.all():
                break
        tokens, texts, token_logprobs = [], [], []
        for row in range(len(prompts)):
            generated = buffer[row, prompt_len:]
            ends = np.flatnonzero(np.isin(generated, list(stops)))
            length = int(ends[0]) + 1 if ends.size else new_tokens  # a row with no stop ran every step
            tokens.append(generated[:length].copy())
            token_logprobs.append(logprobs[row, :length].copy())
            texts.append(self._tokenizer.decode(generated[:length].tolist()))
        return base_rollout.RolloutOutput(
            text=texts,
            logits=[np.zeros((len(t), 1), dtype=np.float32) for t in tokens],
            tokens=tokens,
            left_padded_prompt_tokens=buffer[:, :prompt_len].copy(),
            logprobs=token_logprobs if rollout_config.return_logprobs else None,
        )

    def get_per_token_logps(self, prompt_tokens, completion_tokens, completion_mask=None):
        graphdef, state = nnx.split(self._model)
        return common.compute_per_token_logps(
            graphdef,
            state,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            pad_id=self.pad_id(),
            eos_id=self.eos_id(),
            stop_gradient=True,
            return_logits=False,
        )

    def update_params(self, params, filter_types=None) -> None:
        """The sampler shares the trainer's model object, so new weights are already here."""
        if params is not None and self._model is not None:
            nnx.update(self._model, params)

    def pad_id(self) -> int:
        return self._tokenizer.pad_id()

    def eos_id(self) -> int:
        return self._tokenizer.eos_id()

    def model(self) -> Any:
        return self._model
