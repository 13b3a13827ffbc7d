"""A run's health, watched from inside train: a bad run stopped early, its last committed checkpoint kept.

train's launcher (maxtext_run.py) installs these hooks into tunix and MaxText before the trainer runs:

- the smoke rollout: the eval before training is the converted model answering held-out prompts through the very
  sampler train uses; its answers must be readable text, not one token repeated, and end before the length limit,
  and at least `smoke_right` of them right (where the task says what is right). Before any step is trained.
- every scalar tunix logs (MetricsLogger.log): a NaN or infinite loss or reward; the reward flat at its lowest for
  `reward_floor_steps` steps; the KL beyond `kl_max`; completions empty or all at the length limit for
  `length_steps` steps; the sampler-trainer agreement above `agreement_stop` (a warning above `agreement_warn`).
- the agreement itself, where the sampler gives its log-probabilities: each step, the mean over the completions'
  tokens of exp(|log p_sampler - log p_trainer|) (NeMo-RL's token_mult_prob_error: 1.0 when the two agree), logged
  as sampler_trainer/train/token_mult_prob_error at the cost of one trainer forward pass a step.

A rule that fires raises Stopped (a BaseException: no library's `except Exception` swallows it); the launcher then
writes the stop record beside the run's start records (in the bucket with results.gcs: a lost VM keeps it), says it in
one line and exits jobrunner.STOPPED_EXIT. A later start of the same run reads the record and stops at once, unless fab train
--go-on set GO_ON. Standard library only (tunix and MaxText are imported where the hooks need them).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import sys
import time
import unicodedata

try:
    from . import attempts, gcs, jobrunner  # on the laptop: bootstrap.remote
except ImportError:
    import attempts  # on the VM: beside this script in the tools folder
    import gcs
    import jobrunner

RULES_ENV = "TPU_RL_HEALTH"  # the rules, JSON, from jobs/pipeline.yaml's health (fab renders it into train's env)
FOLDER = "health"  # beside the run's start records: stopped.json
AGREEMENT = "token_mult_prob_error"
REPEATED_SHARE = 0.8  # an answer this much of one token (a word, or a character) is a loop, not text
READABLE_SHARE = 0.9  # of an answer's characters, printable ones: less is not text


class Stopped(BaseException):
    """A rule fired: why, at which step, with what value."""

    def __init__(self, rule: str, step: int | None, why: str):
        super().__init__(why)
        self.rule, self.step, self.why = rule, step, why


def record_path(environ: dict[str, str]) -> str | None:
    """Where a run's stop record is: beside its start records (attempts.DIR_ENV); None for a train that keeps none."""
    starts = environ.get(attempts.DIR_ENV, "").rstrip("/")
    return f"{starts.rsplit('/', 1)[0]}/{FOLDER}/stopped.json" if "/" in starts else None


def read_record(path: str) -> dict | None:
    data = gcs.read(path) if gcs.is_gcs(path) else _read_file(os.path.expanduser(path))
    try:
        found = json.loads(data) if data else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):  # never stopped (its folder not even made)
        return None


def write_record(path: str, stop: Stopped, committed: int | None) -> None:
    _write(
        path, {"rule": stop.rule, "step": stop.step, "why": stop.why, "at": time.time(), "committed_step": committed}
    )


def _write(path: str, record: dict) -> None:
    """The record in the bucket, or on the VM whole or not at all (a kill mid-write leaves the last one)."""
    if gcs.is_gcs(path):
        gcs.write(path, json.dumps(record).encode())
        return
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    jobrunner.write_json(path, record)


def stopped(path: str) -> dict | None:
    """The run's stop record, unless fab train --go-on cleared it since."""
    found = read_record(path)
    return found if found and not found.get("cleared_at") else None


def clear(path: str, found: dict) -> None:
    """fab train --go-on: the record stays (what stopped the run stays said), marked cleared."""
    _write(path, {**found, "cleared_at": time.time()})


