"""What a run will take and cost, before anything is made or contacted: each stage, in all, in chip-hours and money.

Calibrated by this machine's records of the stack's earlier runs (results/runs.py): the last run whose train
is done and whose time split is known (results/timing.py), of the same shape (accelerator, chips, model, and
whether checkpoints go to a bucket). Its stages are taken as they took, a shared job done already (convert)
as nothing on that VM and as long as it took on a new one, and train scaled by what changed: the steps, the
completions a step (batch_size x rl.num_generations x new tokens) and the evals (how many, and their
problems x passes x new tokens). Without such a run, every stage has a bound from public figures and the chips'
own limits (results/rates.py), each with its source, much wider; train's follows the work asked for. The cost is
the chip-hours at the stack's list price (results/prices.py), and the idle time autostop waits after the run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from ..errors import Problem, UserError
from ..jobs import accelerator as chips_of
from ..jobs import schema, task_check
from ..jobs.load import RenderedJob
from ..jobs.plan import Plan
from ..remote import eval_sample, gcs
from . import goodput, prices, rates
from .runs import RunRecord, all_records

CALIBRATED_SPREAD = 0.25  # +-, on a run of this machine's records
# rl.yml's own values (MaxText 0.2.3 to 0.2.5) for what a job does not set
RL_DEFAULTS = {"batch_size": 1, "rl.num_generations": 2, "max_target_length": 1024,
               "max_prefill_predict_length": 256, "num_test_batches": 5, "eval_batch_size": 32,
               "num_eval_passes": 1, "eval_interval": 10, "checkpoint_period": rates.CHECKPOINT_PERIOD}  # fmt: skip
MAY_BE_ZERO = ("num_test_batches", "eval_interval")  # no evals; no evals during training
GUIDE_STEPS, GUIDE_TRAIN_S = 50, 600
VALIDATE = (15, 120, "16 s on one TPU v5e chip (docs/benchmarks.md): imports and argument checks")


@dataclass(frozen=True)
class Stage:
    """One job's estimate: seconds low and high (None: unknown), and why."""

    name: str
    low_s: float | None
    high_s: float | None
    source: str
    needs: tuple[str, ...] = ()  # what it waits for: jobs side by side take the longer one's time
    startup: tuple[float, float] | None = None  # train's: what each of its starts pays again (low, high seconds)
    parts: dict[str, tuple[float, float]] | None = None  # train's: steps, evals, saves, start-up (goodput.expected)


