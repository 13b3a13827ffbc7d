"""MaxText's Llama 3.1 forward pass with a key-value cache, for the CPU sampler (test environment only).

MaxText's train-mode model has no cache, so sampling with it computes every column again for each new token; on
CPU that was half of a train job. This is the same arithmetic as MaxText's LlamaDecoderLayer in its configured
dtype (RMSNorm in float32, projections, LLaMA 3.1 rotary embedding, dot-product attention without a query scale,
since MaxText folds 1/sqrt(head_dim) into the query weights, and the SiLU MLP), on the weights the trainer holds,
once per column. Like vLLM beside the trainer on a TPU VM, it is a second implementation of the model: what it
samples is scored by the trainer's own forward pass, and the sampler-trainer agreement check compares the two.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

LAYER_WEIGHTS = ("attention_norm", "query", "key", "value", "out", "mlp_norm", "gate", "up", "down")
# The settings of MaxText's config that would change the function, at the values this decoder computes.
DEFAULTS = {
    "scan_layers": True,
    "dropout_rate": 0.0,
    "param_scan_axis": 1,
    "attn_logits_soft_cap": None,
    "final_logits_soft_cap": None,
    "float32_qk_product": False,
    "float32_logits": False,
    "activations_in_float32": False,
    "logits_dot_in_fp32": False,
    "logits_via_embedding": False,
    "quantization": "",
    "mlp_activations": ["silu", "linear"],
}
MASKED = -0.7 * float(np.finfo(np.float32).max)  # MaxText's DEFAULT_MASK_VALUE


class Shape(NamedTuple):
    """The settings of MaxText's config the arithmetic depends on (hashable: one compile per shape)."""

    dtype: Any
    epsilon: float
    rope_min: float
    rope_max: float
    rope_scaled: bool

    @classmethod
    def of(cls, config) -> Shape:
        """From the model's MaxText config; only the Llama 3.1 decoder, with MaxText's defaults, is written here."""
        block = str(config.decoder_block).lower()
        if "llama2" not in block or not config.model_name.startswith("llama3.1"):
            raise NotImplementedError(f"the CPU sampler decodes Llama 3.1 only, not {config.model_name} ({block})")
        changed = {key: getattr(config, key) for key, value in DEFAULTS.items() if getattr(config, key) != value}
        if changed:
            raise NotImplementedError(f"the CPU sampler computes MaxText's defaults, not {changed}")
        dtype = jnp.dtype(config.dtype)
        return cls(
            dtype,
            config.normalization_layer_epsilon,
            config.rope_min_timescale,
            config.rope_max_timescale,
            bool(config.rope_use_scale),
        )


def weights(state) -> dict[str, jax.Array]:
    """The arrays of the model's nnx state (MaxText 0.2.3 and 0.2.5 lay them out alike); the layers' are stacked on
    axis 1 (param_scan_axis)."""
    decoder = state["base"]["decoder"]
    layers, attention, mlp = decoder["layers"], decoder["layers"]["self_attention"], decoder["layers"]["mlp"]
    return {
        "embedding": state["base"]["token_embedder"]["embedding"].value,
        "final_norm": decoder["decoder_norm"]["scale"].value,
        "logits": decoder["logits_dense"]["kernel"].value,
        "attention_norm": layers["pre_self_attention_layer_norm"]["scale"].value,
        "query": attention["query"]["kernel"].value,
        "key": attention["key"]["kernel"].value,
        "value": attention["value"]["kernel"].value,
        "out": attention["out"]["kernel"].value,
        "mlp_norm": layers["post_self_attention_layer_norm"]["scale"].value,
        "gate": mlp["wi_0"]["kernel"].value,
        "up": mlp["wi_1"]["kernel"].value,
        "down": mlp["wo"]["kernel"].value,
    }


def empty_cache(params: dict[str, jax.Array], rows: int, columns: int, shape: Shape) -> tuple[jax.Array, jax.Array]:
    """Keys and values for `columns` columns of `rows` rows, each [layers, rows, columns, kv_heads, head_dim]."""
    _, layers, kv_heads, head_dim = params["key"].shape
    return tuple(jnp.zeros((layers, rows, columns, kv_heads, head_dim), shape.dtype) for _ in range(2))


def _rms_norm(x, scale, shape: Shape):
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + shape.epsilon)).astype(
        shape.dtype
    )
    return normed * scale.astype(shape.dtype)