@dataclasses.dataclass
class Rules:
    """jobs/pipeline.yaml's health, as fab renders it (a rule of 0 is off)."""

    smoke: bool = True
    smoke_right: int = 1
    reward_floor_steps: int = 20
    kl_max: float = 1.0
    length_steps: int = 10
    agreement_warn: float = 1.05
    agreement_stop: float = 1.5
    agreement: bool = True
    max_tokens: int = 0  # a completion's budget: max_target_length - max_prefill_predict_length


class Watch:
    """The rules applied to what train logs, step by step."""

    def __init__(self, rules: Rules, say=print):
        self.rules, self.say = rules, say
        self.steps: dict[int, dict[str, float]] = collections.defaultdict(dict)
        self.lowest_reward: float | None = None
        self.floor_run = self.length_run = 0
        self.warned = False
        self.trained = False  # a step was logged: evals from now on are not before training
        self.agreements: list[float] = []  # each step's sampler-trainer agreement, for the line at train's end

    def scalar(self, prefix: str, name: str, value, mode: str, step: int) -> None:
        """One scalar as tunix logs it (actor/train/loss, rewards/train/score/mean, ...)."""
        if str(mode) != "train":
            return
        try:
            value = float(value)
        except (TypeError, ValueError):
            return
        tag = f"{prefix}/{name}"
        self.trained = True
        if tag in ("actor/loss", "rewards/score/mean", "rewards/sum", "rewards/mean") and not math.isfinite(value):
            raise Stopped("nan", step, f"{tag.replace('/', '/train/', 1)} is {value} at step {step}: the run diverged")
        seen = self.steps[step]
        seen[tag] = value
        if tag == "actor/kl" and self.rules.kl_max and abs(value) > self.rules.kl_max:
            raise Stopped(
                "kl_max", step, f"the KL is {value:.3g} at step {step}, beyond health.kl_max {self.rules.kl_max:g}"
            )
        if tag == f"sampler_trainer/{AGREEMENT}":
            self._agreement(value, step)
        if {"rewards/score/min", "rewards/score/max"} <= seen.keys() and "floor" not in seen:
            seen["floor"] = 1.0
            self._floor(seen["rewards/score/min"], seen["rewards/score/max"], step)
        if {"completions/min_length", "completions/max_length"} <= seen.keys() and "length" not in seen:
            seen["length"] = 1.0
            self._length(seen["completions/min_length"], seen["completions/max_length"], step)

    def _agreement(self, value: float, step: int) -> None:
        rules = self.rules
        self.agreements.append(value)
        source = "NeMo-RL treats above 1.05 as a framework bug (NeMo-RL PR #1767)"
        if rules.agreement_stop and value > rules.agreement_stop:
            raise Stopped(
                "agreement_stop", step, f"the sampler and the trainer disagree at step {step}: {AGREEMENT} {value:.3f}"
                f" above health.agreement_stop {rules.agreement_stop:g} ({source})"
            )  # fmt: skip
        if rules.agreement_warn and value > rules.agreement_warn and not self.warned:
            self.warned = True
            self.say(f"[tpu-rl] health: warning: {AGREEMENT} {value:.3f} at step {step}, above {rules.agreement_warn:g} "
                     f"({source}): the rollouts' log-probabilities are not the trainer's")  # fmt: skip

    def _floor(self, low: float, high: float, step: int) -> None:
        """Every completion of the step scored alike, at the lowest reward seen: no signal to learn from."""
        self.lowest_reward = low if self.lowest_reward is None else min(self.lowest_reward, low)
        self.floor_run = self.floor_run + 1 if high == low == self.lowest_reward else 0
        if self.rules.reward_floor_steps and self.floor_run >= self.rules.reward_floor_steps:
            raise Stopped(
                "reward_floor_steps", step, f"every completion scored {low:g}, its lowest, for {self.floor_run} steps "
                f"in a row up to step {step} (health.reward_floor_steps): nothing to learn from"
            )  # fmt: skip

    def _length(self, shortest: float, longest: float, step: int) -> None:
        """Completions collapsed: all empty, or all at the length limit."""
        full = bool(self.rules.max_tokens) and shortest >= self.rules.max_tokens
        self.length_run = self.length_run + 1 if longest <= 1 or full else 0
        if self.rules.length_steps and self.length_run >= self.rules.length_steps:
            what = "at the length limit" if full else "empty"
            raise Stopped(
                "length_steps", step, f"every completion {what} for {self.length_run} steps in a row up to step {step} "
                "(health.length_steps): the policy collapsed"
            )  # fmt: skip

    def summary(self) -> str | None:
        """train's last word on the agreement: over how many steps, its mean and its most."""
        if not self.agreements:
            return None
        found = self.agreements
        return (f"[tpu-rl] health: the sampler and the trainer agreed over {len(found)} steps: {AGREEMENT} mean "
                f"{sum(found) / len(found):.4f}, most {max(found):.4f} (1.0: the same log-probabilities)")  # fmt: skip


