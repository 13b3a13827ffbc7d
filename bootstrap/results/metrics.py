"""The run's training metrics as files a person can keep and compare: CSV, a PNG, a summary.

Reads the trainer's TensorBoard event files with TensorBoard's own reader (scalars
written as simple values or as tensors both count) and the eval results that
`fab train` collected from the log.
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

from ..remote import evals  # noqa: E402
from .goodput import Ledger  # noqa: E402
from .runs import minutes  # noqa: E402

PANELS = {
    "reward": "rewards/train/score/mean",
    "loss": "actor/train/loss",
    "KL": "actor/train/kl",
}
Series = dict[str, dict[int, float]]  # tag -> step -> value
# tunix logs rollout metrics for step N at step N-1 (tests/fixtures/logs, maxtext_cpu.md): shift them
# so that one row is one training step. jax/* are compile and checkpoint timings, not training.
ONE_STEP_BEHIND = ("rewards/", "completions/", "sampler_trainer/")  # the last: health_hooks.py, at the rollout
# tunix writes a step's metrics once the next update is done and reads the learning rate from the
# optimizer state then, so step N's value is the rate of update N+1 (the last step's is its own, which
# the step before it already shows): shifted too, the rate of update 1 is not in the files.
LEARNING_RATE = "actor/train/learning_rate"
STEP_TAG = "actor/train/loss"  # written once per training step, at that step
SKIPPED = ("jax/",)


Scalars = dict[str, list[tuple[int, float, float]]]  # tag -> (step, wall time, value) as written


def _scalars(path: Path) -> tuple[Scalars, float]:
    """One event file's scalars (written as simple values or as tensors), and when the file was begun."""
    acc = EventAccumulator(str(path), size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    found: Scalars = {}
    for tag in tags.get("scalars", []):
        found[tag] = [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
    for tag in tags.get("tensors", []):
        values = [(e.step, e.wall_time, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
        found[tag] = [(step, wall, float(v.reshape(-1)[0])) for step, wall, v in values if v.size == 1]
    try:
        begun = acc.FirstEventTimestamp()
    except ValueError:  # no event at all: a file its writer had only just begun when the VM was lost
        begun = 0.0
    return found, begun


def _event_files(folder: Path) -> list[tuple[Scalars, float]]:
    """Each event file's scalars and when it was begun, oldest first (train begins one file per start)."""
    return sorted((_scalars(path) for path in folder.rglob("*tfevents*")), key=lambda found: found[1])


def read_events(folder: Path) -> Series:
    """Every training scalar in every event file below `folder`, by tag and training step (later files win)."""
    series: Series = {}
    for scalars, _ in _event_files(folder):
        for tag, events in scalars.items():
            series.setdefault(tag, {}).update({step: value for step, _, value in events})
    if values := series.get(LEARNING_RATE):
        last = max(values)
        series[LEARNING_RATE] = {step + 1: value for step, value in values.items() if step < last}
    return {
        tag: {step + tag.startswith(ONE_STEP_BEHIND): value for step, value in values.items()}
        for tag, values in series.items()
        if not tag.startswith(SKIPPED)
    }


def _step_times(scalars: Scalars) -> dict[int, float]:
    """When each training step was logged: from its loss or, written a step earlier, its rollout's metrics."""
    times: dict[int, float] = {}
    for tag, events in scalars.items():
        for step, wall, _ in events:
            if tag == STEP_TAG:
                times[step] = wall
            elif tag.startswith(ONE_STEP_BEHIND):
                times.setdefault(step + 1, wall)
    return times


def attempts(folder: Path, starts: list[dict]) -> list[dict]:
    """Each start of train with the training steps its event files logged, and when. `starts` are the
    durable records of the starts (attempts.py): a start whose events never reached the bucket (a lost
    VM flushes nothing) still counts, with the step it resumed from. Without records (a run from before
    they were kept) each event file counts as one start, begun when it was."""
    files = [(_step_times(scalars), begun) for scalars, begun in _event_files(folder) if begun]
    if not starts:
        return [{"begun": begun, "resumed_from": None, "times": dict(sorted(t.items()))} for t, begun in files]
    found = [{"begun": s["started"], "host": s["host"], "resumed_from": s["resumed_from"], "times": {}} for s in starts]
    for times, _ in files:  # a file's steps belong to the last start before its first one
        first = min(times.values(), default=0.0)
        owner = max((a for a in found if a["begun"] <= first), key=lambda a: a["begun"], default=found[0])
        owner["times"].update(times)
    for attempt in found:
        attempt["times"] = dict(sorted(attempt["times"].items()))
    return found


def loss_cost(tries: list[dict]) -> dict:
    """What the losses cost: each step a start trained that the next start trained again (those after the
    step it resumed from, or, without records, those a later start logged too), with the minutes that
    step took, and the minutes each later start took to reach its first step. A lost VM's steps after
    its last written event are in no file: the counts are at least these."""
    redone, minutes_redone, restarting, each = 0, 0.0, 0.0, []
    for i, earlier in enumerate(tries[:-1]):
        later = tries[i + 1]
        resumed = later["resumed_from"]
        trained_later = {step for after in tries[i + 1 :] for step in after["times"]}
        lost = 0.0
        for step, took in _step_seconds(earlier["times"]).items():
            if step > resumed if resumed is not None else step in trained_later:
                redone += 1
                lost += took / 60
        minutes_redone += lost
        starting = (min(later["times"].values()) - later["begun"]) / 60 if later["times"] else 0.0
        restarting += starting
        each.append({"begun": later["begun"], "minutes": round(lost + starting, 2)})
    return {
        "attempts": len(tries),
        "resumed_from": [attempt["resumed_from"] for attempt in tries],
        "steps_redone": redone,
        "minutes_redone": round(minutes_redone, 2),
        "minutes_restarting": round(restarting, 2),
        "restarts": each,  # each later start: when it began, and the minutes trained again and spent starting
    }


def preemption_cost(preemptions: list[dict], losses: dict, chips: int) -> list[dict]:
    """Each preemption record (remote/preempted.py) with the chip-hours it cost: the restart that followed it,
    its steps trained again and its start-up."""
    costed, restarts = [], list(losses.get("restarts", []))
    for found in sorted(preemptions, key=lambda p: p["at"]):
        after = next((r for r in restarts if r["begun"] >= found["at"]), None)
        if after:  # each restart is charged to one preemption only
            restarts.remove(after)
        hours = after["minutes"] / 60 * chips if after else None
        costed.append({**found, "lost_chip_hours": None if hours is None else round(hours, 3)})
    return costed


def preemption_line(costed: list[dict]) -> str:
    """fab metrics' line on the run's preemptions: when, at which committed step, what each cost."""
    each = []
    for found in costed:
        when = datetime.fromtimestamp(found["at"], UTC).strftime("%H:%M UTC")
        step = found.get("committed_step")
        lost = found.get("lost_chip_hours")
        each.append(
            f"at {when} (last committed step {step if step is not None else 'none'}"
            + (f", {lost:.2f} chip-hours lost)" if lost is not None else ", not resumed yet)")
        )
    return f"preempted {len(costed)} time{'s' if len(costed) > 1 else ''}: {'; '.join(each)}"


def _step_seconds(times: dict[int, float]) -> dict[int, float]:
    """How long each step of one start took: from the step before it; its first step, the median of the others."""
    steps = sorted(times)
    took = {b: times[b] - times[a] for a, b in zip(steps, steps[1:], strict=False)}
    if steps:
        took[steps[0]] = sorted(took.values())[len(took) // 2] if took else 0.0
    return took


def write_csv(series: Series, path: Path) -> None:
    """One row per step, one column per tag."""
    tags = sorted(series)
    steps = sorted({step for values in series.values() for step in values})
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *tags])
        for step in steps:
            writer.writerow([step, *(series[tag].get(step, "") for tag in tags)])


def write_evals_csv(evals: list[dict], path: Path) -> None:
    """One row an eval: GSM8K's numbers, and a task's measure (its name, value, completions) where there is one."""
    columns = ["phase", "step", "accuracy", "format_accuracy", "partial_accuracy", "mean_reward", "corr", "total"]
    task = ["task_measure", "task_value", "task_total"] if any(e.get("task") for e in evals) else []
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*columns, *task], extrasaction="ignore")
        writer.writeheader()
        for e in evals:
            measured = e.get("task") or {}
            writer.writerow(
                {
                    **e,
                    "task_measure": measured.get("measure"),
                    "task_value": measured.get("value"),
                    "task_total": measured.get("total"),
                }  # fmt: skip
            )


def eval_steps(evals: list[dict], last_step: int) -> list[tuple[int, float, str]]:
    """(step, the run's measure, label) for each eval: before training at 0, after at the last step; the measure is
    a task's where the evals carry one, else GSM8K's accuracy."""
    points = []
    for e in evals:
        step = {"pre": 0, "post": last_step}.get(e["phase"], e.get("step") or 0)
        value = e["task"]["value"] if e.get("task") else e["accuracy"]
        points.append((step, value, {"pre": "before", "post": "after"}.get(e["phase"], f"step {step}")))
    return points


def plot(series: Series, evals: list[dict], path: Path, title: str, ledger: Ledger | None = None) -> None:
    """The training panels over the steps; under them, with a ledger, where the paid chip time went."""
    rows = len(PANELS) + (1 if ledger and ledger.share is not None else 0)
    figure = plt.figure(figsize=(9, 9 + (1.6 if rows > len(PANELS) else 0)))
    grid = figure.add_gridspec(rows, 1, height_ratios=[3] * len(PANELS) + [1] * (rows - len(PANELS)))
    axes = [figure.add_subplot(grid[0])]
    axes += [figure.add_subplot(grid[i], sharex=axes[0]) for i in range(1, len(PANELS))]
    last_step = max((max(v) for v in series.values() if v), default=0)
    for ax, (label, tag) in zip(axes, PANELS.items(), strict=True):
        values = series.get(tag, {})
        steps = sorted(values)
        ax.plot(steps, [values[s] for s in steps], marker="." if len(steps) < 60 else None, label=tag)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if not steps:
            ax.text(0.5, 0.5, f"no {tag} in the event files", ha="center", transform=ax.transAxes)
    if evals:
        _plot_evals(axes[0], evals, last_step)
    axes[-1].set_xlabel("training step")
    if rows > len(PANELS):
        _plot_goodput(figure.add_subplot(grid[-1]), ledger)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_evals(ax, evals: list[dict], last_step: int) -> None:
    accuracy = ax.twinx()
    points = eval_steps(evals, last_step)
    measured = next((e["task"] for e in evals if e.get("task")), None)
    name = f"{measured['name']} {measured['measure']}" if measured else "GSM8K accuracy %"
    unit = "" if measured and measured["measure"] == "mean_reward" else "%"
    accuracy.plot([p[0] for p in points], [p[1] for p in points], "s--", color="tab:green", label=name)
    for step, value, text in points:
        offset = (-70, -12) if step == last_step else (4, 6)  # keep the last label inside the frame
        accuracy.annotate(
            f"{text}: {value:.1f}{unit}", (step, value), textcoords="offset points", xytext=offset, fontsize=8
        )
    accuracy.set_ylabel(f"eval {name}")
    accuracy.legend(loc="lower right")


def _plot_goodput(ax, ledger: Ledger) -> None:
    """One bar of the paid chip-hours: the kept steps first, then each cause, largest first."""
    parts = [("kept steps", ledger.productive_s)]
    parts += sorted(((c.label, s) for c, s in ledger.badput.items() if s > 0), key=lambda item: -item[1])
    left = 0.0
    colours = plt.get_cmap("tab20").colors
    for i, (label, seconds) in enumerate(parts):
        hours = ledger.chip_hours(seconds)
        ax.barh(0, hours, left=left, color="tab:green" if i == 0 else colours[(i * 2) % len(colours)], label=label)
        left += hours
    ax.set_yticks([])
    ax.set_xlabel(f"chip-hours paid: goodput {ledger.share:.0%}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=6, fontsize=7, frameon=False)


FLAT_SHARE = 0.5  # more steps than this with every completion scored alike: say there was little to learn from


def flat_rewards(series: Series) -> str | None:
    """A warning when most training steps had no reward spread: the highest reward of the step's completions
    equal to the lowest. rl.yml trains one prompt a step (batch_size 1), so such a step's group gave GRPO no
    advantage to learn from; with more prompts a step, it counts the steps where none of them did."""
    highest, lowest = series.get("rewards/train/score/max", {}), series.get("rewards/train/score/min", {})
    steps = sorted(set(highest) & set(lowest))
    flat = [step for step in steps if highest[step] == lowest[step]]
    if not steps or len(flat) <= FLAT_SHARE * len(steps):
        return None
    return (
        f"every completion scored alike at {len(flat)} of {len(steps)} steps (reward spread zero): GRPO had no "
        "learning signal there; more rl.num_generations or a reward with partial credit gives it one"
    )


def split_line(split: dict) -> str:
    """Where train's time went (results/timing.py), in one line."""
    steps = split["steps"] * split["step_s"]
    evals = split["evals"] * split["eval_s"]
    return (
        f"start-up {split['startup_s']:.0f} s (load, compile, first eval), {split['steps']} steps x "
        f"{split['step_s']:.2f} s = {steps:.0f} s, {split['evals']} evals x {split['eval_s']:.1f} s = {evals:.0f} s, "
        f"checkpoint saves {split['saves_s']:.1f} s; {split['total_s']:.0f} s in all"
    )


def summarize(record, path: Path, losses: dict, series: Series | None = None, ledger: Ledger | None = None) -> dict:
    """Per-job durations, evals, durable copies, what losses cost train and where the paid time went (goodput):
    what to compare with the next run."""
    jobs = {name: {"state": info.get("state"), "minutes": minutes(info)} for name, info in record.jobs.items()}
    result = evals.outcome(record.evals)
    flat = flat_rewards(series or {})
    summary = {
        "run": record.name,
        "jobs": jobs,
        "evals": record.evals,
        "result": {**result, "line": evals.result_line(result)} if result else None,
        "warnings": [*(evals.warnings(result) if result else []), *([flat] if flat else [])],
        "results": record.results,
        "train_losses": losses,
        "time_split": record.timing,
        "preemptions": record.preemptions,
        "goodput": ledger.to_dict() if ledger else None,
    }
    path.write_text(json.dumps(summary, indent=1))
    return summary
