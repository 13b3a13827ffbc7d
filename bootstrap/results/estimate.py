"""What a run will take and cost, before anything is made or contacted: each stage, in all, in chip-hours and money.

Calibrated by this machine's records of the stack's earlier runs (results/runs.py): the last run whose train
is done and whose time split is known (results/timing.py), of the same shape (accelerator, chips, model, and
whether checkpoints go to a bucket). Its stages are taken as they took, a shared job done already (convert)
as nothing on that VM and as long as it took on a new one, and train scaled by what changed: the steps, the
completions a step (batch_size x rl.num_generations x new tokens) and the evals (how many, and their
problems x passes x new tokens). Without such a run, the few published or measured figures below, each with
its source, much wider; a stage no figure covers is said to be unknown and left out of the total, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from ..errors import Problem, UserError
from ..jobs.plan import Plan
from .runs import RunRecord, all_records

CALIBRATED_SPREAD = 0.25  # +-, on a run of this machine's records
# rl.yml's own values (MaxText 0.2.3 to 0.2.5) for what a job does not set
RL_DEFAULTS = {"batch_size": 1, "rl.num_generations": 2, "max_target_length": 1024,
               "max_prefill_predict_length": 256, "num_test_batches": 5, "eval_batch_size": 32,
               "num_eval_passes": 1, "eval_interval": 10}  # fmt: skip
MAY_BE_ZERO = ("num_test_batches", "eval_interval")  # no evals; no evals during training
GUIDE_STEPS, GUIDE_TRAIN_S, GUIDE_CONVERT_S = 50, 600, 300
UNCALIBRATED = {  # (low, high) seconds and where the figure comes from; other stages are unknown
    "convert": (GUIDE_CONVERT_S * 0.5, GUIDE_CONVERT_S * 2, "the public guide: about 5 minutes on a v6e-8"),
    "validate": (20, 120, "25 s on one TPU v5e chip (docs/benchmarks.md): imports and argument checks"),
}
# What a chip-hour costs, by provisioning model (vm.price_per_chip_hour sets your own).
PRICES = {
    "STANDARD": (
        2.70,
        "v6e on demand from $2.70 a chip-hour: Google's Trillium GA announcement, 2024-12-12; by region",
    ),
}
PRICE_UNKNOWN = {
    "RESERVATION_BOUND": "a reservation's price is yours: set vm.price_per_chip_hour (billed while reserved)",
    "SPOT": "Spot prices change; set vm.price_per_chip_hour",
    "FLEX_START": "set vm.price_per_chip_hour (Flex-start is billed as on-demand at a discount)",
}


@dataclass(frozen=True)
class Stage:
    """One job's estimate: seconds low and high (None: unknown), and why."""

    name: str
    low_s: float | None
    high_s: float | None
    source: str
    needs: tuple[str, ...] = ()  # what it waits for: jobs side by side take the longer one's time


