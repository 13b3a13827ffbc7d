"""What each stage takes before any run of this shape was measured: public figures and the chips' own limits, each
with its source (collected 2026-12-04). Every figure here is a bound, low and high; the estimate says so.

Train follows the work asked for. A step generates its completions (batch_size x rl.num_generations, each up to
max_target_length - max_prefill_predict_length new tokens) and trains on them; an eval generates its problems'
completions (num_test_batches x eval_batch_size x num_eval_passes). Generating is bound two ways, whichever is
slower: one sequence's tokens come no faster than the weights can be read from HBM once a token, and all of them
no faster than vLLM-on-TPU's published throughput. Training's tokens go at MaxText's published training rate.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Chip:
    """One TPU generation's limits, as JAX names its chips."""

    name: str
    bf16_tflops: float
    hbm_tb_s: float
    source: str


CHIPS = {
    "TPU v6 lite": Chip("v6e", 918, 1.6, "Cloud TPU v6e documentation: 918 TFLOPs bf16, 1.6 TB/s HBM a chip"),
    "TPU v5 lite": Chip("v5e", 197, 0.819, "Cloud TPU v5e documentation: 197 TFLOPs bf16, 819 GB/s HBM a chip"),
}
V6E = CHIPS["TPU v6 lite"]
# vLLM on TPU, Llama 3.1 8B rollouts on a v6e-4: 3,872-5,202 output tokens/s (marin's public logbook); per chip
ROLLOUT_TOKENS_S_PER_CHIP = (3872 / 4, 5202 / 4)
# MaxText Llama 3.1 8B training on a v6e-8: 7,139 tokens/s a chip, about 45% MFU (AI-Hypercomputer/tpu-recipes)
TRAIN_TOKENS_S_PER_CHIP = 7139
TRAIN_PASSES = 4 / 3  # the policy's forward and backward, and the reference model's forward (a third of it)
DECODE_SHARE_OF_HBM_BOUND = (0.25, 0.5)  # what a served model reaches of one sequence's HBM bound (assumed)
COMPLETION_SHARE = (0.25, 1.0)  # completions end at their end of turn: a quarter of their budget, or all of it
START_UP_S = (120, 480)  # load the converted model, compile trainer and sampler, vLLM's warm-up (no public figure)
SAVE_S = (5, 30)  # what an async checkpoint save holds training up: the weights' and Adam's host copy (assumed)
SYNC_S = (0.1, 1.0)  # a step's weight sync from trainer to sampler, on the same chips (assumed)
CHECKPOINT_PERIOD = 50  # rl.yml's, where train sets none
MODEL_GB = 16.1  # Llama 3.1 8B Instruct's safetensors (bf16): what prefetch fetches and export writes

LLAMA_8B = 8.03e9  # the figures below are for Llama 3.1 8B; another model's scale by its parameters


def stage(name: str, parameters: int | None) -> tuple[float, float, str]:
    """A stage other than train, before any run measured it: (low s, high s, source). What moves the model's bytes
    (prefetch, convert, export, the copies) scales with its size; a fixed start of each process stays."""
    share = (parameters or LLAMA_8B) / LLAMA_8B
    gb = MODEL_GB * share
    size = f"{gb:.3g} GB" + ("" if parameters else " (the 8B's: the model's size is unknown)")
    bounds = {
        "setup": (300, 1800, "a bound: maxtext[tpu-post-train] and vLLM, tpu-inference and tunix from GitHub pins"),
        "prefetch": (5 + gb * GB / 500e6, 30 + gb * GB / 100e6, f"{size} from the Hub at 100-500 MB/s (a bound)"),
        "convert": (10 + 150 * share, 60 + 600 * share, "the public guide: about 5 minutes for the 8B, by size"),
        "export": (10 + 140 * share, 120 + 480 * share, f"a bound: to_huggingface, then {size} written and hashed"),
        "publish-hub": (5 + gb * GB / 200e6, 30 + gb * GB / 50e6, f"{size} to the Hub at 50-200 MB/s (a bound)"),
        "publish-gcs": (2 + gb * GB / 1e9, 10 + gb * GB / 200e6, f"{size} to the bucket at 0.2-1 GB/s (a bound)"),
    }
    return bounds[name]


