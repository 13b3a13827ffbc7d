"""Read a job's log as it streams and show how far it is, without the raw noise.

Parses the real log lines of the workload (reference section 6) and the job
runner's own `[tpu-rl] step k/N` lines (it reads the trainer's TensorBoard
events, since the trainer's bar only shows on a terminal). On a terminal this is
a rich progress bar with an ETA; elsewhere, plain heartbeat lines.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

EVAL = re.compile(
    r"(?P<phase>Pre RL Training|Intermediate Eval \(step=(?P<step>\d+)\)|Post RL Training): "
    r"corr=(?P<corr>\d+), total=(?P<total>\d+), accuracy=(?P<accuracy>[\d.]+)%, "
    r"partial_accuracy=(?P<partial_accuracy>[\d.]+)%, format_accuracy=(?P<format_accuracy>[\d.]+)%, "
    r"mean_reward=(?P<mean_reward>-?[\d.]+)"
)
WEIGHTS = re.compile(r"Transforming weights:.*?(\d+)/(\d+)")
STEP = re.compile(r"\[tpu-rl\] step (\d+)/(\d+)")
SETUP_STEP = re.compile(r"^==> (.*)")
NOTABLE = re.compile(
    r"Starting RL training|RL Training Completed Successfully|Overall Elapse|Peak Memory|MAXTEXT CONFIG ERROR|"
    r"Traceback|Error|\[tpu-rl\] (?!step)"
)
HEARTBEAT_SECONDS = 30
ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")


@dataclass
class Update:
    """What one log line says: a counter, an eval result, or a line worth showing."""

    kind: str  # "count", "eval", "phase", "note"
    text: str = ""
    done: int = 0
    total: int = 0
    eval: dict | None = None


def parse(line: str) -> Update | None:
    if m := EVAL.search(line):
        values = {k: float(v) for k, v in m.groupdict().items() if k not in ("phase", "step") and v is not None}
        phase = "pre" if m["phase"].startswith("Pre") else "post" if m["phase"].startswith("Post") else "intermediate"
        return Update(
            "eval",
            ABSL_PREFIX.sub("", line.strip()),
            eval={"phase": phase, "step": int(m["step"]) if m["step"] else None, **values},
        )
    if m := WEIGHTS.search(line):
        return Update("count", "transforming weights", int(m[1]), int(m[2]))
    if m := STEP.search(line):
        return Update("count", "training steps", int(m[1]), int(m[2]))
    if m := SETUP_STEP.match(line):
        return Update("phase", m[1])
    if NOTABLE.search(line):
        return Update("note", ABSL_PREFIX.sub("", line.strip()))
    return None


def eval_label(e: dict) -> str:
    return {"pre": "before training", "post": "after training"}.get(e["phase"], f"step {e['step']}")


def eval_table(evals: list[dict]) -> Table:
    table = Table(title="GSM8K evaluation")
    for column in ("when", "accuracy %", "format accuracy %", "partial accuracy %", "mean reward", "correct"):
        table.add_column(column, justify="right" if column != "when" else "left")
    for e in evals:
        table.add_row(
            eval_label(e),
            f"{e['accuracy']:.2f}",
            f"{e['format_accuracy']:.2f}",
            f"{e['partial_accuracy']:.2f}",
            f"{e['mean_reward']:.3f}",
            f"{e['corr']:.0f}/{e['total']:.0f}",
        )
    return table


class JobProgress:
    """Feed it log lines; it keeps the display current and collects eval results."""

    def __init__(self, console: Console, job: str, clock=time.monotonic):
        self.console, self.job, self.clock = console, job, clock
        self.started = self.last_beat = clock()
        self.phase = "starting"
        self.count: tuple[int, int] | None = None
        self.count_started: tuple[float, int] | None = None
        self.evals: list[dict] = []
        self.bar: Progress | None = None
        self.task = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn(f"[bold]{job}[/] {{task.description}}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            self.task = self.bar.add_task(self.phase, total=None)

    def __enter__(self) -> JobProgress:
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar:
            self.bar.stop()

    def feed(self, line: str) -> None:
        update = parse(line)
        if update is not None:
            self._apply(update)
        self._heartbeat()

    def _apply(self, update: Update) -> None:
        if update.kind == "count":
            if self.phase != update.text or self.count_started is None:
                self.phase, self.count_started = update.text, (self.clock(), update.done)
                if self.bar is None:
                    self.console.print(
                        f"[{self.job}] {update.text} {update.done}/{update.total}", markup=False, highlight=False
                    )
            self.count = (update.done, update.total)
            if self.bar:
                self.bar.update(self.task, description=update.text, completed=update.done, total=update.total)
            return
        if update.kind == "eval":
            self.evals.append(update.eval)
        if update.kind == "phase":
            self.phase, self.count, self.count_started = update.text, None, None
            if self.bar:
                self.bar.reset(self.task, description=update.text, total=None)
        self.console.print(f"[{self.job}] {update.text}", markup=False, highlight=False)

    def eta_seconds(self) -> float | None:
        if not self.count or not self.count_started:
            return None
        since, first = self.count_started
        done, total = self.count
        rate = (done - first) / max(self.clock() - since, 1e-9)
        return (total - done) / rate if rate > 0 else None

    def status_line(self) -> str:
        elapsed = _duration(self.clock() - self.started)
        if self.count:
            eta = self.eta_seconds()
            tail = f", ETA {_duration(eta)}" if eta is not None else ""
            return f"[{self.job}] {self.phase} {self.count[0]}/{self.count[1]}, {elapsed} elapsed{tail}"
        return f"[{self.job}] {self.phase}, {elapsed} elapsed"

    def _heartbeat(self) -> None:
        if self.bar is None and self.clock() - self.last_beat >= HEARTBEAT_SECONDS:
            self.last_beat = self.clock()
            self.console.print(self.status_line(), markup=False, highlight=False)

    def tick(self) -> None:
        """Called when no line came for a while, so a silent job still shows it is alive."""
        self._heartbeat()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )
