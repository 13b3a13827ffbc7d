"""Show a pipeline from what its driver reports: events and job log lines in, bars and a record out.

The VM's driver streams them (driver.py follow); the gke backend's driver in the cluster
logs the same events (gke/driving.py reads them, and the jobs' logs, from the pods). Either
way one Watcher turns them into progress bars, one line
per decision, the run record, and at the end the eval table and a summary with the
chip-hours each job used, or the failed job's log and a hint that works as printed.
"""

from __future__ import annotations

from rich.table import Table

from ..errors import UserError
from ..jobs.plan import PlannedJob
from ..remote import evals, jobrunner
from ..remote.graph import Action, PipelineState
from ..results import estimate, goodput, timing
from ..results.runs import all_records, minutes
from ..session import Session
from .here import Here
from .machine import JobStatus
from .progress import Board, JobProgress, eval_table, result_lines

LOG_TAIL_LINES = 30


class Watcher:
    """Feed it the driver's items; `finish` reports the outcome (or raises it, on failure)."""

    def __init__(self, session: Session, jobs: list[PlannedJob], board: Board, progressed=None):
        self.session, self.board = session, board
        self.progressed = progressed or (lambda: None)  # told at each step the trainer logs
        self.jobs = {job.name: job for job in jobs}
        self.progress: dict[str, JobProgress] = {}
        self.ended: dict[str, JobStatus] = {}
        self.preflight: list[str] = []
        self.problems: list[str] = []
        self.outcome: PipelineState | None = None
        self.seen: set[tuple] = set()
        self.timing: dict[tuple, timing.TrainTiming] = {}  # train's time split, one an attempt (its log)
        self.skipped: set[str] = set()  # done already (an earlier run's, or shared): not this run's time

    def say(self, text: str) -> None:
        self.session.console.print(text, markup=False, highlight=False)

    def _bar(self, name: str) -> JobProgress:
        if name not in self.progress:
            rendered = self.jobs[name].rendered if name in self.jobs else None
            total = rendered.progress["total_steps"] if rendered and rendered.progress else None
            self.progress[name] = self.board.job(name, int(total) if total is not None else None)
        return self.progress[name]

    def feed(self, item: dict) -> None:
        key = _identity(item)
        if key is not None and key in self.seen:  # sent again to a watcher that followed a restarted driver
            return
        self.seen.add(key)
        if "line" in item:
            self._bar(item["job"]).feed(item["line"])
            if (
                self.jobs.get(item["job"])
                and self.jobs[item["job"]].rendered
                and self.jobs[item["job"]].rendered.progress
            ):
                self.timing.setdefault((item["job"], item.get("log")), timing.TrainTiming()).feed(item["line"])
                if timing.STEP.search(item["line"]):
                    self.progressed()
            return
        event, job = item["event"], item.get("job")
        if event == "decide":
            self.say(item["message"])
            if item["action"] != Action.SKIP.value:
                self._bar(job)
            else:
                self.skipped.add(job)
        elif event == "relaunch":
            self.say(
                f"{job}: its runner stopped; a new one adopts the job, or runs it again if it had ended unrecorded"
            )
        elif event == "preflight":
            failed = [
                f"{self.session.vm.name}: preflight {c['check']}: {c['message']}" for c in item["checks"] if not c["ok"]
            ]
            self.preflight += failed
            for check in item["checks"]:
                if check["ok"] and "removed" in check["message"]:
                    self.say(f"{self.session.vm.name}: {check['message']}")
            if not failed:
                self.say(f"preflight ok on {self.session.vm.name}")
        elif event == "blocked":
            self.say(f"{job}: not started, it needs {item['needs']}, which failed")
        elif event == "needed":
            needer = next((j.name for j in self.jobs.values() if job in j.needs), job)
            self.problems.append(f"{needer} needs {job}, which is {item['state']['state']}: run fab train first")
        elif event == "note":
            self.say(f"{job}: {item['message']}")
        elif event == "end":
            self._end(job, JobStatus.from_json(item["state"]))
        elif event == "finished":
            self.outcome = PipelineState(item["state"])

    def tick(self) -> None:
        """Nothing came for a while: a heartbeat for each job shown that has not ended."""
        for name, progress in self.progress.items():
            if name not in self.ended:
                progress.tick()

    def _end(self, name: str, status: JobStatus) -> None:
        record = self.session.record
        self.ended[name] = status
        record.note_job(name, status, self.jobs[name].job_dir if name in self.jobs else "", name not in self.skipped)
        attempts = [t for (job, _), t in self.timing.items() if job == name]
        if status.state is jobrunner.JobState.DONE and attempts and (split := attempts[-1].split()) is not None:
            record.timing = estimate.measured(split, self.jobs[name].rendered, self.session.plan)
        progress = self.progress.get(name)
        if progress is not None and progress.evals:  # its log is read from its start: this attempt's whole list
            record.evals = evals.final(evals.merged(record.evals, progress.evals), progress.total_steps)
        record.save()
        if status.state is jobrunner.JobState.DONE:
            self.say(f"{name}: done in {minutes(record.jobs[name]) or 0:.1f} min")

    def finish(self) -> None:
        """The eval table and the summary, or the first failure with its log and the fix."""
        session, record = self.session, self.session.record
        record.save()
        if self.preflight or self.problems:
            raise UserError(self.preflight + self.problems)
        failed = [(name, s) for name, s in self.ended.items() if s.state is not jobrunner.JobState.DONE]
        if failed and failed[0][1].state is jobrunner.JobState.STOPPED:
            name, status = failed[0]
            why = self.session.vm.tail(self.jobs[name].job_dir, 1)  # the launcher's last line: the rule and step
            raise UserError(
                f"{name} stopped on {session.vm.name} by a health rule: {(why or ['see its log'])[-1].strip()}. "
                "Fix the cause, then fab train --new-run; or fab train --go-on carries this run on despite it"
            )
        if failed:
            name, status = failed[0]
            self._show_log(name, status)
            # a probe's or fab demo's own command line carries its run on; fab demo's logs are files of this machine
            here = isinstance(getattr(session.vm, "conn", None), Here)
            full_log = status.log if here else session.hint("logs", "--job", name)
            again = session.hint() if session.command else "fab train"
            raise UserError(
                f"{name} {status.state.value} on {session.vm.name}: {status.error or 'see the log'}. "
                f"Full log: {full_log}. Fix the cause, then run {again} again to retry it"
            )
        if record.evals:
            session.console.print(eval_table(record.evals))
        for line in result_lines(record.evals):
            session.console.print(line, markup=False, highlight=False)
        if line := estimate.against(record, goodput.measured(record, goodput.boot_of(record, all_records([])))):
            session.console.print(line, markup=False, highlight=False)
        if self.ended:
            session.console.print(self.summary())

    def _show_log(self, name: str, status: JobStatus) -> None:
        vm, job_dir = self.session.vm, self.jobs[name].job_dir
        self.say(f"--- last {LOG_TAIL_LINES} lines of {vm.name}:{status.log} ---")
        for line in vm.tail(job_dir, LOG_TAIL_LINES):
            self.say(line)
        if status.state is jobrunner.JobState.INTERRUPTED:  # the runner itself died: its own stderr says why
            for line in vm.tail(job_dir, LOG_TAIL_LINES, jobrunner.RUNNER_ERR):
                self.say(f"runner | {line}")

    def summary(self) -> Table:
        """What each job that ran took, in minutes and in chip-hours (the VM's chips are billed while it runs)."""
        chips = self.session.plan.accelerator.chips
        table = Table(title=f"run {self.session.plan.run_name}: jobs run by this pipeline")
        for column in ("job", "state", "minutes", "chip-hours"):
            table.add_column(column, justify="left" if column in ("job", "state") else "right")
        for name, status in self.ended.items():
            took = minutes({"started": status.started, "finished": status.finished}) or 0.0
            table.add_row(name, status.state.value, f"{took:.1f}", f"{took / 60 * chips:.2f}")
        starts = [s.started for s in self.ended.values() if s.started]
        ends = [s.finished for s in self.ended.values() if s.finished]
        if starts and ends:  # jobs side by side share the VM: its billed time is the span, not the sum
            span = (max(ends) - min(starts)) / 60
            table.add_row("pipeline (first start to last end)", "", f"{span:.1f}", f"{span / 60 * chips:.2f}")
        return table


def _identity(item: dict) -> tuple | None:
    """What makes an item of the VM's stream unique: a line's log and number, an event's time (None: none)."""
    if "n" in item:
        return ("line", item["job"], item.get("log"), item["n"])
    return ("event", item["t"], item["event"], item.get("job")) if "t" in item else None
