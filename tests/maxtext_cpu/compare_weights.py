"""What training did to the weights, and what export shipped: the input model, the actor checkpoints
and the Hugging Face export, read independently of MaxText's converters.

    PYTHON compare_weights.py INPUT_MODEL_DIR ACTOR_DIR EXPORT_DIR    # PYTHON: the CPU venv; ACTOR_DIR may be gs://

Prints one JSON object:
- "steps": for each saved actor step, the optimizer's update count and the learning rate it used
  for that update (optax's inject_hyperparams keeps it in the optimizer state), and the export's
  largest difference from that step's weights ("export_vs", in the units below);
- "tensors": for every tensor of the export, its largest change from the input model and its
  largest difference from the last and from the first actor checkpoint, in units of bf16 tolerance
  (1.0: at the edge of what bf16 rounding explains); "dtypes": the export's.
The checkpoint's layout (scanned layers, query scaled by 1/sqrt(head_dim), RoPE halves interleaved)
is mapped to Hugging Face names here, from the layouts themselves, not through MaxText's code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from safetensors import safe_open

RTOL, ATOL = 2**-7, 1e-4  # bf16 keeps 8 significant bits


def safetensors(folder: Path) -> tuple[dict[str, np.ndarray], set[str]]:
    out, dtypes = {}, set()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="flax") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                value = f.get_tensor(name)
                dtypes.add(str(value.dtype))
                out[name] = np.asarray(value, dtype=np.float32)
    return out, dtypes


def restore(path: epath.Path) -> dict:
    return ocp.PyTreeCheckpointer().restore(str(path))


def flat(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """The numbers of a restored tree by path (the model's random-number keys left out)."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            out |= flat(value, name)
        elif "rngs" not in name:
            out[name] = np.asarray(value, dtype=np.float32)
    return out


def hf_names(params: dict[str, np.ndarray], head_dim: int) -> dict[str, np.ndarray]:
    """The checkpoint's tensors under their Hugging Face names and shapes."""

    def p(name: str) -> np.ndarray:
        return params[f"base/{name}/value"]

    def halves(kernel: np.ndarray) -> np.ndarray:  # interleaved RoPE pairs -> HF's two halves
        return np.concatenate((kernel[..., ::2], kernel[..., 1::2]), axis=-1)

    out = {
        "model.embed_tokens.weight": p("token_embedder/embedding"),
        "model.norm.weight": p("decoder/decoder_norm/scale"),
        "lm_head.weight": p("decoder/logits_dense/kernel").T,
    }
    layers = "decoder/layers"
    for i in range(p(f"{layers}/mlp/wi_0/kernel").shape[1]):
        query = halves(p(f"{layers}/self_attention/query/kernel")[:, i]) * np.sqrt(head_dim)
        key = halves(p(f"{layers}/self_attention/key/kernel")[:, i])
        value = p(f"{layers}/self_attention/value/kernel")[:, i]
        attn_out = p(f"{layers}/self_attention/out/kernel")[:, i]
        hf = f"model.layers.{i}."
        out |= {
            hf + "self_attn.q_proj.weight": query.reshape(query.shape[0], -1).T,
            hf + "self_attn.k_proj.weight": key.reshape(key.shape[0], -1).T,
            hf + "self_attn.v_proj.weight": value.reshape(value.shape[0], -1).T,
            hf + "self_attn.o_proj.weight": attn_out.reshape(-1, attn_out.shape[-1]).T,
            hf + "mlp.gate_proj.weight": p(f"{layers}/mlp/wi_0/kernel")[:, i].T,
            hf + "mlp.up_proj.weight": p(f"{layers}/mlp/wi_1/kernel")[:, i].T,
            hf + "mlp.down_proj.weight": p(f"{layers}/mlp/wo/kernel")[:, i].T,
            hf + "input_layernorm.weight": p(f"{layers}/pre_self_attention_layer_norm/scale")[:, i],
            hf + "post_attention_layernorm.weight": p(f"{layers}/post_self_attention_layer_norm/scale")[:, i],
        }
    return out


def in_tolerances(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / (ATOL + RTOL |b|): above 1, more than bf16 rounding can explain."""
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b) / (ATOL + RTOL * np.abs(b))))


def main(source: Path, actor: epath.Path, export: Path) -> None:
    before, _ = safetensors(source)
    after, dtypes = safetensors(export)
    head_dim = json.loads((source / "config.json").read_text())["head_dim"]
    saved = sorted(int(p.name) for p in actor.iterdir() if p.name.isdigit())
    steps, params = {}, {}
    for step in saved:
        state = flat(restore(actor / str(step) / "optimizer_state"))
        lr = state["opt_state/hyperparams/learning_rate/value"]
        params[step] = hf_names(flat(restore(actor / str(step) / "model_params")), head_dim)
        export_vs = max(in_tolerances(after[name], params[step][name]) for name in after if name in params[step])
        steps[step] = {"count": int(state["opt_state/count/value"]), "lr": float(lr), "export_vs": export_vs}
    trained, first = params[saved[-1]], params[saved[0]]
    report = {
        "steps": steps,
        "dtypes": sorted(dtypes),
        "names_match": set(before) == set(after) == set(trained),
        "tensors": {
            name: {
                "moved": in_tolerances(after[name], before[name]),
                "vs_checkpoint": in_tolerances(after[name], trained[name]),
                "vs_first_checkpoint": in_tolerances(after[name], first[name]),
            }
            for name in sorted(after)
            if name in before and name in trained
        },
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), epath.Path(sys.argv[2]), Path(sys.argv[3]))
