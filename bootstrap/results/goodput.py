"""Goodput: the share of the chip time a run paid for that went to training steps it kept; the rest, badput, by cause.

Google's ML goodput, for one run. Paid: from the VM's boot (for the first run on it) through each job, each VM the run
lost, to autostop's shutdown. Productive: the steps the run kept, each once, at its steady rate, without the
checkpoint saves inside them. Every other second is one cause's, so the causes and the productive time add up to
what was paid. Read from what survives a lost VM: the run's record on this machine (each job's start and end, each
lost VM's span, train's time split from its log, what fab metrics counted of its losses), so `fab runs`, `fab
metrics` and the result line say the same figures; `expected` gives the same ledger from an estimate (`fab plan`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .runs import RunRecord


class Cause(enum.Enum):
    """Where paid chip time went that no kept step used."""

    BOOT = "boot"
    """From the VM's boot to the first job of the first run on it: the startup script, and waiting for fab."""
    SETUP = "setup"
    """The environment's build (setup), until train could start."""
    CONVERT = "convert"
    """Prefetch, convert and validate beyond setup's time: the model fetched and made MaxText's."""
    STARTUP = "startup"
    """Train's start-up: loading, compiling, and what its first steps took beyond the steady rate."""
    EVALS = "evals"
    """The evals: before training, every eval_interval steps, after."""
    SAVES = "saves"
    """What each checkpoint save held training up."""
    AGAIN = "again"
    """Steps trained a second time after a preemption or a crash, from the last committed checkpoint."""
    RESTARTS = "restarts"
    """A lost VM's or a crashed train's other time: its set-up and start-up again."""
    OTHER = "other"
    """Train's time that none of the above explains: its end, its last save, waits on data (MaxText logs none)."""
    EXPORT = "export"
    """Export and the durable copies, after training."""
    IDLE = "idle"
    """After the run, the VM idle until autostop shuts it down."""

    @property
    def label(self) -> str:
        return LABELS[self]


LABELS = {
    Cause.BOOT: "boot", Cause.SETUP: "setup", Cause.CONVERT: "prefetch and convert", Cause.STARTUP: "start-up",
    Cause.EVALS: "evals", Cause.SAVES: "saves", Cause.AGAIN: "steps again", Cause.RESTARTS: "restarts",
    Cause.OTHER: "other", Cause.EXPORT: "export", Cause.IDLE: "idle before autostop",
}  # fmt: skip


@dataclass
class Ledger:
    """A run's paid seconds, split: the productive steps' and each cause's (they add up to `paid_s`)."""

    productive_s: float
    badput: dict[Cause, float] = field(default_factory=dict)
    chips: int = 1

    @property
    def paid_s(self) -> float:
        return self.productive_s + sum(self.badput.values())

    @property
    def share(self) -> float | None:
        return self.productive_s / self.paid_s if self.paid_s > 0 else None

    def largest(self) -> tuple[Cause, float] | None:
        found = max(self.badput.items(), key=lambda item: item[1], default=None)
        return found if found and found[1] > 0 else None

    def chip_hours(self, seconds: float) -> float:
        return seconds / 3600 * self.chips

    def line(self) -> str:
        """`goodput 41% of 2.10 chip-hours; badput: evals 0.62 (30%), start-up 0.31 (15%), ...`"""
        if self.share is None:
            return "goodput: nothing paid yet"
        causes = sorted(((c, s) for c, s in self.badput.items() if s > 0), key=lambda item: -item[1])
        each = ", ".join(f"{c.label} {self.chip_hours(s):.2f} ({s / self.paid_s:.0%})" for c, s in causes)
        return f"goodput {self.share:.0%} of {self.chip_hours(self.paid_s):.2f} chip-hours" + (
            f"; badput: {each}" if each else ""
        )

    def to_dict(self) -> dict:
        return {
            "share": None if self.share is None else round(self.share, 4),
            "paid_s": round(self.paid_s, 1),
            "productive_s": round(self.productive_s, 1),
            "chip_hours": round(self.chip_hours(self.paid_s), 3),
            "badput_s": {cause.value: round(seconds, 1) for cause, seconds in self.badput.items()},
        }


