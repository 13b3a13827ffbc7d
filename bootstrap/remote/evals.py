"""The trainer's eval lines, read the same way on the laptop (the eval table) and on the VM (the model card).

MaxText logs each held-out eval (GSM8K's accuracy, its format and mean reward); for a task of your own the launcher
logs the task's measure of the same eval just after it (remote/task_rewards.py), and the run is judged by that.
Standard library only: hub_upload.py imports it beside itself on the VM, where it fills the card's table from the
train job's records, so the card needs no laptop.
"""

from __future__ import annotations

import math
import re

EVAL = re.compile(
    r"(?P<phase>Pre RL Training|Intermediate Eval \(step=(?P<step>\d+)\)|Post RL Training): "
    r"corr=(?P<corr>[\d.]+), total=(?P<total>\d+), accuracy=(?P<accuracy>[\d.]+)%, "
    r"partial_accuracy=(?P<partial_accuracy>[\d.]+)%, format_accuracy=(?P<format_accuracy>[\d.]+)%, "
    r"mean_reward=(?P<mean_reward>-?[\d.]+)"
)
# the launcher's line after each eval of a task of your own (maxtext_run.py): the task's measure of that eval
PHASE = r"(?P<phase>Pre RL Training|Intermediate Eval \(step=(?P<step>\d+)\)|Post RL Training)"
TASK_EVAL = re.compile(
    r"\[tpu-rl\] task (?P<task>[A-Za-z][A-Za-z0-9_-]*), " + PHASE + r": (?P<measure>[A-Za-z_][A-Za-z0-9_]*)="
    r"(?P<value>-?[\d.]+)%?, (?:right=(?P<right>\d+)|sd=(?P<sd>[\d.]+)), total=(?P<total>\d+)"
)
MEAN_REWARD = "mean_reward"
# tunix 0.1.7's line when train_rl resumes a run from its last checkpoint (tunix/sft/checkpoint_manager.py)
RESTORED = re.compile(r"Restored params from step: (\d+) in ")
CARD_ROWS = "<!-- tpu-rl: eval rows -->"  # where hub_upload.py puts the table's rows in the model card
CARD_RESULT = "<!-- tpu-rl: result -->"  # where it puts the run's result line and warnings
Z95 = 1.96


PHASES = ("pre", "resumed", "intermediate", "post")
VALUES = ("corr", "total", "accuracy", "partial_accuracy", "format_accuracy", "mean_reward")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def valid(item: dict) -> bool:
    """An eval result as `parse` makes it (read back from a record, which is not ours alone)."""
    numbers = all(_number(item.get(k)) for k in VALUES)
    step = item.get("step") is None or isinstance(item.get("step"), int)
    task = item.get("task")
    measured = task is None or (
        isinstance(task, dict)
        and isinstance(task.get("name"), str)
        and isinstance(task.get("measure"), str)
        and _number(task.get("value"))
        and _number(task.get("total"))
        and task["total"] > 0
        and (_number(task.get("sd")) if task["measure"] == MEAN_REWARD else _number(task.get("right")))
    )
    return item.get("phase") in PHASES and numbers and step and item["total"] > 0 and measured


def _phase(text: str) -> str:
    return "pre" if text.startswith("Pre") else "post" if text.startswith("Post") else "intermediate"


def parse(line: str) -> dict | None:
    """One eval result ({phase: pre|intermediate|post, step, accuracy, ...}), or a task's measure of one
    ({phase, step, task: {name, measure, value, total, right or sd}}), or None."""
    if m := EVAL.search(line):
        values = {k: float(v) for k, v in m.groupdict().items() if k not in ("phase", "step") and v is not None}
        return {"phase": _phase(m["phase"]), "step": int(m["step"]) if m["step"] else None, **values}
    if m := TASK_EVAL.search(line):
        kept = {"right": int(m["right"])} if m["right"] is not None else {"sd": float(m["sd"])}
        task = {"name": m["task"], "measure": m["measure"], "value": float(m["value"]), "total": int(m["total"])}
        return {"phase": _phase(m["phase"]), "step": int(m["step"]) if m["step"] else None, "task": {**task, **kept}}
    return None


def task_line(phase: str, step: int | None, measured: dict, task: str) -> str:
    """The launcher's line of a task's measure of one eval (what TASK_EVAL reads)."""
    said = {"pre": "Pre RL Training", "resumed": "Pre RL Training", "post": "Post RL Training"}
    text = said.get(phase, f"Intermediate Eval (step={step})")
    if measured["measure"] == MEAN_REWARD:
        value = f"{measured['value']:.4f}, sd={measured['sd']:.4f}"
    else:
        value = f"{measured['value']:.2f}%, right={measured['right']}"
    return f"[tpu-rl] task {task}, {text}: {measured['measure']}={value}, total={measured['total']}"


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
    """`evals` with `new` in place of an earlier result of the same phase and step. A task's measure joins its eval's
    result, whichever of the two lines came first (the launcher's and MaxText's logging interleave): until that
    result comes, it waits in the list as a part (no `total`), which `final` leaves out."""
    same = lambda e: (e["phase"], e["step"]) == (new["phase"], new["step"])  # noqa: E731
    if "total" not in new:
        if any(same(e) and "total" in e for e in evals):
            return [{**e, "task": new["task"]} if same(e) and "total" in e else e for e in evals]
        return [e for e in evals if not same(e)] + [new]
    waiting = next((e["task"] for e in evals if same(e) and "total" not in e), None)
    return [e for e in evals if not same(e)] + [{**new, "task": waiting} if waiting else new]


