"""A model broken on purpose, as a bad conversion or a bad pin can break one (test environment only):

    python break_model.py MODEL_DIR OUT_DIR

Its output layer made to give one token, the same, after any context: every answer is that token again and again.
"""

import shutil
import sys
from pathlib import Path

from safetensors.numpy import load_file, save_file

source, out = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(source, out)
weights = load_file(source / "model.safetensors")
head = weights["lm_head.weight"]
head[:] = 0.0
head[100, :] = 1.0  # one token, whatever came before it
save_file(weights, out / "model.safetensors")
