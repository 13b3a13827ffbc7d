"""Test environment only: with MAXTEXT_CPU_ROLLOUT=1, train_rl's vLLM rollout is a plain JAX sampler.

MaxText 0.2.3's train_rl imports its vLLM rollout at module level (vLLM needs a TPU). On
PYTHONPATH, this file makes that one import load cpu_rollout.py instead; the trainer, model,
data, rewards, eval, checkpointing and TensorBoard stay the real code. Nothing in
site-packages is edited.
"""

import importlib.abc
import importlib.util
import os
import sys

ROLLOUT_MODULE = "maxtext.integration.vllm.maxtext_vllm_rollout"
REPLACEMENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_rollout.py")


class _CpuRolloutFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == ROLLOUT_MODULE:
            return importlib.util.spec_from_file_location(fullname, REPLACEMENT)
        return None


if os.environ.get("MAXTEXT_CPU_ROLLOUT") == "1":
    sys.meta_path.insert(0, _CpuRolloutFinder())