@dataclass(frozen=True)
class Estimate:
    stages: tuple[Stage, ...]
    calibrated_on: str  # the run whose measurements it scales; "" when uncalibrated
    chips: int
    price: float | None  # per chip-hour
    price_source: str
    left_out: tuple[str, ...] = ()  # each damaged run record, in one line: not calibrated on

    def _span(self, end: str) -> float:
        """The pipeline's time: its longest chain of needs (setup beside prefetch, validate beside convert)."""
        done: dict[str, float] = {}
        for s in self.stages:  # in run order: what a stage needs comes before it
            took = getattr(s, end) or 0.0
            done[s.name] = max((done.get(n, 0.0) for n in s.needs), default=0.0) + took
        return max(done.values(), default=0.0)

    @property
    def low_s(self) -> float:
        return self._span("low_s")

    @property
    def high_s(self) -> float:
        return self._span("high_s")

    @property
    def unknown(self) -> list[str]:
        return [s.name for s in self.stages if s.low_s is None]

    def chip_hours(self) -> tuple[float, float]:
        return self.low_s / 3600 * self.chips, self.high_s / 3600 * self.chips

    def lines(self) -> list[str]:
        """For `fab plan`: a line a stage, then the total, chip-hours and cost."""
        how = f"calibrated on run {self.calibrated_on}, +-25%" if self.calibrated_on else "uncalibrated, wide"
        lines = [f"estimate ({how}):"]
        for s in self.stages:
            took = "unknown" if s.low_s is None else span(s.low_s, s.high_s)
            lines.append(f"  {s.name:<14} {took:<16} {s.source}")
        low_h, high_h = self.chip_hours()
        total = f"  in all         {span(self.low_s, self.high_s):<16} {self.chips} chips: {low_h:.2f}-{high_h:.2f} chip-hours"
        if self.unknown:
            total += f", not counting {', '.join(self.unknown)}"
        lines.append(total)
        cost = (
            f"  cost           ${low_h * self.price:,.2f}-${high_h * self.price:,.2f} at ${self.price:g} a chip-hour "
            f"({self.price_source})"
            if self.price is not None
            else f"  cost           {self.price_source}"
        )
        return [*lines, cost, *(f"  left out of the calibration: {line}" for line in self.left_out)]

    def to_dict(self) -> dict:
        low_h, high_h = self.chip_hours()
        return {
            "calibrated_on": self.calibrated_on or None,
            "stages": [asdict(s) for s in self.stages],
            "low_s": round(self.low_s),
            "high_s": round(self.high_s),
            "unknown": self.unknown,
            "chips": self.chips,
            "chip_hours": [round(low_h, 3), round(high_h, 3)],
            "price_per_chip_hour": self.price,
            "price_source": self.price_source,
            "cost": [round(low_h * self.price, 2), round(high_h * self.price, 2)] if self.price is not None else None,
            "left_out": list(self.left_out),
        }


def duration(seconds: float) -> str:
    """Seconds as a reader counts them: 45 s, 12.5 min, 3.2 h."""
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def span(low: float, high: float) -> str:
    """A range in the unit of its high end, the low end in its own where that would read 0 (20 s-2.0 min)."""
    unit, div = ("h", 3600) if high >= 2 * 3600 else ("min", 60) if high >= 120 else ("s", 1)
    if div == 1:
        return f"{low:.0f}-{high:.0f} s"
    if low / div < 1:
        return f"{duration(low)}-{high / div:.1f} {unit}"
    return f"{low / div:.1f}-{high / div:.1f} {unit}"


def work(argv: list[str]) -> dict[str, float]:
    """What a train step and an eval do, from train's arguments (rl.yml's values for the rest). A size that is
    not a positive number (a count of test batches or an eval interval may be 0) is refused: no run does negative
    work, and an estimate of it would be nonsense."""
    args = {**RL_DEFAULTS, **{k: v for k, _, v in (a.partition("=") for a in argv) if k in RL_DEFAULTS}}
    value = {}
    for key, raw in args.items():
        try:
            value[key] = float(raw)
        except (TypeError, ValueError):
            value[key] = math.nan
        least = 0 if key in MAY_BE_ZERO else 1
        if not (math.isfinite(value[key]) and value[key] >= least):
            raise UserError(
                Problem(
                    "train",
                    key,
                    f"{str(raw)[:40]!r} is not a number of at least {least} (jobs/train.yaml or --arg train.{key})",
                )
            )
    new_tokens = max(1.0, value["max_target_length"] - value["max_prefill_predict_length"])
    return {
        "step": value["batch_size"] * value["rl.num_generations"] * new_tokens,
        "eval": max(0.0, value["num_test_batches"]) * value["eval_batch_size"] * value["num_eval_passes"] * new_tokens,
        "eval_interval": value["eval_interval"],
        "num_test_batches": value["num_test_batches"],
    }