def smoke(answers: list[str], ended: list[bool], right: int | None, rules: Rules) -> Stopped | None:
    """The eval before training, judged: why the base model's answers through train's sampler are no answers."""
    if not answers:
        return None
    shown = "; ".join(repr(a[:80]) for a in answers[:3])
    looping = [a for a in answers if _repeated(a)]
    if len(looping) > len(answers) / 2:
        return Stopped("smoke", 0, f"the model's answers before training repeat one token ({len(looping)} of "
                       f"{len(answers)}): {shown}")  # fmt: skip
    unreadable = [a for a in answers if not _readable(a)]
    if len(unreadable) > len(answers) / 2:
        return Stopped("smoke", 0, f"the model's answers before training are not text ({len(unreadable)} of "
                       f"{len(answers)}): {shown}")  # fmt: skip
    if ended and not any(ended):
        return Stopped("smoke", 0, f"none of the model's {len(answers)} answers before training ended before the "
                       f"length limit: {shown}")  # fmt: skip
    if right is not None and rules.smoke_right and right < rules.smoke_right:
        return Stopped("smoke_right", 0, f"the model answered {right} of {len(answers)} held-out problems right "
                       f"before training, fewer than health.smoke_right {rules.smoke_right}: {shown}")  # fmt: skip
    return None


def _readable(text: str) -> bool:
    if not text.strip():
        return False
    printable = sum(1 for c in text if c.isprintable() or c in "\n\t") - text.count("\ufffd")
    letters = sum(1 for c in text if unicodedata.category(c)[0] in "LN")
    return printable / len(text) >= READABLE_SHARE and letters > 0


def _repeated(text: str) -> bool:
    """One word, or one character, makes up most of a long answer."""
    words = re.findall(r"\S+", text)
    if len(words) >= 8 and collections.Counter(words).most_common(1)[0][1] >= REPEATED_SHARE * len(words):
        return True
    squeezed = re.sub(r"\s+", "", text)
    return len(squeezed) >= 16 and collections.Counter(squeezed).most_common(1)[0][1] >= REPEATED_SHARE * len(squeezed)


def rules_from(environ: dict[str, str], carried_on: dict | None = None) -> Rules | None:
    """This start's rules (None: train keeps none). Carried on past a smoke stop (`carried_on`: the stop record
    fab train --go-on carries on from), the smoke rollout is off: the user saw its answers and chose to go on, and
    the same eval would stop the run again."""
    text = environ.get(RULES_ENV)
    if not text:
        return None
    found = json.loads(text)
    rules = Rules(**{key: value for key, value in found.items() if key in Rules.__dataclass_fields__})
    if carried_on and str(carried_on.get("rule")).startswith("smoke"):
        rules.smoke = False
    return rules


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
