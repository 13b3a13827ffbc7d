"""Where train's time went, from its own log: start-up (loading, compiling, the eval before training), the steps,
the evals, the checkpoints' saves. Read from each line's absl timestamp (the VM's clock, not when fab saw it).

MaxText 0.2.3 has no finer telemetry (0.2.5's `enable_tunix_perf_metrics` splits a step into rollout, update
and weight sync; not read here). What is measured is what the next estimate scales (results/estimate.py).
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field

from ..remote import evals

STAMP = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?) ")
STEP = re.compile(r"Train step (\d+) training loss")
SAVE = re.compile(r"CompositeCheckpointHandler\.async_save\. Time taken: ([\d.]+)s")  # what a save held training up
DONE = "RL Training Completed Successfully"
SPIKE, SPIKE_S = 3.0, 1.0  # a step this many times the base step and this many seconds longer: a cost of its own
EARLY = 0.75  # a first spike closer to its next than this share of their usual spacing: warm-up, not recurring
HALF_A_YEAR_S = 182 * 86400  # a line this much earlier than the last came after New Year's midnight
ATTEMPT = "[tpu-rl] starting "  # jobrunner's note at each start of a job: its log is appended to


def stamp(line: str, year: int | None = None) -> float | None:
    """An absl line's time (seconds since the epoch; local time, as absl writes it); None for another line."""
    m = STAMP.match(line)
    if not m:
        return None
    month, day, hour, minute, second = int(m[1]), int(m[2]), int(m[3]), int(m[4]), float(m[5])
    parts = (year or time.localtime().tm_year, month, day, hour, minute, 0, 0, 0, -1)
    return time.mktime(parts) + second


@dataclass
class TrainTiming:
    """Fed train's log lines (one attempt's); `split` says where the time went."""

    first: float | None = None
    steps: dict[int, float] = field(default_factory=dict)  # step -> when its line came
    evals: list[tuple[float, float, int | None]] = field(
        default_factory=list
    )  # each timed eval: began, ended, problems
    saves_s: float = 0.0
    last_mark: float | None = None  # the last step's or the trainer's end line: an eval after it began there
    ended: float | None = None
    year: int = field(default_factory=lambda: time.localtime().tm_year)  # absl writes none: the first line's

    def feed(self, line: str) -> None:
        at = stamp(line, self.year)
        if at is None:
            return
        if self.ended is not None and at < self.ended - HALF_A_YEAR_S:  # December, then January: a new year
            self.year += 1
            at = stamp(line, self.year)
        self.first = self.first if self.first is not None else at
        self.ended = at
        if m := STEP.search(line):
            self.steps[int(m[1])] = at
            self.last_mark = at
        elif DONE in line:
            self.last_mark = at
        elif (found := evals.parse(line)) is not None and found["phase"] != "pre" and self.last_mark is not None:
            self.evals.append((self.last_mark, at, found.get("total")))
            self.last_mark = None
        if m := SAVE.search(line):
            self.saves_s += float(m[1])

    def split(self) -> dict | None:
        """Seconds: start-up (to the first step's end, less one step), warm-up (what the first steps took beyond the
        steady rate), the steady step, the evals (each timed one's mean, and its problems), the saves; None before
        two steps."""
        if len(self.steps) < 2 or self.first is None:
            return None
        order = sorted(self.steps)
        timed = {  # a step's time: tunix logs a step's line once the next step is done (the last two come together)
            b + 1: self.steps[b] - self.steps[a]
            for a, b in zip(order, order[1:-1], strict=False)
            if b == a + 1 and not any(self.steps[a] <= began < self.steps[b] for began, _, _ in self.evals)
        }
        step_s, warmup = steady(timed)
        if step_s is None:
            step_s = (self.steps[order[-1]] - self.steps[order[0]]) / len(order)
        eval_s = statistics.mean(end - began for began, end, _ in self.evals) if self.evals else 0.0
        items = [total for _, _, total in self.evals if total]
        startup = self.steps[order[0]] - self.first - step_s
        return {
            "startup_s": round(max(0.0, startup), 2),
            "warmup_s": round(warmup, 2),
            "step_s": round(step_s, 3),
            "steps": len(order),
            "first_step": order[0],
            "eval_s": round(eval_s, 2),
            "evals": len(self.evals),
            "eval_items": round(statistics.mean(items)) if items else None,
            "saves_s": round(self.saves_s, 2),
            "total_s": round((self.ended or self.first) - self.first, 2),
        }


def steady(timed: dict[int, float]) -> tuple[float | None, float]:
    """The steady step and the warm-up before it, from each step's time (by step). A step is its base time (the
    median), plus the costs that come back every few steps (on the TPU host a grader worker started anew about
    every 5th or 6th step, 17 s, between 0.4 s steps): a step SPIKE times the base or more. The spikes recur at their
    usual spacing (the later spikes' median spacing); a first spike well before its next (compiling a new shape, a
    first use) is warm-up, paid once a start, as is a spike alone that did not come back where its period would
    have; the rest are spread over the steps between them (one spike alone, too few steps after it: over the steps
    up to it). Without such costs, the later half's mean, and what the earlier half took beyond it as
    warm-up. None where no step was timed."""
    if not timed:
        return None, 0.0
    steps = sorted(timed)
    base = statistics.median(timed.values())
    spikes = [n for n in steps if timed[n] >= SPIKE * base and timed[n] - base >= SPIKE_S]
    if spikes:
        spacings = [b - a for a, b in zip(spikes, spikes[1:], strict=False)]
        usual = statistics.median(spacings[1:] or spacings) if spacings else spikes[0]
        once = []
        while len(spikes) - len(once) > 1 and spikes[len(once) + 1] - spikes[len(once)] < EARLY * usual:
            once.append(spikes[len(once)])
        recurring = spikes[len(once) :]
        if len(recurring) == 1 and steps[-1] >= 2 * recurring[0]:  # alone, where its period would have come again
            return base, timed[recurring[0]] - base + sum(timed[n] - base for n in once)
        every = (recurring[-1] - recurring[0]) / (len(recurring) - 1) if len(recurring) > 1 else recurring[0]
        excess = [timed[n] - base for n in recurring]
        return base + sum(excess) / len(excess) / every, sum(timed[n] - base for n in once)
    early, late = steps[: len(steps) // 2], steps[len(steps) // 2 :]
    rate = statistics.mean(timed[n] for n in late)
    return rate, max(0.0, sum(timed[n] for n in early) - len(early) * rate)


def from_log(text: str) -> dict | None:
    """The last attempt's split, from a job's whole log."""
    timing = TrainTiming()
    for line in re.split(r"\r\n|\r|\n", text.split(ATTEMPT)[-1]):
        timing.feed(line)
    return timing.split()