def evals_of(steps: int, units: dict[str, float]) -> int:
    """The evals a run makes after training starts: one every eval_interval steps (the last step too), and the
    one after training; none without test batches. (The one before training is part of start-up.)"""
    if units["num_test_batches"] <= 0:
        return 0
    interval = int(units["eval_interval"])
    return (steps // interval if interval > 0 else 0) + 1


def price_of(plan: Plan, provisioning: str | None) -> tuple[float | None, str]:
    if plan.spec.vm.price_per_chip_hour is not None:
        return plan.spec.vm.price_per_chip_hour, "vm.price_per_chip_hour"
    if provisioning in PRICES:
        return PRICES[provisioning]
    return None, PRICE_UNKNOWN.get(provisioning or "", "no price: pass --stack STACK or set vm.price_per_chip_hour")


def shape(plan: Plan) -> dict:
    """What a measured run must share with this one to calibrate it: the chips, the model, where checkpoints go."""
    train = next((job.rendered for job in plan.jobs if job.name == "train" and job.rendered), None)
    args = dict(a.partition("=")[::2] for a in (train.argv[3:] if train else []))
    return {
        "accelerator": plan.accelerator.name,
        "chips": plan.accelerator.chips,
        "model": args.get("model_name", ""),
        "bucket": args.get("base_output_directory", "").startswith("gs://"),
    }


def measured(split: dict, argv: list[str], plan: Plan) -> dict:
    """A run's record of its train's time split, with what the next estimate scales it by and must share."""
    return {**split, "work": work(argv), "shape": shape(plan)}


def _usable(timing: dict | None) -> bool:
    """A time split the scaling can read: one with its work (an older record has none). Its figures were checked
    when the record was read (runs._Record): a record with a bad one is left out before it gets here."""
    return bool(timing and timing.get("work"))


def calibration(plan: Plan, damaged: list[str] | None = None) -> RunRecord | None:
    """The last run of this machine's records whose train is done with a usable time split, of this shape; a
    damaged record is left out, its line added to `damaged`."""
    records = all_records([] if damaged is None else damaged)
    wanted = shape(plan)
    fits = [
        r for r in records
        if _usable(r.timing) and r.timing.get("shape") == wanted and r.jobs.get("train", {}).get("state") == "done"
    ]  # fmt: skip
    return fits[-1] if fits else None


def estimate(plan: Plan, provisioning: str | None = None) -> Estimate:
    for job in plan.jobs:
        if job.name == "train" and job.rendered is not None:
            work(job.rendered.argv[3:])  # a size that is no positive number is refused, calibrated or not
    damaged: list[str] = []
    record = calibration(plan, damaged)
    stages = [
        replace(_calibrated(plan, job, record) if record else _uncalibrated(plan, job), needs=tuple(job.needs))
        for job in plan.jobs
    ]
    if plan.spec.results.hub_repo or plan.spec.results.gcs:
        stages.append(replace(_copies(record), needs=("export",)))
    price, source = price_of(plan, provisioning)
    chips = max(1, plan.accelerator.chips)
    return Estimate(tuple(stages), record.name if record else "", chips, price, source, tuple(damaged))


def _duration(record: RunRecord, name: str) -> float | None:
    job = record.jobs.get(name) or {}
    return job["finished"] - job["started"] if job.get("started") and job.get("finished") else None


def _calibrated(plan: Plan, job, record: RunRecord) -> Stage:
    if job.shared and (record.jobs.get(job.name) or {}).get("job_dir") == job.job_dir:
        took = _duration(record, job.name)
        why = f"done already on run {record.name}'s VM (shared by runs); "
        why += f"{duration(took)} on a new VM" if took is not None else "unknown on a new VM"
        return Stage(job.name, 0.0, took * (1 + CALIBRATED_SPREAD) if took is not None else 0.0, why)
    if job.name == "train" and job.rendered is not None:
        return _train(job, record)
    took = _duration(record, job.name)
    if took is None:
        return _uncalibrated(plan, job)
    return Stage(job.name, took * (1 - CALIBRATED_SPREAD), took * (1 + CALIBRATED_SPREAD), f"as in run {record.name}")


def _train(job, record: RunRecord) -> Stage:
    """The earlier train's own duration (imports, loading, compiling: all it took), its steps and evals swapped for
    this run's, each scaled by the work it does."""
    was, now = record.timing, work(job.rendered.argv[3:])
    then = was["work"]
    steps = job.lr_schedule.train_steps if job.lr_schedule else was["steps"]
    step_s = was["step_s"] * now["step"] / then["step"]
    eval_s = was["eval_s"] * (now["eval"] / then["eval"] if then["eval"] else 1.0)
    took = _duration(record, "train")
    fixed = took - was["steps"] * was["step_s"] - was["evals"] * was["eval_s"] if took is not None else -1.0
    fixed = fixed if fixed >= 0 else was["startup_s"]  # a start time a re-attached runner rewrote: the log's own
    seconds = fixed + steps * step_s + evals_of(steps, now) * eval_s
    why = f"run {record.name}'s start-up {fixed:.0f} s, {steps} steps x {step_s:.2f} s, "
    why += f"{evals_of(steps, now)} evals x {eval_s:.0f} s"
    return Stage("train", seconds * (1 - CALIBRATED_SPREAD), seconds * (1 + CALIBRATED_SPREAD), why)


def _copies(record: RunRecord | None) -> Stage:
    """The durable copies (results.hub_repo, results.gcs): as long as the last run's took, else unknown."""
    took = [_duration(record, name) for name in (record.jobs if record else {}) if name.startswith("publish-")]
    if not took or None in took:
        return Stage("copies", None, None, "no measurement yet: a first run of this stack measures it")
    seconds = sum(took)
    return Stage(
        "copies", seconds * (1 - CALIBRATED_SPREAD), seconds * (1 + CALIBRATED_SPREAD), f"as in run {record.name}"
    )


def _uncalibrated(plan: Plan, job) -> Stage:
    if job.name in UNCALIBRATED:
        low, high, source = UNCALIBRATED[job.name]
        return Stage(job.name, low, high, source)
    if job.name == "train" and job.lr_schedule:
        steps = job.lr_schedule.train_steps
        seconds = GUIDE_TRAIN_S * steps / GUIDE_STEPS
        source = f"the public guide: about 10 minutes for {GUIDE_STEPS} steps, scaled to {steps} steps"
        return Stage("train", seconds * 0.5, seconds * 3, source)
    return Stage(job.name, None, None, "no measurement yet: a first run of this stack measures it")


def took(record: RunRecord) -> float | None:
    """How long the run took, its jobs' first start to their last end (seconds); jobs done already not counted."""
    ran = [j for j in record.jobs.values() if j.get("ran", True)]
    starts = [j["started"] for j in ran if j.get("started")]
    ends = [j["finished"] for j in ran if j.get("finished")]
    return max(ends) - min(starts) if starts and ends else None


def against(record: RunRecord) -> str:
    """`took 1.2 h, 9.6 chip-hours, $25.92 (estimated 1.0-1.4 h, $21.60-$30.24)`: the result line's and fab runs';
    "" before anything ran."""
    seconds = took(record)
    if seconds is None:
        return ""
    hours = seconds / 3600 * record.chips if record.chips else None
    price = (record.estimate or {}).get("price_per_chip_hour")
    line = f"took {duration(seconds)}"
    line += f", {hours:.2f} chip-hours" if hours is not None else ""
    line += f", ${hours * price:,.2f}" if hours is not None and price is not None else ""
    if record.estimate:
        line += f" (estimated {span(record.estimate['low_s'], record.estimate['high_s'])}"
        if record.estimate.get("cost"):
            low, high = record.estimate["cost"]
            line += f", ${low:,.2f}-${high:,.2f}"
        line += f"; not counting {', '.join(record.estimate['unknown'])})" if record.estimate.get("unknown") else ")"
    return line
