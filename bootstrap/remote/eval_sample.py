"""Evals during training on a fixed sample of the test split; the evals before and after training stay whole.

MaxText's intermediate evals (every eval_interval steps, RLTrainingHooks in 0.2.3 to 0.2.5) run the whole test split
each time: on the default run, five of them cost more than its 50 steps. A trend needs far fewer problems than a
verdict: with SAMPLE_ENV set, each intermediate eval reads the split's first N batches, the same ones every time
(the split is read from its start at each eval), while the evals the result line compares (before and after
training) read it all. Standard library only; MaxText is imported as the hook goes in, in train's process.
"""

from __future__ import annotations

import functools
import itertools

SAMPLE_ENV = "TPU_RL_EVAL_SAMPLE_BATCHES"  # train.yaml's env: the intermediate evals' batches (0 or unset: all)


class FirstBatches:
    """The first `count` batches of an eval dataset, read from its start at each pass (tqdm counts them)."""

    def __init__(self, dataset, count: int):
        self.dataset, self.count = dataset, count

    def __iter__(self):
        return itertools.islice(iter(self.dataset), self.count)

    def __len__(self) -> int:
        return self.count


def batches(environ: dict[str, str]) -> int:
    """The sample's batches SAMPLE_ENV asks for; 0 for all (unset, 0, or not a whole number: fab refuses that)."""
    text = environ.get(SAMPLE_ENV, "").strip()
    return int(text) if text.isdigit() else 0


def install(count: int) -> bool:
    """MaxText's intermediate-eval hook given the sample in place of the split; False where it has none."""
    try:
        from maxtext.trainers.post_train.rl import hooks
    except ImportError:
        return False
    made = hooks.RLTrainingHooks.__init__

    @functools.wraps(made)
    def init(self, rl_cluster, trainer_config, test_dataset, *args, **kwargs):
        made(self, rl_cluster, trainer_config, FirstBatches(test_dataset, count), *args, **kwargs)

    hooks.RLTrainingHooks.__init__ = init
    return True
