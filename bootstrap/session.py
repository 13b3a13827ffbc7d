"""One fab command's plan, the machine it drives, its display and its run record."""

from __future__ import annotations

import shlex
import threading
from dataclasses import dataclass, field

from rich.console import Console

from . import beside
from .jobs.plan import Plan
from .results.runs import RunRecord


class TokenCheck:
    """The Hub's token check (results/hub.py), begun in a thread beside the connection when a job is likely to
    start: its answer is ready, or nearly, when a job is about to start, and no round trip waits on the Hub."""

    def __init__(self, token: str, model: str | None, repo: str):
        self._done, self._lines, self._error = threading.Event(), [], None
        beside.start(lambda: self._check(token, model, repo), finish=True)

    def _check(self, token: str, model: str | None, repo: str) -> None:
        try:
            from .results import hub  # huggingface_hub takes a third of a second to import: only here

            self._lines = hub.preflight(token, model, repo)
        except BaseException as err:  # raised where the answer is wanted
            self._error = err
        finally:
            self._done.set()

    def result(self) -> list[str]:
        """What was checked, one line each; the check's own error if it failed."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._lines


@dataclass
class Session:
    """The plan, the VM (or the gke backend's cluster), display, record; `stack` is the Pulumi stack's
    outputs (None with -H)."""

    plan: Plan
    vm: object  # vm.machine.Vm, or gke.cluster.Cluster
    console: Console
    record: RunRecord
    secrets: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    stack: dict | None = None
    token_checked: bool = False  # the Hub check (results/hub.py) passed for this command
    token_check: TokenCheck | None = None  # that check, begun while connecting (tasks/common.py)
    command: tuple[str, ...] = ()  # the command line that watches this run again, when not a task's (fab demo)

    def check_token(self) -> None:
        """The Hub check of the token, once: only when a job is about to start (a no-op asks the Hub
        nothing), and always before one does."""
        if self.token_checked or "HF_TOKEN" not in self.secrets:
            return
        self.console.print("checking the Hugging Face token")
        if self.token_check is None:
            self.token_check = TokenCheck(
                self.secrets["HF_TOKEN"], self.plan.base_model, self.plan.spec.results.hub_repo
            )
        for line in self.token_check.result():
            self.console.print(f"  {line}")
        self.token_checked = True

    def hint(self, *task: str) -> str:
        """A fab command line that works as printed: the task, with this command's run and overrides."""
        if self.command:
            return shlex.join([*self.command, "--run-name", self.plan.run_name])
        words = ["fab", *task, "--run-name", self.plan.run_name]
        for override in self.overrides:
            words += ["--arg", override]
        return shlex.join(words)
