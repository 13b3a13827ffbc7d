"""Read a job's log as it streams and show how far it is, without the raw noise.

Parses the real log lines of MaxText 0.2.3's jobs (recorded in tests/fixtures/logs):
the converter's `Transforming weights: k/N` bar, the trainer's `Train step N training
loss:` line (printed for every step, terminal or not), the eval lines, and the setup
script's `==>` steps. On a terminal each running job has a rich progress bar with an
ETA on one shared display; elsewhere, plain lines and a heartbeat.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..remote import evals

WEIGHTS = re.compile(r"Transforming weights:.*?(\d+)/(\d+)")
STEP = re.compile(r"Train step (\d+) training loss: (\S+)")
SETUP_STEP = re.compile(r"^==> (.*)")
# uv's own lines for each large package it fetches (printed without a terminal too): the setup job's download bar
DOWNLOADING = re.compile(r"^Downloading (\S+) \(([\d.]+)([KMG])iB\)$")
DOWNLOADED = re.compile(r"^\s*Downloaded (\S+)$")
MIB = {"K": 1 / 1024, "M": 1, "G": 1024}
NOTABLE = re.compile(
    r"Starting RL training|RL Training Completed Successfully|Conversion complete|successfully saved in HuggingFace|"
    r"Overall Elapse|Peak Memory|MAXTEXT CONFIG ERROR|ENVIRONMENT ERROR|Traceback|Error|\[tpu-rl\] "
)
HEARTBEAT_SECONDS = 30
ABSL_PREFIX = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\] |(?:INFO|WARNING|ERROR):absl:)")


@dataclass
class Update:
    """What one log line says: a counter, an eval result, or a line worth showing."""

    kind: str  # "count", "eval", "phase", "note", "download" (a package announced, `size` MiB), "downloaded"
    text: str = ""
    note: str = ""
    done: int = 0
    total: int = 0
    eval: dict | None = None
    size: float = 0.0


def parse(line: str, total_steps: int | None = None) -> Update | None:
    if (found := evals.parse(line)) is not None:
        return Update("eval", ABSL_PREFIX.sub("", line.strip()), eval=found)
    if m := WEIGHTS.search(line):
        return Update("count", "transforming weights", done=int(m[1]), total=int(m[2]))
    if m := STEP.search(line):
        return Update("count", "training steps", done=int(m[1]), total=total_steps or int(m[1]), note=f"loss {m[2]}")
    if m := DOWNLOADING.match(line):
        return Update("download", m[1], size=float(m[2]) * MIB[m[3]])
    if m := DOWNLOADED.match(line):
        return Update("downloaded", m[1])
    if m := SETUP_STEP.match(line):
        return Update("phase", m[1])
    if NOTABLE.search(line):
        return Update("note", ABSL_PREFIX.sub("", line.strip()))
    return None


def result_lines(results: list[dict]) -> list[str]:
    """The run's result in one line and each warning (evals.outcome; none before two evals), then what each
    resume kept (said even when this machine did not see the eval before training)."""
    result = evals.outcome(results)
    judged = (
        [f"result: {evals.result_line(result)}", *(f"warning: {w}" for w in evals.warnings(result))] if result else []
    )
    return [*judged, *evals.resumes(results)]


def eval_table(results: list[dict]) -> Table:
    """Each held-out eval: GSM8K's columns, and a task's measure where the evals carry one."""
    measured = next((e["task"] for e in results if e.get("task")), None)
    title = f"task {measured['name']} evaluation" if measured else "GSM8K evaluation"
    table = Table(title=title)
    columns = ["when", *([measured["measure"]] if measured else [])]
    columns += ["accuracy %", "format accuracy %", "partial accuracy %", "mean reward", "correct"]
    for column in columns:
        table.add_column(column, justify="right" if column != "when" else "left")
    for e in results:
        table.add_row(
            evals.label(e),
            *([evals.task_value(e["task"]) if e.get("task") else "-"] if measured else []),
            f"{e['accuracy']:.2f}",
            f"{e['format_accuracy']:.2f}",
            f"{e['partial_accuracy']:.2f}",
            f"{e['mean_reward']:.3f}",
            f"{e['corr']:g}/{e['total']:.0f}",  # pass_at_1 averages its passes: 11.25/64
        )
    return table


class Board:
    """The display of every job being followed: one rich live view on a terminal, plain lines elsewhere."""

    def __init__(self, console: Console):
        self.console = console
        self.bars: Progress | None = None
        if console.is_terminal:
            self.bars = Progress(
                TextColumn("[bold]{task.fields[job]}[/] {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )

    def __enter__(self) -> Board:
        if self.bars:
            self.bars.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bars:
            self.bars.stop()

    def job(self, name: str, total_steps: int | None = None) -> JobProgress:
        return JobProgress(self.console, name, total_steps, self.bars)


class JobProgress:
    """Feed it log lines; it keeps the display current and collects eval results."""

    PLAIN_EVERY_SECONDS = 10

    def __init__(self, console: Console, job: str, total_steps: int | None = None, bars=None, clock=time.monotonic):
        self.console, self.job, self.total_steps, self.clock = console, job, total_steps, clock
        self.started = self.last_beat = self.last_count_line = clock()
        self.phase = "starting"
        self.count: tuple[int, int] | None = None
        self.count_started: tuple[float, int] | None = None
        self.collected: list[dict] = []
        self.downloads: dict[str, tuple[float, bool]] = {}  # package -> (MiB, fetched)
        self.attempts = evals.Attempts()
        self.bars = bars
        self.task = bars.add_task(self.phase, total=None, job=job) if bars else None

    @property
    def evals(self) -> list[dict]:
        return evals.final(self.collected, self.total_steps)

    def feed(self, line: str) -> None:
        update = parse(line, self.total_steps)
        labelled = self.attempts.read(line)  # an eval of a resumed attempt is labelled as such
        if update is not None:
            self._apply(dataclasses.replace(update, eval=labelled) if update.kind == "eval" else update)
        self._heartbeat()

    def _apply(self, update: Update) -> None:
        if update.kind in ("download", "downloaded"):  # the bar in MiB of what uv announced
            size = self.downloads.get(update.text, (update.size, False))[0]
            self.downloads[update.text] = (size, update.kind == "downloaded")
            done = sum(size for size, fetched in self.downloads.values() if fetched)
            total = sum(size for size, _ in self.downloads.values())
            update = Update("count", "downloading packages, MiB", done=round(done), total=round(total))
        if update.kind == "count":
            new_phase = self.phase != update.text or self.count_started is None
            if new_phase:
                self.phase, self.count_started = update.text, (self.clock(), update.done)
            self.count = (update.done, update.total)
            if self.bars:
                self.bars.update(self.task, description=update.text, completed=update.done, total=update.total)
            elif (
                new_phase
                or update.done == update.total
                or self.clock() - self.last_count_line >= self.PLAIN_EVERY_SECONDS
            ):
                self.last_count_line = self.last_beat = self.clock()
                self.console.print(
                    self.status_line() + (f", {update.note}" if update.note else ""), markup=False, highlight=False
                )
            return
        if update.kind == "eval":
            self.collected = evals.collect(self.collected, update.eval)
        if update.kind == "phase":
            self.phase, self.count, self.count_started = update.text, None, None
            if self.bars:
                self.bars.reset(self.task, description=update.text, total=None)
        self._print(f"[{self.job}] {update.text}")

    def _print(self, text: str) -> None:
        (self.bars.console if self.bars else self.console).print(text, markup=False, highlight=False)

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
        if self.bars is None and self.clock() - self.last_beat >= HEARTBEAT_SECONDS:
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
