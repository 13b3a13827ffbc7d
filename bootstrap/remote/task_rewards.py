"""A task's reward functions as MaxText's GRPO calls them (its `reward_functions_path`), and the task's measure of
each held-out eval.

MaxText 0.2.5 loads this file and takes from it each function the task names; each is the task's own function from
its reward file (task.json in the folder TPU_RL_TASK names), called the way the task's docs say: prompts, completions
and the rows' answers as lists of strings, one number back per completion (MaxText hands the answers over as JSON
lists, and an eval's question as a single string). During an eval (MaxText calls each function once per held-out
completion, without `mode`), the scores are kept: `take()` gives the eval's measure (the share of completions its
reward calls right, or the mean of the rewards' sum) to the launcher (maxtext_run.py), which logs and records it
beside MaxText's own eval line. Standard library only.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import sys

TASK_ENV = "TPU_RL_TASK"
MEAN_REWARD = "mean_reward"
TALLY = "tpu_rl_task_tally"  # the eval's scores, in sys.modules: the launcher (eval_recorder.py) reads them there


def _spec() -> dict:
    with open(os.path.join(os.environ[TASK_ENV], "task.json")) as f:
        return json.load(f)


def _plain(answer) -> str:
    """A row's answer as the task's rewards get it: the first of MaxText's JSON list, else as it came."""
    try:
        found = json.loads(str(answer))
    except ValueError:
        return str(answer)
    return str(found[0]) if isinstance(found, list) and found else str(found)


class Tally:
    """The scores of the held-out completions of one eval, a completion at a time: MaxText scores each completion
    with every function in their order, so the first function's call begins the next completion."""

    def __init__(self, task: str, measure: str, first: str):
        self.task, self.measure, self.first, self.scores = task, measure, first, []

    def note(self, name: str, score: float) -> None:
        if name == self.first or not self.scores:
            self.scores.append({})
        self.scores[-1][name] = score

    def take(self) -> dict | None:
        """The eval's measure, and a fresh tally for the next eval; None when no completion was scored."""
        scores, self.scores = self.scores, []
        if not scores:
            return None
        if self.measure == MEAN_REWARD:
            sums = [sum(s.values()) for s in scores]
            mean = sum(sums) / len(sums)
            sd = math.sqrt(sum((v - mean) ** 2 for v in sums) / max(1, len(sums) - 1))
            # rounded as the launcher's line says them (evals.task_line): the log and the record agree
            return {"measure": MEAN_REWARD, "value": round(mean, 4), "sd": round(sd, 4), "total": len(sums)}
        right = sum(1 for s in scores if s.get(self.measure, 0.0) >= 1.0)
        value = round(100 * right / len(scores), 2)
        return {"measure": self.measure, "value": value, "right": right, "total": len(scores)}


def _wrapped(fn, name: str, tally: Tally):
    @functools.wraps(fn)  # MaxText's signature reading (GRPO config fields by name) sees the task's function
    def reward(**kwargs):
        prompts, completions = list(kwargs.pop("prompts")), list(kwargs.pop("completions"))
        answers = [_plain(a) for a in kwargs.pop("answer", [None] * len(completions))]
        if isinstance(kwargs.get("question"), str):  # an eval's: one row
            kwargs["question"] = [kwargs["question"]] * len(completions)
        scores = fn(prompts=prompts, completions=completions, answer=answers, **kwargs)
        if "mode" not in kwargs and scores is not None:  # MaxText's eval: one held-out completion a call
            for score in scores:
                tally.note(name, float(score))
        return scores

    return reward


def _load() -> None:
    task = _spec()
    path = task["rewards"]
    loader = importlib.util.spec_from_file_location("tpu_rl_task_reward_file", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    tally = sys.modules.setdefault(TALLY, Tally(task["name"], task["measure"], task["functions"][0]))
    for name in task["functions"]:
        globals()[name] = _wrapped(getattr(module, name), name, tally)


_load()
