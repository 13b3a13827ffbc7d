"""The learning-rate schedule of MaxText's RL trainer, computed on the laptop from a job's arguments.

train_rl builds warmup + cosine decay to 0 (utils_rl.get_optimizer, optax's
warmup_cosine_decay_schedule) over `learning_rate_schedule_steps`, or over the run's own
length (num_batches x rl.num_iterations x train_fraction x num_epoch) when that is not
positive. MaxText 0.2.3 rewrites an unset (-1) value to `steps` (base.yml's 150001) before
the trainer sees it, so a 50-step run warms up over 15,000 steps and never gets above 0.33%
of its learning rate. From 0.2.4 train_rl reads its arguments into types.RLConfig, which sets an
unset value, and `steps` itself, to the run's length before get_optimizer compares the two: any
positive length is then used as given (base.yml's 150001, or one equal to a `steps` argument, too).
`0` means the run's length in every version (the real 0.2.3 and 0.2.5 agree: tests/maxtext_cpu,
test_the_local_schedule_is_maxtexts_own). This module replays that arithmetic, with
the defaults of the version the environment installs, so that `fab plan` can show the schedule
and a schedule that cannot train is refused before anything is spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .schema import MaxText

RL_TRAINER = "maxtext.trainers.post_train.rl.train_rl"
KEY = "learning_rate_schedule_steps"
FIX = f"set {KEY}: 0 (MaxText then sizes the schedule to the run, as jobs/train.yaml ships it)"
LOWEST_PEAK_FRACTION = 0.5  # a run whose highest learning rate stays below this share of the peak is refused
MAX_STEPS = 10**9
FIXED_IN = (0, 2, 4)  # from this MaxText version on, an unset (-1) length is the run's length, not `steps`
STEP_KEYS = (("num_batches", int), ("rl.num_iterations", int), ("train_fraction", float), ("num_epoch", int))


def _value(maxtext: MaxText, args: dict[str, str], module: str, key: str, kind: type) -> int | float | None:
    """`key` as MaxText reads it: the job's argument, else the module's default; None if not a finite number."""
    raw = maxtext.value(args, module, key)
    try:
        value = kind(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def train_steps(maxtext: MaxText, args: dict[str, str], module: str = RL_TRAINER) -> int | None:
    """The run's optimizer steps, as train_rl counts them; None if an argument is not a number."""
    parts = [_value(maxtext, args, module, key, kind) for key, kind in STEP_KEYS]
    if any(part is None for part in parts):
        return None
    product = math.prod(parts)
    return int(product) if math.isfinite(product) else None


