"""Two exported models, tensor by tensor: how many are bit-identical, and the largest difference.

PYTHON same_weights.py EXPORT_A EXPORT_B    # PYTHON: the tier's venv (numpy, ml_dtypes, safetensors)
"""

import json
import sys
from pathlib import Path

import ml_dtypes  # noqa: F401  numpy learns bfloat16, the exports' dtype
import numpy as np
from safetensors.numpy import load_file


def tensors(folder: str) -> dict[str, np.ndarray]:
    found = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        found |= load_file(str(path))
    return found


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
diffs = {name: float(np.max(np.abs(a[name].astype(np.float32) - b[name].astype(np.float32)))) for name in a}
print(json.dumps({"tensors": len(a), "identical": sum(d == 0 for d in diffs.values()), "largest": max(diffs.values())}))