@dataclass(frozen=True)
class TrainWork:
    """What train's arguments ask for (estimate.work's sizes), and the run's length."""

    steps: int
    completions: float  # a step's: batch_size x rl.num_generations
    new_tokens: float
    sequence: float  # max_target_length: what a completion trains on, prompt included
    eval_batches: float
    eval_completions: float  # an eval batch's: eval_batch_size x num_eval_passes
    evals: int  # before training, during it, after it
    saves: int
    reward_s: float = 0.0  # the task's rewards on one completion (measured on this machine by task_check.py)
    sample_evals: int = 0  # the evals during training, each on the sample's batches (remote/eval_sample.py)
    sample_batches: float = 0.0


def train(
    work: TrainWork, chip_kind: str, chips: int, parameters: int | None
) -> tuple[float, float, str, tuple[float, float], dict[str, tuple[float, float]]] | None:
    """Train's seconds (low, high), how they were reached, its start-up's (low, high: loading, compiling and the
    eval before training, what every start pays again) and its parts (steps, evals, saves, start-up: low, high);
    None where a figure is missing (a chip or a model these figures do not cover)."""
    chip = CHIPS.get(chip_kind)
    if chip is None or not parameters or parameters < 0 or chips < 1:
        return None
    weights = parameters * 2  # served in bf16
    hbm = chip.hbm_tb_s * 1e12 * chips
    one_sequence = [hbm / weights * share for share in DECODE_SHARE_OF_HBM_BOUND]  # tokens/s, slow then fast
    scale = chip.hbm_tb_s / V6E.hbm_tb_s  # the published rates are v6e's; decode scales with HBM bandwidth
    all_sequences = [rate * chips * scale for rate in ROLLOUT_TOKENS_S_PER_CHIP]
    trained = TRAIN_TOKENS_S_PER_CHIP * chips * chip.bf16_tflops / V6E.bf16_tflops * 8e9 / parameters

    def generating(sequences: float, bound: int) -> float:
        """One batch's generation: `bound` 0 at the fast end of every figure, 1 at the slow end."""
        tokens, fast = work.new_tokens * COMPLETION_SHARE[bound], 1 - bound
        return max(tokens / one_sequence[fast], sequences * tokens / all_sequences[fast])

    ends = []
    for bound in (0, 1):
        update = work.completions * work.sequence * TRAIN_PASSES / trained * (1 + bound)  # half the rate at worst
        rewards = work.reward_s * (1 + bound)  # the VM's host may be slower than this machine
        step = generating(work.completions, bound) + update + SYNC_S[bound] + work.completions * rewards
        batch = generating(work.eval_completions, bound) + work.eval_completions * rewards
        evaluation = work.eval_batches * batch
        parts = {
            "steps": work.steps * step,
            "evals": work.evals * evaluation + work.sample_evals * work.sample_batches * batch,
            "saves": work.saves * SAVE_S[bound],
            "startup": START_UP_S[bound],
        }
        ends.append((sum(parts.values()), step, evaluation, parts))
    (low, step_low, eval_low, parts_low), (high, step_high, eval_high, parts_high) = ends
    sampled = f" and {work.sample_evals} during training" if work.sample_evals else ""
    sampled += " on a sample" if work.sample_evals and work.sample_batches < work.eval_batches else ""
    how = (
        f"{work.steps} steps x {step_low:.1f}-{step_high:.1f} s, {work.evals} evals x {eval_low:.0f}-{eval_high:.0f} s"
        f"{sampled}, start-up {START_UP_S[0] // 60}-{START_UP_S[1] // 60} min, {work.saves} saves: {chip.name} limits, "
        "vLLM-on-TPU and MaxText published rates (a bound)"
        + (
            f"; the task's rewards {work.reward_s * 1e6:,.0f} µs a completion, as measured here"
            if work.reward_s
            else ""
        )
    )
    parts = {name: (parts_low[name], parts_high[name]) for name in parts_low}
    return low, high, how, (START_UP_S[0] + eval_low, START_UP_S[1] + eval_high), parts
