"""The trainer's GSM8K eval lines, read the same way on the laptop (the eval table) and on the VM (the model card).

Standard library only: hub_upload.py imports it beside itself on the VM, where it fills the
card's table from the train job's log, so the card needs no laptop.
"""

from __future__ import annotations

import re

EVAL = re.compile(
    r"(?P<phase>Pre RL Training|Intermediate Eval \(step=(?P<step>\d+)\)|Post RL Training): "
    r"corr=(?P<corr>\d+), total=(?P<total>\d+), accuracy=(?P<accuracy>[\d.]+)%, "
    r"partial_accuracy=(?P<partial_accuracy>[\d.]+)%, format_accuracy=(?P<format_accuracy>[\d.]+)%, "
    r"mean_reward=(?P<mean_reward>-?[\d.]+)"
)
# tunix 0.1.7's line when train_rl resumes a run from its last checkpoint (tunix/sft/checkpoint_manager.py)
RESTORED = re.compile(r"Restored params from step: (\d+) in ")
CARD_ROWS = "<!-- tpu-rl: eval rows -->"  # where hub_upload.py puts the table's rows in the model card


def parse(line: str) -> dict | None:
    """One eval result ({phase: pre|intermediate|post, step, accuracy, ...}), or None."""
    m = EVAL.search(line)
    if not m:
        return None
    values = {k: float(v) for k, v in m.groupdict().items() if k not in ("phase", "step") and v is not None}
    phase = "pre" if m["phase"].startswith("Pre") else "post" if m["phase"].startswith("Post") else "intermediate"
    return {"phase": phase, "step": int(m["step"]) if m["step"] else None, **values}


class Attempts:
    """Which attempt of train a log's eval lines belong to. After tunix's restore line the attempt is a
    resumed one, and its "Pre RL Training" eval scores the restored weights, not the base model: it is
    kept as phase "resumed" at that step, and the first attempt's "before training" stays what it was."""

    def __init__(self):
        self.resumed_at: int | None = None

    def read(self, line: str) -> dict | None:
        """The eval result on this line, labelled for its attempt, or None."""
        if m := RESTORED.search(line):
            self.resumed_at = int(m[1])
            return None
        found = parse(line)
        if found is not None and found["phase"] == "pre" and self.resumed_at is not None:
            return {**found, "phase": "resumed", "step": self.resumed_at}
        return found


def collect(evals: list[dict], new: dict) -> list[dict]:
    """`evals` with `new` in place of an earlier result of the same phase and step."""
    return [e for e in evals if (e["phase"], e["step"]) != (new["phase"], new["step"])] + [new]


def final(evals: list[dict], total_steps: int | None) -> list[dict]:
    """The evals to report: the trainer also evaluates at its last step just before the Post eval,
    so an intermediate eval at the final step counts the Post one twice and is left out."""
    has_post = any(e["phase"] == "post" for e in evals)
    return [e for e in evals if not (has_post and e["phase"] == "intermediate" and e["step"] == total_steps)]


def merged(earlier: list[dict], later: list[dict]) -> list[dict]:
    """An earlier attempt's evals (a lost VM's, kept by this machine), updated by a later attempt's."""
    for new in later:
        earlier = collect(earlier, new)
    return sorted(earlier, key=lambda e: (e["phase"] != "pre", e["phase"] == "post", e["step"] or 0))


def label(e: dict) -> str:
    return {"pre": "before training", "post": "after training", "resumed": f"resumed at step {e['step']}"}.get(
        e["phase"], f"step {e['step']}"
    )


def card_rows(evals: list[dict]) -> str:
    """The model card's table rows (Markdown)."""
    rows = [
        f"| {label(e)} | {e['accuracy']:.2f} | {e['format_accuracy']:.2f} | {e['partial_accuracy']:.2f} "
        f"| {e['mean_reward']:.3f} |"
        for e in evals
    ]
    return "\n".join(rows) or "| (no eval results recorded) | | | | |"


def from_log(path: str, total_steps: int | None) -> list[dict]:
    """Every eval of a job's log, as the table shows them."""
    evals: list[dict] = []
    attempts = Attempts()
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if (found := attempts.read(line)) is not None:
                    evals = collect(evals, found)
    except FileNotFoundError:
        return []
    return final(evals, total_steps)
