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

    def hint(self, *task: str) -> str:
        """A fab command line that works as printed: the task, with this command's run and overrides."""
        words = ["fab", *task, "--run-name", self.plan.run_name]
        for override in self.overrides:
            words += ["--arg", override]
        return shlex.join(words)
