"""Errors a user can act on: where (file and line, or the option), which key, what is wrong."""

from __future__ import annotations

import re
from dataclasses import dataclass

LONG_WORD = re.compile(r"\S{101,}")  # a value quoted back longer than anyone reads in one error line


def shortened(text: str) -> str:
    """`text` with each word over 100 characters cut to its first 40 and how long it was."""
    return LONG_WORD.sub(lambda m: f"{m[0][:40]}...({len(m[0]):,} characters)", text)


@dataclass(frozen=True)
class Problem:
    source: str  # a file path, or the command-line option that carried the value
    key: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.key}: {shortened(self.message)}"  # where it is stays whole: a path is never cut


class UserError(Exception):
    """One or more problems found before anything was contacted or started."""

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, (Problem, str)):
            problems = [problems]
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class VmUnavailable(UserError):
    """The VM cannot serve the run now: the connection broke, the VM is gone or stopped (preempted, deleted,
    autostopped), or it could not be made again yet (Spot capacity short). `fab train --watch` recovers from
    these and says the `reason` alone; every other command says it with the `advice` (the command that carries
    on, which the watch is already doing)."""

    def __init__(self, reason: str, advice: str = ""):
        super().__init__(reason + advice)  # `advice` as it reads after the reason, its punctuation included
        self.reason = reason


class StoppedWatching(Exception):
    """Ctrl-C while fab watched a pipeline: only the watching stopped (fab exits 130, saying how to watch again)."""