@dataclass(frozen=True)
class Estimate:
    stages: tuple[Stage, ...]
    calibrated_on: str  # the run whose measurements it scales; "" when uncalibrated
    chips: int
    price: float | None  # per chip-hour
    price_source: str
    left_out: tuple[str, ...] = ()  # each damaged run record, in one line: not calibrated on
    price_note: str = ""  # what else the price means (prepaid, Spot, a commitment's price)
    idle_s: int | None = None  # how long the VM idles after the run before autostop; None: it does not stop
    idle_why: str = ""
    on_demand: float | None = None  # a Spot run's chip-hour on demand: what the same run would cost there
    preemption: tuple[float, float] = (0.0, 0.0)  # what one preemption costs at most, in seconds (`_preemption`)
    preemption_why: str = ""

    def preemption_s(self) -> tuple[float, float]:
        return self.preemption

    def spot_lines(self) -> list[str]:
        """For a Spot run: the same run on demand, and what each preemption costs."""
        if self.on_demand is None or self.price is None:
            return []
        low_h, high_h = (hours + (self.idle_s or 0) / 3600 * self.chips for hours in self.chip_hours())
        lost_low, lost_high = (seconds / 3600 * self.chips for seconds in self.preemption_s())
        return [
            f"  on demand      ${low_h * self.on_demand:,.2f}-${high_h * self.on_demand:,.2f} the same, at "
            f"{dollars(self.on_demand)} a chip-hour",
            f"  a preemption   up to {span(*self.preemption_s())} more: {lost_low:.2f}-{lost_high:.2f} chip-hours, "
            f"${lost_low * self.price:,.2f}-${lost_high * self.price:,.2f} each ({self.preemption_why}; fab train "
            "--watch recovers by itself)",
        ]

    def _begins(self, end: str) -> dict[str, tuple[float, float]]:
        """Each stage's begin and end along the longest chain of its needs (setup beside prefetch, validate beside
        convert), at the `end` of each stage's range."""
        times: dict[str, tuple[float, float]] = {}
        for s in self.stages:  # in run order: what a stage needs comes before it
            begins = max((times[n][1] for n in s.needs if n in times), default=0.0)
            times[s.name] = (begins, begins + (getattr(s, end) or 0.0))
        return times

    def _span(self, end: str) -> float:
        """The pipeline's time: its longest chain of needs."""
        return max((ends for _, ends in self._begins(end).values()), default=0.0)

    def span_before(self, name: str, end: str) -> float:
        """When stage `name` can begin: the longest chain of what it needs."""
        return self._begins(end).get(name, (0.0, 0.0))[0]

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
        lines.append(f"  after the run  {self.tail()}")
        if said := self.goodput_line():
            lines.append(said)
        if self.price is None:
            lines.append(f"  cost           {self.price_source}")
        else:
            idle = self.idle_cost() or 0.0
            lines.append(
                f"  cost           ${low_h * self.price + idle:,.2f}-${high_h * self.price + idle:,.2f} at "
                f"{dollars(self.price)} a chip-hour ({self.price_source})"
                + (", the idle time included" if idle else "")
            )
            if self.price_note:
                lines.append(f"                 {self.price_note}")
        lines += self.spot_lines()
        return [*lines, *(f"  left out of the calibration: {line}" for line in self.left_out)]

    def goodput_line(self) -> str | None:
        """What share of the paid time the run's kept steps will have (results/goodput.py), and the largest rest."""
        ledger = goodput.expected(self)
        if ledger is None or ledger.share is None:
            return None
        line = f"  goodput        about {ledger.share:.0%}: steps {duration(ledger.productive_s)} of "
        line += f"{duration(ledger.paid_s)} paid"
        if largest := ledger.largest():
            cause, seconds = largest
            line += f"; the largest badput: {cause.label} {duration(seconds)} ({seconds / ledger.paid_s:.0%})"
        return line

    def idle_cost(self) -> float | None:
        """What the idle time before autostop costs (None: no price, or no autostop)."""
        if self.price is None or not self.idle_s:
            return None
        return self.idle_s / 3600 * self.chips * self.price

    def tail(self) -> str:
        """What the VM costs once the run has ended: autostop's idle time, or an open end."""
        hourly = f"${self.chips * self.price:,.2f} an hour" if self.price is not None else "its price by the hour"
        if not self.idle_s:
            return f"no autostop ({self.idle_why}): the VM costs {hourly} until you stop it (pulumi destroy)"
        idle = self.idle_cost()
        cost = f", ${idle:,.2f}" if idle is not None else ""
        hours = self.idle_s / 3600 * self.chips
        return f"{duration(self.idle_s)} idle, then autostop ({self.idle_why}): {hours:.2f} chip-hours{cost}"

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
            "price_note": self.price_note,
            "idle_s": self.idle_s,
            "idle_cost": None if (idle := self.idle_cost()) is None else round(idle, 2),
            "left_out": list(self.left_out),
            "on_demand_cost": [round(low_h * self.on_demand, 2), round(high_h * self.on_demand, 2)]
            if self.on_demand is not None
            else None,
            "preemption_s": [round(seconds) for seconds in self.preemption_s()],
            "goodput": ledger.to_dict() if (ledger := goodput.expected(self)) else None,
        }


def dollars(amount: float) -> str:
    """$2.70, $0.544: cents, or a tenth of one where a list price has it."""
    return f"${amount:,.2f}" if round(amount, 2) == amount else f"${amount:,.3f}"


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


