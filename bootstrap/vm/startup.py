"""The startup script's protocol, as fab reads it: its marker, its failure record, and what to say.

bootstrap/startup.sh writes the marker (when it finished) once every step worked, and a failure record
beside it (`startup.failed`: the step, its exit code, when) when one did not; a run removes the record
as it begins. Neither there: the script is still running (or has not begun).
"""

from __future__ import annotations

import enum
import json
import posixpath
from dataclasses import dataclass

from ..errors import UserError

FAILED_NAME = "startup.failed"
RERUN = "sudo google_metadata_script_runner startup"


class StartupState(enum.StrEnum):
    """Where the VM's startup script stands."""

    RUNNING = "running"
    """No marker and no failure record yet: running, or not begun."""
    DONE = "done"
    """The marker is there: every step worked."""
    FAILED = "failed"
    """A step failed and left its record; nothing will happen until the script runs again."""


@dataclass(frozen=True)
class Startup:
    state: StartupState
    at: str = ""  # when it finished or failed (UTC)
    step: str = ""  # the step that failed
    exit_code: int | None = None

    def describe(self) -> str:
        """`done at WHEN`, `failed at step 'STEP' (exit N, WHEN)` or `running (no marker yet)`."""
        if self.state is StartupState.DONE:
            return f"done at {self.at}"
        if self.state is StartupState.FAILED:
            return f"failed at step '{self.step}' (exit {self.exit_code}, {self.at})"
        return "running (no marker yet)"


def failure_record(marker: str) -> str:
    return posixpath.join(posixpath.dirname(marker), FAILED_NAME)


def parse(out: str) -> Startup:
    """The state from the `startup ...` line in `out` (remote/facts.py); a record that is not JSON still counts as failed."""
    line = next((line for line in out.splitlines() if line.startswith("startup ")), "startup running")
    _, state, rest = (line.split(" ", 2) + [""])[:3]
    if state == StartupState.DONE.value:
        return Startup(StartupState.DONE, at=rest.strip())
    if state == StartupState.FAILED.value:
        try:
            record = json.loads(rest)
        except ValueError:
            record = {}
        record = record if isinstance(record, dict) else {}
        code = record.get("exit_code")
        return Startup(
            StartupState.FAILED,
            at=str(record.get("at", "?")),
            step=str(record.get("step", "?")),
            exit_code=code if isinstance(code, int) else None,
        )
    return Startup(StartupState.RUNNING)


def failed(vm_name: str, startup: Startup, log: str, last_lines: list[str]) -> UserError:
    """The one line fab stops with: the step, the code, the log's last lines, and the fix."""
    tail = " / ".join(line.strip() for line in last_lines if line.strip())[-400:]
    return UserError(
        f"{vm_name}: the startup script {startup.describe()}{f'; last lines of {log}: {tail}' if tail else ''}; "
        f"fix the cause, then re-run it on the VM ({RERUN}) or recreate the VM"
    )