@dataclass(frozen=True)
class Schedule:
    """The learning rate of every step of one RL run, as MaxText will build it."""

    train_steps: int  # updates in the run
    schedule_steps: int  # the length the warmup and the cosine decay are sized to
    warmup_steps: int
    peak: float  # learning_rate
    from_unset: bool  # schedule_steps came from MaxText rewriting an unset (-1) value to `steps`
    version: str = ""  # the MaxText version whose arithmetic this is

    def rate(self, step: int) -> float:
        """The learning rate of update `step` (1-based, as tunix counts and logs it): the schedule at
        optax's count step - 1."""
        count = step - 1
        if count < self.warmup_steps:
            return self.peak * count / self.warmup_steps
        decay = self.schedule_steps - self.warmup_steps
        done = min(count - self.warmup_steps, decay)
        return self.peak * 0.5 * (1 + math.cos(math.pi * done / decay))

    @property
    def highest(self) -> float:
        # The warmup rises and the cosine falls: the highest rate is at the warmup's end or the run's.
        return self.rate(min(self.warmup_steps + 1, self.train_steps))

    def line(self) -> str:
        """One line for `fab plan`."""
        plural = "s" if self.warmup_steps != 1 else ""
        warmup = (
            f"warmup {self.warmup_steps} step{plural} to {self.peak:.2g}" if self.warmup_steps else f"{self.peak:.2g}"
        )
        return (
            f"{warmup}, cosine to 0 over {self.schedule_steps} steps; the run's {self.train_steps} steps: "
            f"highest {self.highest:.2g}, last step {self.rate(self.train_steps):.2g}"
        )

    def problems(self) -> list[tuple[str, str]]:
        """(key, why) for each reason this schedule cannot train the run, with the numbers and the fix."""
        if self.peak <= 0:
            return [("learning_rate", f"{self.peak:g}: a run with no positive learning rate changes nothing")]
        if self.schedule_steps <= self.warmup_steps:
            return [
                (
                    "warmup_steps_fraction",
                    f"the warmup ({self.warmup_steps} steps) fills the whole schedule ({self.schedule_steps} steps), "
                    "and MaxText fails to build the optimizer; keep warmup_steps_fraction below 1",
                )
            ]
        sized = (
            f"unset (-1), which MaxText {self.version} turns into steps={self.schedule_steps}"
            if self.from_unset
            else f"{self.schedule_steps} steps"
        )
        if self.highest < LOWEST_PEAK_FRACTION * self.peak:
            return [
                (
                    KEY,
                    f"{sized}, but the run has {self.train_steps} steps: the warmup lasts {self.warmup_steps} steps, "
                    f"so the highest learning rate is {self.highest:.2g}, {100 * self.highest / self.peak:.2g}% of "
                    f"learning_rate {self.peak:.2g}, and the run returns the model nearly unchanged; {FIX}",
                )
            ]
        if self.schedule_steps < self.train_steps:
            return [
                (
                    KEY,
                    f"{sized}, shorter than the run's {self.train_steps} steps: the learning rate is 0 from step "
                    f"{self.schedule_steps + 1} on, so the rest of the run trains nothing; {FIX}",
                )
            ]
        return []


def of(maxtext: MaxText, module: str | None, args: dict[str, str]) -> Schedule | None:
    """The schedule an RL training job will use; None for other modules, arguments that are not numbers,
    or a run without steps (see `problems`)."""
    if module != RL_TRAINER:
        return None
    steps = train_steps(maxtext, args, module)
    length = _value(maxtext, args, module, KEY, int)
    config_steps = _value(maxtext, args, module, "steps", int)
    peak = _value(maxtext, args, module, "learning_rate", float)
    fraction = _value(maxtext, args, module, "warmup_steps_fraction", float)
    if None in (steps, length, config_steps, peak, fraction) or not 0 < steps <= MAX_STEPS:
        return None
    unset = length == -1 and maxtext.release < FIXED_IN
    if unset:
        length = config_steps  # 0.2.3's configs/types.py: learning_rate_schedule_steps = steps
    if length <= 0:
        length = steps  # utils_rl.get_optimizer (from 0.2.4 -1 too, which RLConfig sets to it): the run's own length
    return Schedule(steps, length, int(fraction * length), peak, unset, maxtext.version)


def problems(maxtext: MaxText, module: str | None, args: dict[str, str]) -> list[tuple[str, str]]:
    """(key, why) for an RL training job that cannot train: no steps, too many, or its schedule."""
    if module != RL_TRAINER:
        return []
    period = _value(maxtext, args, module, "checkpoint_period", int)
    if period is not None and period < 1:
        return [
            (
                "checkpoint_period",
                f"{period} is not a number of steps: Orbax saves every step that is a multiple of it, and 0 fails "
                "(step % 0) on the TPU once the model is loaded and compiled; give it 1 or more (the shipped "
                "train.yaml: a tenth of the run)",
            )
        ]
    steps = train_steps(maxtext, args, module)
    if steps is not None and not 0 < steps <= MAX_STEPS:
        values = {key: _value(maxtext, args, module, key, kind) for key, kind in STEP_KEYS}
        culprit = next((key for key, value in values.items() if value <= 0), "num_batches")
        counted = " x ".join(f"{key} {maxtext.value(args, module, key)}" for key in values)
        return [(culprit, f"the run would have {steps} training steps ({counted}); give it 1 to {MAX_STEPS}")]
    planned = of(maxtext, module, args)
    return planned.problems() if planned else []