def final(evals: list[dict], total_steps: int | None) -> list[dict]:
    """The evals to report: the trainer also evaluates at its last step just before the Post eval,
    so an intermediate eval at the final step counts the Post one twice and is left out."""
    evals = [e for e in evals if "total" in e]  # a task's measure whose eval never came: nothing to show
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
    """The model card's table rows (Markdown): GSM8K's columns, or a task's measure and the mean reward."""
    rows = [
        f"| {label(e)} | {task_value(e['task'])} | {e['mean_reward']:.3f} |"
        if e.get("task")
        else f"| {label(e)} | {e['accuracy']:.2f} | {e['format_accuracy']:.2f} | {e['partial_accuracy']:.2f} "
        f"| {e['mean_reward']:.3f} |"
        for e in evals
    ]
    return "\n".join(rows) or "| (no eval results recorded) | | | | |"


def task_value(measured: dict) -> str:
    """A task's measure of one eval as a table cell: `78.12 (50/64)`, or a mean reward's `0.438 (sd 0.410, 64)`."""
    if measured["measure"] == MEAN_REWARD:
        return f"{measured['value']:.3f} (sd {measured['sd']:.3f}, {measured['total']:.0f})"
    return f"{measured['value']:.2f} ({measured['right']:.0f}/{measured['total']:.0f})"


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


def _spread(percent: float, total: float) -> float:
    n = total + 2
    p = (percent / 100 * total + 1) / n
    return p * (1 - p) / n


def interval(one: dict, other: dict, key: str) -> float:
    """The 95% interval, in points, of the change in `key` between two evals (Agresti-Caffo: one success and one
    failure added to each side, sound at 0% and 100% too)."""
    return 100 * Z95 * math.sqrt(_spread(one[key], one["total"]) + _spread(other[key], other["total"]))


def margin_of(percent: float, total: int, other_percent: float, other_total: int) -> float:
    """The 95% interval of the difference of two accuracies, each of its own number of problems."""
    return interval(
        {"accuracy": percent, "total": total}, {"accuracy": other_percent, "total": other_total}, "accuracy"
    )


def outcome(evals: list[dict]) -> dict | None:
    """The run's result: the first attempt's eval before training (never a resumed attempt's eval of restored
    weights) against the last eval (after training, else the latest step's), with the 95% interval of the
    change: by the task's measure where the evals carry one, else by GSM8K's accuracy (Agresti-Caffo: one success
    and one failure added to each side, sound at 0% and 100% too; a mean reward's from its spread)."""
    before = next((e for e in evals if e["phase"] == "pre"), None)
    later = [e for e in evals if e["phase"] != "pre"]
    if before is None or not later:
        return None
    after = next((e for e in later if e["phase"] == "post"), None) or max(later, key=lambda e: e["step"] or 0)
    found = {
        "after_label": label(after),
        "format_before": before["format_accuracy"],
        "format_after": after["format_accuracy"],
        "format_interval": round(interval(before, after, "format_accuracy"), 2),
        "mean_reward_after": after["mean_reward"],
    }
    if (first := before.get("task")) and (last := after.get("task")) and first["measure"] == last["measure"]:
        if last["measure"] == MEAN_REWARD:
            margin = Z95 * math.sqrt(first["sd"] ** 2 / first["total"] + last["sd"] ** 2 / last["total"])
        else:
            margin = margin_of(first["value"], first["total"], last["value"], last["total"])
        found |= {"task": last["name"], "measure": last["measure"], "before": first["value"], "after": last["value"]}
        found["problems"] = int(last["total"])
    else:
        margin = interval(before, after, "accuracy")
        found |= {"task": "", "measure": "accuracy", "before": before["accuracy"], "after": after["accuracy"]}
        found["problems"] = int(after["total"])
    change = found["after"] - found["before"]
    return {**found, "change": round(change, 4), "interval": round(margin, 4), "judged": abs(change) > margin}


def _said(result: dict, value: float) -> str:
    """A value of the run's measure as the result line says it: a mean reward as a number, the rest in %."""
    return f"{value:.3f}" if result["measure"] == MEAN_REWARD else f"{value:.1f}%"


def measure_name(result: dict) -> str:
    """`GSM8K accuracy`, `arithmetic correct`, `arithmetic mean reward`: what the run is judged by."""
    if not result.get("task"):
        return "GSM8K accuracy"
    return f"{result['task']} {result['measure'].replace('_', ' ')}"


