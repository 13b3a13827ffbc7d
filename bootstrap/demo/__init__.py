"""`fab demo`: the whole pipeline on this machine's CPU, on a tiny model that GRPO visibly makes better.

Its parts run in the CPU environment the demo builds (never imported by fab itself): the tiny inputs'
generators and the CPU sampler that stands in for vLLM (shim/). The CPU tier's tests use the same parts.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim"  # on PYTHONPATH: MaxText's vLLM rollout replaced by a CPU sampler (shim/sitecustomize.py)
MAKE_INPUTS = HERE / "make_inputs.py"  # the tiny model, tokenizer, problems and Hub cache
MAKE_LEARNABLE_INPUTS = HERE / "make_learnable_inputs.py"  # the same, with a model GRPO can make better
REQUIREMENTS = HERE / "requirements-cpu.txt"  # MaxText's CPU dependencies, pinned