def work(argv: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """What a train step and an eval do, from train's arguments (rl.yml's values for the rest) and its environment
    (the intermediate evals' sample, remote/eval_sample.py). A size that is not a positive number (a count of test
    batches or an eval interval may be 0) is refused: no run does negative work, and an estimate of it would be
    nonsense."""
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
    sample = (env or {}).get(eval_sample.SAMPLE_ENV, "").strip()
    if sample and not sample.isdigit():
        key = f"env.{eval_sample.SAMPLE_ENV}"
        raise UserError(
            Problem(
                "train",
                key,
                f"{sample[:40]!r} is not a whole number of batches, 0 for all (jobs/train.yaml or --arg train.{key})",
            )
        )
    new_tokens = max(1.0, value["max_target_length"] - value["max_prefill_predict_length"])
    batches = max(0.0, value["num_test_batches"])
    sampled = min(batches, float(sample)) if sample and int(sample) > 0 else batches
    per_batch = value["eval_batch_size"] * value["num_eval_passes"] * new_tokens
    return {
        "step": value["batch_size"] * value["rl.num_generations"] * new_tokens,
        "eval": batches * per_batch,
        "sample_eval": sampled * per_batch,  # an eval during training: the sample's batches
        "eval_items": batches * value["eval_batch_size"],  # a whole eval's problems, as its line counts them
        "sample_items": sampled * value["eval_batch_size"],
        "eval_interval": value["eval_interval"],
        "num_test_batches": value["num_test_batches"],
        **{
            key: value[key]
            for key in (
                "batch_size",
                "rl.num_generations",
                "max_target_length",
                "eval_batch_size",
                "num_eval_passes",
                "checkpoint_period",
            )
        },  # fmt: skip
        "new_tokens": new_tokens,
    }


def evals_of(steps: int, units: dict[str, float]) -> tuple[int, int]:
    """The evals a run makes after training starts: (during it, one every eval_interval steps, the last step too,
    on the sample; after it, whole); none without test batches. (The whole one before training is part of
    start-up.)"""
    if units["num_test_batches"] <= 0:
        return 0, 0
    interval = int(units["eval_interval"])
    return (steps // interval if interval > 0 else 0), 1


def saves_of(steps: int, units: dict[str, float]) -> int:
    """The checkpoint saves of a run of `steps`: every checkpoint_period steps (the last step's at least)."""
    return max(1, steps // max(1, int(units["checkpoint_period"])))


def chip_name(plan: Plan) -> str | None:
    """v6e, v5e: the chips' generation as price lists name it (None: a CPU, or a chip no figure covers)."""
    found = rates.CHIPS.get(plan.accelerator.device_kind) if plan.accelerator else None
    return found.name if found else None


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


def measured(split: dict, train: RenderedJob, plan: Plan) -> dict:
    """A run's record of its train's time split, with what the next estimate scales it by and must share."""
    return {**split, "work": work(train.argv[3:], train.env), "shape": shape(plan)}


def _usable(timing: dict | None) -> bool:
    """A time split the scaling can read: one with its work (an older record has none). Its figures were checked
    when the record was read (runs._Record): a record with a bad one is left out before it gets here."""
    return bool(timing and timing.get("work"))


def calibration(plan: Plan, records: list[RunRecord]) -> RunRecord | None:
    """The last run of this machine's `records` whose train is done with a usable time split, of this shape."""
    wanted = shape(plan)
    fits = [
        r for r in records
        if _usable(r.timing) and r.timing.get("shape") == wanted and r.jobs.get("train", {}).get("state") == "done"
    ]  # fmt: skip
    return fits[-1] if fits else None


def estimate(
    plan: Plan,
    provisioning: str | None = None,
    zone: str | None = None,
    idle: tuple[int | None, str] = (None, "off"),
    only: set[str] | None = None,
) -> Estimate:
    """The run's estimate: `provisioning` and `zone` the stack's (None: no stack read), `idle` how long autostop
    waits after the run and why (before.autostop_of); `only` the jobs that will run (all, and the copies)."""
    for job in plan.jobs:
        if job.name == "train" and job.rendered is not None:
            work(job.rendered.argv[3:], job.rendered.env)  # a size that is no positive number is refused
    damaged: list[str] = []
    records = all_records(damaged)  # a damaged one is left out, its line in `damaged`
    record = calibration(plan, records)
    shared = _shared_runs(record, records) if record else {}
    stages = [
        replace(_calibrated(plan, job, record, shared) if record else _uncalibrated(plan, job), needs=tuple(job.needs))
        for job in plan.jobs
        if only is None or job.name in only
    ]
    if only is None and (plan.spec.results.hub_repo or plan.spec.results.gcs):
        stages.append(replace(_copies(plan, record), needs=("export",)))
    price = prices.price(chip_name(plan), provisioning, zone, plan.spec.vm.price_per_chip_hour)
    on_demand = prices.price(chip_name(plan), "STANDARD", zone, None).per_chip_hour if provisioning == "SPOT" else None
    preemption, why = _preemption(plan, stages)
    chips = max(1, plan.accelerator.chips)
    name = record.name if record else ""
    return Estimate(
        tuple(stages),
        name,
        chips,
        price.per_chip_hour,
        price.source,
        tuple(damaged),
        price.note,
        idle[0],
        idle[1],
        on_demand,
        preemption,
        why,
    )


def _preemption(plan: Plan, stages: list[Stage]) -> tuple[tuple[float, float], str]:
    """What one preemption costs at most, and why. With the model and checkpoints in a bucket: a new VM's
    environment and checks (as on a VM that never had them), train's whole start-up again (loading, compiling, the
    eval before training) and its steps since its last checkpoint (its checkpoint_period); without: every job before
    train again, and train from step 0."""
    kept = gcs.is_gcs(plan.durable_dir)
    train = next((s for s in stages if s.name == "train"), None)
    low = high = 0.0
    for job in plan.jobs:
        if job.name == "train" and job.rendered is not None and job.rendered.progress and train is not None:
            if train.low_s is None:
                continue
            steps = max(1, job.rendered.progress["total_steps"])
            share = (
                min(1.0, work(job.rendered.argv[3:], job.rendered.env)["checkpoint_period"] / steps) if kept else 1.0
            )
            fixed = train.startup or (0.0, 0.0)  # a whole start again, then the steps since the last checkpoint
            low += fixed[0] + (train.low_s - fixed[0]) * share
            high += fixed[1] + (train.high_s - fixed[1]) * share
        elif job.name in ("setup", "validate") or not kept and job.name in ("prefetch", "convert"):
            stage = _uncalibrated(plan, job)
            if stage.low_s is not None:
                low, high = low + stage.low_s, high + stage.high_s
    why = (
        "a new VM's setup and checks, train's start-up again and its steps since the last checkpoint"
        if kept
        else ("no bucket (results.gcs): every job again, train from step 0")
    )
    return (low, high), why


def _duration(record: RunRecord, name: str) -> float | None:
    job = record.jobs.get(name) or {}
    return job["finished"] - job["started"] if job.get("started") and job.get("finished") else None


def _shared_runs(record: RunRecord, records: list[RunRecord]) -> dict[str, RunRecord]:
    """The record of the last run that ran each shared job on the calibration run's VM, by job folder: a job done
    already when that run came (setup built by `fab setup`) is in an earlier run's record."""
    found: dict[str, RunRecord] = {}
    for earlier in records:
        if earlier.machine == record.machine or earlier.name == record.name:
            for job in earlier.jobs.values():
                if job.get("state") == "done" and job.get("ran", True) and job.get("job_dir"):
                    found[job["job_dir"]] = earlier
    return found


def _calibrated(plan: Plan, job, record: RunRecord, shared: dict[str, RunRecord]) -> Stage:
    if job.shared and ((record.jobs.get(job.name) or {}).get("job_dir") == job.job_dir or job.job_dir in shared):
        record = shared.get(job.job_dir, record)
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
    this run's, each scaled by the work it does: its steps at their steady rate, its warm-up once."""
    was, now = record.timing, work(job.rendered.argv[3:], job.rendered.env)
    then = was["work"]
    steps = job.lr_schedule.train_steps if job.lr_schedule else was["steps"]
    step_s = was["step_s"] * now["step"] / then["step"]
    rate = eval_rate(was)  # seconds a unit of eval work
    whole_s, sample_s = rate * now["eval"], rate * now["sample_eval"]
    took = _duration(record, "train")
    fixed = took - was["steps"] * was["step_s"] - was["evals"] * was["eval_s"] if took is not None else -1.0
    if fixed < 0:  # a start time a re-attached runner rewrote: the log's own
        fixed = was["startup_s"] + was.get("warmup_s", 0.0)
    # its start-up held the eval before training at its size (a probe's was one batch): this run's instead
    fixed = max(0.0, fixed - rate * then["eval"]) + whole_s
    during, after = evals_of(steps, now)
    saves = was.get("saves_s", 0.0) / saves_of(was["steps"], then) * saves_of(steps, now)
    evals_s = during * sample_s + after * whole_s
    seconds = fixed + steps * step_s + evals_s
    why = f"run {record.name}'s start-up {fixed:.0f} s, {steps} steps x {step_s:.2f} s, "
    why += f"{during + after} evals ({during} on a sample) x {sample_s:.0f}-{whole_s:.0f} s"
    low, high = 1 - CALIBRATED_SPREAD, 1 + CALIBRATED_SPREAD
    startup = (fixed * low, fixed * high)
    parts = {"steps": max(0.0, steps * step_s - saves), "saves": saves, "evals": evals_s + whole_s,
             "startup": fixed - whole_s}  # fmt: skip
    return Stage("train", seconds * low, seconds * high, why, startup=startup,
                 parts={name: (value * low, value * high) for name, value in parts.items()})  # fmt: skip


def eval_rate(split: dict) -> float:
    """Seconds a unit of eval work (estimate.work's) took in a measured run: its timed evals' mean over their work
    (their problems counted in their lines, where the record has them: a sample is smaller than a whole eval)."""
    then = split["work"]
    if not then["eval"] or not split["eval_s"]:
        return 0.0
    timed = then["eval"] * split["eval_items"] / then["eval_items"] if split.get("eval_items") and then.get(
        "eval_items") else then["eval"]  # fmt: skip
    return split["eval_s"] / timed


def _copies(plan: Plan, record: RunRecord | None) -> Stage:
    """The durable copies (results.hub_repo, results.gcs): as long as the last run's took, else their bounds."""
    took = [_duration(record, name) for name in (record.jobs if record else {}) if name.startswith("publish-")]
    if not took or None in took:
        asked = [name for name, kept in (("publish-hub", plan.spec.results.hub_repo), ("publish-gcs",
                 plan.spec.results.gcs)) if kept]  # fmt: skip
        bounds = [rates.stage(name, _parameters(plan)) for name in asked]
        return Stage("copies", sum(b[0] for b in bounds), sum(b[1] for b in bounds), "; ".join(b[2] for b in bounds))
    seconds = sum(took)
    return Stage(
        "copies", seconds * (1 - CALIBRATED_SPREAD), seconds * (1 + CALIBRATED_SPREAD), f"as in run {record.name}"
    )


def _uncalibrated(plan: Plan, job) -> Stage:
    if job.name == "validate":
        return Stage(job.name, *VALIDATE)
    if job.name in ("setup", "prefetch", "convert", "export"):
        return Stage(job.name, *rates.stage(job.name, _parameters(plan)))
    if job.name == "train" and job.lr_schedule:
        steps = job.lr_schedule.train_steps
        if found := _from_work(plan, job, steps):
            low, high, source, startup, parts = found
            return Stage("train", low, high, source, startup=startup, parts=parts)
        seconds = GUIDE_TRAIN_S * steps / GUIDE_STEPS
        source = f"the public guide: about 10 minutes for {GUIDE_STEPS} steps, scaled to {steps} steps"
        startup = (min(rates.START_UP_S[0], seconds * 0.5), min(rates.START_UP_S[1], seconds * 3))
        return Stage("train", seconds * 0.5, seconds * 3, source, startup=startup)
    return Stage(job.name, None, None, "no measurement yet: a first run of this stack measures it")


def _from_work(plan: Plan, job, steps: int) -> tuple[float, float, str, tuple[float, float], dict] | None:
    """Train from the work its arguments ask for, at published rates (results/rates.py); None where a figure is
    missing (a CPU, a chip or a model they do not cover)."""
    sizes = work(job.rendered.argv[3:], job.rendered.env)
    reward_s = sum(task_check.remembered(plan.task).values())  # each reward on one completion, as checked here
    during, after = evals_of(steps, sizes)
    asked = rates.TrainWork(
        steps=steps,
        completions=sizes["batch_size"] * sizes["rl.num_generations"],
        new_tokens=sizes["new_tokens"],
        sequence=sizes["max_target_length"],
        eval_batches=max(0.0, sizes["num_test_batches"]),
        eval_completions=sizes["eval_batch_size"] * sizes["num_eval_passes"],
        evals=after + (1 if sizes["num_test_batches"] > 0 else 0),  # and the one before training
        saves=saves_of(steps, sizes),
        reward_s=reward_s,
        sample_evals=during,
        sample_batches=sizes["sample_eval"] / sizes["eval"] * sizes["num_test_batches"] if sizes["eval"] else 0.0,
    )
    return rates.train(asked, plan.accelerator.device_kind, plan.accelerator.chips, _parameters(plan))


def _parameters(plan: Plan) -> int | None:
    """The model's parameters, from train's arguments and MaxText's model config (None: not known)."""
    train = next((job.rendered for job in plan.jobs if job.name == "train" and job.rendered), None)
    if train is None or not plan.maxtext_version:
        return None
    args = dict(a.partition("=")[::2] for a in train.argv[3:])
    return chips_of.parameters_of(schema.load(plan.maxtext_version), args)


def probe_overrides(steps: int) -> list[str]:
    """What turns a run into its probe (`fab train --probe N`): N steps, one eval batch before and after them."""
    if steps < 4:
        raise UserError(f"--probe {steps}: at least 4 steps (the steady step is measured between the later ones: the "
                        "first warm up, and the last one's line comes with the one before it)")  # fmt: skip
    return [f"vars.num_batches={steps}", "train.num_test_batches=1", f"train.checkpoint_period={steps}"]


def fell(seconds: float, low: float, high: float) -> str:
    """Where a run's time fell against its estimate: inside the range, or how far beyond its nearer end (a run of
    7.6 min against 6.3-38.8 min is inside it, not 66% below the middle)."""
    if low <= seconds <= high:
        return "inside it"
    return f"{seconds / high - 1:.0%} above it" if seconds > high else f"{1 - seconds / low:.0%} below it"


def took(record: RunRecord) -> float | None:
    """How long the run's VMs were billed (seconds): a VM it lost included, jobs done already by another run not."""
    return record.billed_s()


def against(record: RunRecord, ledger: goodput.Ledger | None = None) -> str:
    """`took 1.2 h, paid 1.4 h with boot and idle: 11.20 chip-hours, $30.24, goodput 41% (estimated 1.0-1.4 h and
    10 min idle, $21.60-$30.24, goodput about 38%)`: the result line's and fab runs'; "" before anything ran. The
    chip-hours and cost are the paid time's (`ledger`, results/goodput.py), as the estimate's cost counts them."""
    seconds = took(record)
    if seconds is None:
        return ""
    paid = ledger.paid_s if ledger else seconds
    hours = paid / 3600 * record.chips if record.chips else None
    price = (record.estimate or {}).get("price_per_chip_hour")
    line = f"took {duration(seconds)}" + (f" on {len(record.lost_vms) + 1} VMs" if record.lost_vms else "")
    figures = [f"{hours:.2f} chip-hours"] if hours is not None else []
    figures += [f"${hours * price:,.2f}"] if hours is not None and price is not None else []
    figures += [f"goodput {ledger.share:.0%}"] if ledger and ledger.share is not None else []
    extra = [c.label for c in (goodput.Cause.BOOT, goodput.Cause.IDLE) if ledger and ledger.badput.get(c)]
    line += f", paid {duration(paid)} with {' and '.join(extra)}: " if extra else ", " if figures else ""
    line += ", ".join(figures)
    if expected := record.estimate:
        line += f" (estimated {span(expected['low_s'], expected['high_s'])}"
        line += f" and {duration(expected['idle_s'])} idle" if expected.get("idle_s") else ""
        if expected.get("cost"):
            low, high = expected["cost"]
            idle = expected.get("idle_cost") or 0.0
            line += f", ${low + idle:,.2f}-${high + idle:,.2f}"
        if (expected.get("goodput") or {}).get("share") is not None:
            line += f", goodput about {expected['goodput']['share']:.0%}"
        line += f"; not counting {', '.join(expected['unknown'])})" if expected.get("unknown") else ")"
    return line