def measured(record: RunRecord, boot_s: float = 0.0) -> Ledger | None:
    """The run's ledger from its record (None before any job of it ran); `boot_s` where it was the VM's first run
    (`boot_of`). Train's figures are its last start's (results/timing.py); steps kept before that start ran on a VM
    it lost, or in a start that crashed, and count productive there."""
    starts, ends = record.current_times()
    if not starts or not ends:
        return None
    first, last = min(starts), max(ends)
    jobs = {name: job for name, job in record.jobs.items() if job.get("ran", True) and not job.get("lost_vm")}
    badput = dict.fromkeys(Cause, 0.0)
    badput[Cause.BOOT] = boot_s
    train, split = jobs.get("train") or {}, record.timing
    began = train.get("started") or last
    ended = train.get("finished") or began
    badput[Cause.SETUP] = _overlap(jobs.get("setup"), first, began)
    badput[Cause.CONVERT] = max(0.0, began - first) - badput[Cause.SETUP]
    badput[Cause.EXPORT] = max(0.0, last - ended)
    productive, rest = 0.0, max(0.0, ended - began)
    losses = record.train_losses or {}
    restarted_here = losses.get("attempts", 1) > 1 + len(record.lost_vms)  # a train that crashed on this VM
    if split and train.get("started"):
        steps = max(0.0, split["steps"] * split["step_s"] - split["saves_s"])
        pre = _pre_eval_s(split)
        parts = {
            Cause.SAVES: split["saves_s"],
            Cause.EVALS: split["evals"] * split["eval_s"] + pre,
            Cause.STARTUP: max(0.0, split["startup_s"] - pre) + split.get("warmup_s", 0.0),
        }
        spent = steps + sum(parts.values())
        scale = min(1.0, rest / spent) if spent else 1.0  # a runner re-attached mid-run: the log's own figures rule
        productive = steps * scale
        for cause, seconds in parts.items():
            badput[cause] = seconds * scale
        rest -= spent * scale
    lost = sum(vm["ended"] - vm["started"] for vm in record.lost_vms)
    kept_before = min(lost + (rest if restarted_here else 0.0), _kept_before(split))  # steps kept from earlier starts
    productive += kept_before
    pool = lost + (rest if restarted_here else 0.0) - kept_before
    step_s = split["step_s"] if split else 0.0
    badput[Cause.AGAIN] = min(pool, losses.get("steps_redone", 0) * step_s)
    badput[Cause.RESTARTS] = pool - badput[Cause.AGAIN]
    badput[Cause.OTHER] = 0.0 if restarted_here else rest
    if _ended(record):
        badput[Cause.IDLE] = float((record.estimate or {}).get("idle_s") or 0.0)
    return Ledger(productive, badput, max(1, record.chips))


def _overlap(job: dict | None, start: float, end: float) -> float:
    """How much of [start, end] the job ran."""
    if not job or not job.get("started"):
        return 0.0
    return max(0.0, min(end, job.get("finished") or end) - max(start, job["started"]))


def _pre_eval_s(split: dict) -> float:
    """The eval before training (counted in the split's start-up): a whole eval, where the timed ones may have been a
    sample (results/estimate.py: eval_rate)."""
    work = split.get("work") or {}
    if not work.get("num_test_batches") or not split["evals"]:
        return 0.0
    whole, timed = work.get("eval_items"), split.get("eval_items")
    return split["eval_s"] * (whole / timed if whole and timed else 1.0)


def _kept_before(split: dict | None) -> float:
    """The seconds of the steps the last start resumed past: trained by an earlier one, kept, each once."""
    return max(0, split.get("first_step", 1) - 1) * split["step_s"] if split else 0.0


def _ended(record: RunRecord) -> bool:
    """Every job of the run ended: the VM idles from the last one's end until autostop stops it."""
    ran = [job for job in record.jobs.values() if job.get("ran", True) and not job.get("lost_vm")]
    return bool(ran) and all(job.get("finished") and job.get("state") != "running" for job in ran)


def boot_of(record: RunRecord, records: list[RunRecord]) -> float:
    """The boot badput of the run: from its VM's boot to its first job, when it was the first run on that boot (of
    the runs this machine recorded); 0 for any later run, without a boot time (this machine as the VM), and on a
    machine without chips (the demo, the CPU tier: no VM was made for the run, it booted when it booted)."""
    booted = record.booted
    mine = record.current_times()[0]
    if not booted or not mine or not record.chips:
        return 0.0
    same = [r for r in records if r.booted == booted and r.machine == record.machine and r.current_times()[0]]
    firsts = {r.name: min(r.current_times()[0]) for r in same}
    firsts[record.name] = min(mine)
    return max(0.0, min(mine) - booted) if min(firsts, key=firsts.get) == record.name else 0.0


def expected(estimate) -> Ledger | None:
    """The same ledger from an estimate (results/estimate.py), each stage at the middle of its range: train split by
    its parts, the stages before it as setup and the rest, after it export, then autostop's idle. Boot is not
    counted: the estimate begins at the first job."""
    stages = {stage.name: stage for stage in estimate.stages}
    train = stages.get("train")
    if train is None or train.low_s is None or not train.parts:
        return None
    middle = lambda low, high: (low + high) / 2  # noqa: E731
    before = middle(*(estimate.span_before("train", end) for end in ("low_s", "high_s")))
    setup = stages.get("setup")
    setup_s = min(before, middle(setup.low_s, setup.high_s)) if setup and setup.low_s is not None else 0.0
    parts = {name: middle(*bounds) for name, bounds in train.parts.items()}
    whole = middle(train.low_s, train.high_s)
    after = middle(estimate.low_s, estimate.high_s) - before - whole
    badput = dict.fromkeys(Cause, 0.0)
    badput |= {Cause.SETUP: setup_s, Cause.CONVERT: before - setup_s, Cause.EXPORT: max(0.0, after)}
    badput |= {Cause.STARTUP: parts["startup"], Cause.EVALS: parts["evals"], Cause.SAVES: parts["saves"]}
    badput[Cause.OTHER] = max(0.0, whole - sum(parts.values()))
    badput[Cause.IDLE] = float(estimate.idle_s or 0)
    return Ledger(parts["steps"], badput, estimate.chips)