def change_said(result: dict) -> str:
    """`+13.3 points, 95% interval +-3.8`, or a mean reward's `+0.125, 95% interval +-0.050`."""
    if result["measure"] == MEAN_REWARD:
        return f"{result['change']:+.3f}, 95% interval +-{result['interval']:.3f}"
    return f"{result['change']:+.1f} points, 95% interval +-{result['interval']:.1f}"


def result_line(result: dict) -> str:
    """`GSM8K accuracy 48.2% -> 61.5% (+13.3 points, 95% interval +-3.8) on 1,319 held-out problems; format 71% ->
    98%` (a task of your own: its measure, `arithmetic correct 12.5% -> 78.1% (...)`), and when the change is within
    the interval, that these problems cannot tell it from noise."""
    line = (
        f"{measure_name(result)} {_said(result, result['before'])} -> {_said(result, result['after'])} "
        f"({change_said(result)}) on {result['problems']:,} held-out problems"
    )
    if not result.get("task"):
        line += f"; format {result['format_before']:.0f}% -> {result['format_after']:.0f}%"
    if not result["judged"]:
        line += f"; too few problems to tell this change from noise ({noise(result)})"
    return line


def noise(result: dict) -> str:
    """The interval as a margin: `+-3.8 points`, or a mean reward's `+-0.050`."""
    if result["measure"] == MEAN_REWARD:
        return f"+-{result['interval']:.3f}"
    return f"+-{result['interval']:.1f} points"


def resumes(evals: list[dict]) -> list[str]:
    """What each resume of train kept and changed (proven on the CPU tier, tests/maxtext_cpu/test_real_loss.py,
    for MaxText 0.2.3 and 0.2.5): tunix skips the batches the restored steps trained and the data order is
    fixed by its seed, so the batches, step numbers and rates are the uninterrupted run's; vLLM's TPU backend
    takes no per-request seed, so the completions after the resume are drawn anew."""
    return [
        f"resumed at step {e['step']}: the batches, step numbers and learning rates of a run never stopped; its "
        "completions after it sampled anew (vLLM's random state is not in the checkpoint)"
        for e in evals
        if e["phase"] == "resumed"
    ]


def warnings(result: dict) -> list[str]:
    """What a practitioner would point out, one line each with its numbers: the format learned instead of the
    task (GSM8K's format), and a model worse than the one it was trained from."""
    found = []
    format_rose = result["format_after"] - result["format_before"] > result["format_interval"]
    if not result.get("task") and format_rose and result["change"] <= result["interval"]:
        found.append(
            f"format accuracy rose {result['format_before']:.0f}% -> {result['format_after']:.0f}% while accuracy did "
            f"not ({result['before']:.1f}% -> {result['after']:.1f}%): the model learned the answer format, not the task"
        )
    if result["change"] < -result["interval"]:
        what = measure_name(result) if result.get("task") else "accuracy"
        change = change_said(result).split(", 95% interval")[0]
        found.append(
            f"{what} fell {_said(result, result['before'])} -> {_said(result, result['after'])} ({change}, beyond "
            f"the {noise(result).removesuffix(' points')} of noise): this model is worse than the one it was trained "
            "from"
        )
    return found


def missing(results: list[dict]) -> str:
    """What of the run's evals is not there to judge it by (for a run whose `outcome` is None)."""
    if not results:
        return "no held-out eval was recorded for this run (train.num_test_batches: 0 evaluates nothing)"
    if not any(e["phase"] == "pre" for e in results):
        return "the eval of the model before training is not among this run's records (it was never recorded)"
    return "no eval after training is among this run's records"


def card_result(evals: list[dict]) -> str:
    """The model card's result paragraph (Markdown), or a plain note of what was not recorded."""
    result = outcome(evals)
    if result is None:
        return f"Not judged: {missing(evals)}."
    return "\n\n".join([f"**Result:** {result_line(result)}.", *(f"**Warning:** {w}." for w in warnings(result))])


def held_back(results: list[dict], rule: str) -> str | None:
    """Why results.publish_if keeps this run's model off the Hub (None: publish it). `rule`: "always",
    "improved", or the least the run's measure must reach after training (GSM8K's accuracy in %, a task's
    measure in its own unit). Missing evals never pass silently."""
    if rule == "always":
        return None
    result = outcome(results)
    if result is None:
        return f"{missing(results)}, so publish_if: {rule} cannot be judged"
    if rule == "improved":
        if result["judged"] and result["change"] > 0:
            return None
        return f"publish_if: improved, and it did not: {result_line(result)}"
    if result["after"] >= float(rule):
        return None
    least = f"{rule}% accuracy" if not result.get("task") else f"{rule} ({measure_name(result)} after training)"
    return f"publish_if: {least}, and it reached {_said(result, result['after'])}: {result_line(result)}"