def _llama31_frequency(frequency):
    """Llama 3.1's rescaling of the rotary frequencies (factor 8 beyond 8,192 positions' wavelengths)."""
    wavelength = 2 * math.pi / frequency
    smooth = (8192 / wavelength - 1) / 3
    blended = (1 - smooth) * frequency / 8 + smooth * frequency
    return jnp.where(wavelength < 2048, frequency, jnp.where(wavelength > 8192, frequency / 8, blended))


def _rotary(x, positions, shape: Shape):
    """MaxText's LLaMARotaryEmbedding: interleaved pairs, positions [rows, columns]."""
    dims = x.shape[-1]
    fraction = jnp.repeat(2 * jnp.arange(dims // 2) / dims, 2)
    timescale = shape.rope_min * (shape.rope_max / shape.rope_min) ** fraction
    if shape.rope_scaled:
        timescale = 1.0 / _llama31_frequency(1.0 / timescale)
    odd = jnp.arange(dims) % 2 == 1
    partner = jnp.where(odd, jnp.roll(x, 1, axis=-1), jnp.roll(x, -1, axis=-1))
    angle = positions[:, :, None, None] / timescale
    sign = jnp.where(odd, 1, -1)
    return (x * jnp.cos(angle) + partner * jnp.sin(angle) * sign).astype(shape.dtype)


def _attention(query, keys, values, visible, dtype):
    """Grouped-query dot-product attention of MaxText's attention_op, in `dtype`; visible: [rows, columns, keys]."""
    rows, columns, heads, head_dim = query.shape
    kv_heads = keys.shape[2]
    grouped = query.reshape(rows, columns, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("btkgd,bskd->bkgts", grouped, keys)
    scores = jnp.where(visible[:, None, None], scores, jnp.asarray(MASKED, scores.dtype))
    exps = jnp.exp(scores - scores.max(axis=-1, keepdims=True))
    sums = exps.sum(axis=-1).reshape(rows, heads, columns).transpose(0, 2, 1)[..., None]
    out = jnp.einsum("bkgts,bskd->btkgd", exps, values).reshape(rows, columns, heads, head_dim)
    return (out / sums).astype(dtype)


@functools.partial(jax.jit, static_argnames="shape", donate_argnames="cache")
def forward(params, cache, tokens, positions, start, segments, shape: Shape):
    """The logits of the last of `tokens` [rows, columns], which sit at cache columns [start, start + columns);
    their keys and values go into `cache`, updated in place. segments [rows, cache columns]: each column's segment
    (MaxText's decoder_segment_ids); a column sees the columns up to its own in its segment. Returns (logits, cache)."""
    dtype = shape.dtype
    x = params["embedding"].astype(dtype)[tokens]
    columns = tokens.shape[1]
    causal = jnp.arange(cache[0].shape[2])[None, :] <= (start + jnp.arange(columns))[:, None]
    own = jax.lax.dynamic_slice_in_dim(segments, start, columns, axis=1)
    visible = causal[None] & (own[:, :, None] == segments[:, None, :])

    def layer(carry, w):
        x, keys, values, index = carry
        h = _rms_norm(x, w["attention_norm"], shape)
        query = _rotary(jnp.einsum("bte,ehd->bthd", h, w["query"].astype(dtype)), positions, shape)
        key = _rotary(jnp.einsum("bte,ehd->bthd", h, w["key"].astype(dtype)), positions, shape)
        value = jnp.einsum("bte,ehd->bthd", h, w["value"].astype(dtype))
        keys = jax.lax.dynamic_update_slice(keys, key[None], (index, 0, start, 0, 0))
        values = jax.lax.dynamic_update_slice(values, value[None], (index, 0, start, 0, 0))
        attended = _attention(query, keys[index], values[index], visible, dtype)
        x = x + jnp.einsum("bthd,hde->bte", attended, w["out"].astype(dtype))
        h = _rms_norm(x, w["mlp_norm"], shape)
        gate = jax.nn.silu(jnp.einsum("bte,em->btm", h, w["gate"].astype(dtype)))
        hidden = (gate * jnp.einsum("bte,em->btm", h, w["up"].astype(dtype))).astype(dtype)
        return (x + jnp.einsum("btm,me->bte", hidden, w["down"].astype(dtype)), keys, values, index + 1), None

    layers = {name: jnp.moveaxis(params[name], 1, 0) for name in LAYER_WEIGHTS}  # scanned on axis 0
    (x, keys, values, _), _ = jax.lax.scan(layer, (x, *cache, 0), layers)
    last = _rms_norm(x[:, -1], params["final_norm"], shape)
    return jnp.einsum("be,ev->bv", last, params["logits"].astype(dtype)).astype(jnp.float32), (keys, values)
