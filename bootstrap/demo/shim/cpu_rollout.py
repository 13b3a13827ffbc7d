"""A plain-JAX rollout for train_rl on CPU, in place of MaxText's vLLM rollout (test environment only).

tunix calls it through the `rollout_engine` hook for BaseRollout subclasses, which train_rl
takes when `use_standalone_converter=true` (0.2.3) or always (0.2.4 on). It samples on the same
actor model the trainer updates, with one forward pass per generated token (no KV cache) over a window of
the buffer: slow, but small models on CPU need no more.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.generate import tokenizer_adapter
from tunix.rl import common
from tunix.rl.rollout import base_rollout


def _next_token_logits(graphdef):
    """The forward pass of the model `graphdef` describes, on its weights given each call: the model is walked
    once per generate, not once per token (nnx.jit's split and merge of every call took a third of the rollout)."""

    @jax.jit
    def logits_at(state, tokens, positions, index):
        logits, _ = nnx.merge(graphdef, state)(tokens, positions, None, None)
        return jax.lax.dynamic_index_in_dim(logits, index - 1, axis=1, keepdims=False)

    return logits_at


def _seed(prompts) -> int:
    """Sampling seeded by what is sampled for, not by how many calls came before: a resumed run samples its
    steps as the run that was never lost did, so what differs between them is MaxText's and tunix's doing."""
    digest = hashlib.sha256("\0".join(str(p) for p in prompts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _sample(rng, probs):
    """One token from `probs`; from weights gone NaN (a diverged run), token 0, as a served model samples on where
    nothing crashes, and the trainer's loss says it."""
    return rng.choice(len(probs), p=probs / probs.sum()) if np.isfinite(probs).all() and probs.sum() > 0 else 0


WINDOW_STEP = 16  # window lengths are multiples of this: a compile per length, not per token


def _window(first: int, index: int, length: int) -> tuple[int, int]:
    """The columns [start, end) of a buffer of `length` whose forward pass gives the logits at `index - 1` (the
    same up to float rounding): from `first` on, the columns before it being padding the model masks (a few more
    where the window meets the buffer's end), to `index`, rounded up to WINDOW_STEP columns the causal mask hides."""
    size = min(length, -(-(index - first) // WINDOW_STEP) * WINDOW_STEP)
    start = min(first, length - size)
    return start, start + size


class MaxTextVllmRollout(base_rollout.BaseRollout):
    """The name train_rl imports; the engine is a greedy or temperature sampler in JAX."""

    def __init__(self, rollout_actor: Any, tokenizer: Any, mesh=None, rollout_config=None, maxtext_config=None, **_):
        self._model = rollout_actor
        if not isinstance(tokenizer, tokenizer_adapter.TokenizerAdapter):
            tokenizer = tokenizer_adapter.TokenizerAdapter(tokenizer)
        self._tokenizer = tokenizer
        self._forward = None  # (the model's GraphDef, its forward pass), made at the first generate

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
        graphdef, state = nnx.split(self._model)  # this call's weights: the trainer updates them between calls
        if self._forward is None or self._forward[0] != graphdef:  # made again if the model's structure changed
            self._forward = (graphdef, _next_token_logits(graphdef))
        logits_at = self._forward[1]
        # the first column any prompt uses; 0 (only the future left out) if the model does not mask the padding
        masks_padding = getattr(self._model, "_pad_id", None) == pad  # MaxText's adapter: pads get segment 0
        first = int((buffer[:, :prompt_len] != pad).argmax(axis=1).min()) if masks_padding else 0
        windowed = jax.default_backend() == "cpu"  # on a chip a pass costs its launch, not its columns: one program
        for step in range(new_tokens):
            index = prompt_len + step
            start, end = _window(first, index, buffer.shape[1]) if windowed else (0, buffer.shape[1])
            window = buffer[:, start:end]
            mask = window != pad
            mask[:, index - start :] = False
            positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
            logits = np.asarray(
                logits_at(state, jnp.asarray(window), jnp.asarray(positions), index - start), dtype=np.float32
            )
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            if temperature > 0:
                scaled = log_probs / temperature
                probs = np.exp(scaled - np.logaddexp.reduce(scaled, axis=-1, keepdims=True))
                chosen = np.array([_sample(rng, p) for p in probs], dtype=np.int32)
            else:
                chosen = log_probs.argmax(axis=-1).astype(np.int32)
            chosen = np.where(finished, pad, chosen)
            buffer[:, index] = chosen
            logprobs[:, step] = log_probs[np.arange(len(prompts)), chosen]
            finished |= np.isin(chosen, list(stops))
            if finished.all():
                break
        tokens, texts, token_logprobs = [], [], []
        for row in range(len(prompts)):
            generated = buffer[row, prompt_len:]
            ends = np.flatnonzero(np.isin(generated, list(stops)))
            length = int(ends[0]) + 1 if ends.size else int((generated != pad).sum())
            length = max(length, 1)
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
