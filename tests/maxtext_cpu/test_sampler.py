"""The CPU sampler (bootstrap/demo/shim/: a key-value-cache decoder in place of vLLM) computes the trainer's model, for
each release in conftest.RELEASES: each token it samples has the log-probability MaxText's own forward pass gives it.

In float32, on a model of MaxText's random initialization with each weight perturbed (sampler_agrees.py says why not
the tier's inputs) and 4 query heads sharing 2 key-value heads (so that their grouping shows), what is left is float32
rounding. A sampler without Llama 3.1's rotary rescaling missed by over 300 times the limit; one that grouped the heads
wrongly, swapped the norms or dropped the final norm's scale, by over 8,000 times."""

from __future__ import annotations

import json
import subprocess

from bootstrap.demo import MAKE_INPUTS, cpu
from tests.loopback import Fab
from tests.maxtext_cpu.conftest import HERE, Release, script_env, set_up

FLOAT32 = 1e-4  # the most a log-probability may differ by: float32 rounding over 32 layers, with room


def test_the_cpu_sampler_gives_each_token_the_log_probability_maxtext_does(cpu_fab: Fab, release: Release):
    set_up(cpu_fab, release)
    inputs = cpu_fab.tmp / "sampler-inputs"
    subprocess.run([release.venv / "bin" / "python", MAKE_INPUTS, inputs], check=True, capture_output=True)
    args = [
        "model_name=llama3.1-8b-Instruct",
        *cpu.widths((4, 2)),
        "max_prefill_predict_length=128",
        "max_target_length=160",
        "dtype=float32",
        "weight_dtype=float32",
        *release.train,
    ]
    agrees = subprocess.run(
        [release.venv / "bin" / "python", HERE / "sampler_agrees.py", inputs / "tokenizer"],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        env=script_env(),
    )
    assert agrees.returncode == 0, agrees.stderr[-3000:]
    gaps = json.loads(agrees.stdout)
    assert gaps["tokens"] >= 30 and gaps["spread"] > 0.1, gaps  # tokens enough, their log-probabilities far apart
    assert gaps["most"] < FLOAT32, gaps
