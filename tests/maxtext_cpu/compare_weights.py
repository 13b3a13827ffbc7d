"""Compare a Hugging Face export with the model it came from, tensor by tensor.

    PYTHON compare_weights.py INPUT_MODEL_DIR EXPORT_DIR    # PYTHON: the CPU venv (safetensors, jax)

Exit 0 when both hold the same tensor names and shapes and every value agrees within
bf16 precision (the export is bfloat16; GRPO on a random model barely moves the weights).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from safetensors import safe_open

RTOL, ATOL = 2**-7, 1e-4  # bf16 keeps 8 significant bits


def tensors(folder: Path) -> dict[str, np.ndarray]:
    out, dtypes = {}, set()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="flax") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                value = f.get_tensor(name)
                dtypes.add(str(value.dtype))
                out[name] = np.asarray(value, dtype=np.float32)
    return out, dtypes


def main(source: Path, export: Path) -> int:
    before, _ = tensors(source)
    after, dtypes = tensors(export)
    if set(before) != set(after):
        print(
            f"names differ: only in input {sorted(set(before) - set(after))[:5]}, only in export {sorted(set(after) - set(before))[:5]}"
        )
        return 1
    bad = [n for n in before if before[n].shape != after[n].shape or not np.allclose(after[n], before[n], RTOL, ATOL)]
    for name in bad[:10]:
        diff = np.abs(after[name] - before[name]).max() if before[name].shape == after[name].shape else "shape"
        print(f"{name}: {before[name].shape} -> {after[name].shape}, max abs diff {diff}")
    if bad:
        return 1
    print(f"{len(before)} tensors equal within bf16 tolerance, dtype {','.join(sorted(dtypes))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
