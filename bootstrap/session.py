"""One fab command's plan, the machine it drives, its display and its run record."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from rich.console import Console

from .jobs.plan import Plan
from .results.runs import RunRecord


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

    def check_token(self) -> None:
        """The Hub check of the token, once: only when a job is about to start (a no-op asks the Hub
        nothing), and always before one does."""
        if self.token_checked or "HF_TOKEN" not in self.secrets:
            return
        from .results import hub  # huggingface_hub takes a third of a second to import: only here

        self.console.print("checking the Hugging Face token")
        for line in hub.preflight(self.secrets["HF_TOKEN"], self.plan.base_model, self.plan.spec.results.hub_repo):
            self.console.print(f"  {line}")
        self.token_checked = True

    def hint(self, *task: str) -> str:
        """A fab command line that works as printed: the task, with this command's run and overrides."""
        words = ["fab", *task, "--run-name", self.plan.run_name]
        for override in self.overrides:
            words += ["--arg", override]
        return shlex.join(words)
