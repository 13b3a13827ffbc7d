"""What every task shares: the --arg option, turning problems into a clean exit, opening a session.

Light on purpose: `fab` imports every task module for every command, so the task modules import what a
task needs inside it, and a command that drives the VM dials it before the heavy imports (open_session).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from invoke import Context, Exit
from rich.console import Console

from .. import secrets
from ..errors import StoppedWatching, UserError
from ..jobs.checked import LocalInputs
from ..vm.dial import Dial

if TYPE_CHECKING:
    from ..session import Session

ARG_HELP = "override a job setting: JOB.KEY=VALUE (repeatable), e.g. train.num_batches=100, vars.num_batches=100, convert.--lazy_load_tensors=True"
RUN_HELP = "work on this run (MaxText resumes a run name it has seen); default: the VM's current run"
# Off a terminal (a file, a pager, a pipe) nothing is wrapped: rich would cut paths and tables at 80 columns.
UNWRAPPED = 4096
# No emoji codes: a name, path or line the console prints is printed as it is (rich made `state:x:` "state❌"), and
# its first print imports no emoji table (6 ms, 2026-12-07).
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else UNWRAPPED, emoji=False)


def number(
    value, option: str, default: int, kind: type = int, least: float = 0, most: float | None = None
) -> int | float:
    """An option's number (`kind` int: a whole one), from least to most, `default` when not given; else one line
    naming the option (exit 2). Such an option's default in the task is None: invoke would cast the text by the
    default's type itself, and end in a traceback for `--probe 2.5`."""
    if value is None:
        return default
    try:
        found = kind(value)
    except (TypeError, ValueError):
        found = None
    if found is None or found != found or found < least or (most is not None and found > most):  # NaN too
        what = "a whole number" if kind is int else "a number"
        bounds = f"from {least:g} to {most:g}" if most is not None else f"of at least {least:g}"
        raise UserError(f"{option} {str(value)[:40]!r}: {what} {bounds}")
    return found


def gke_session():
    """The gke backend's helpers, imported for a gke stack only (its JobSets and cluster client)."""
    from ..gke import session

    return session


def reports_errors(body: Callable) -> Callable:
    """A UserError is its message and exit 2; Ctrl-C says what goes on; a closed pipe ends quietly."""

    @functools.wraps(body)
    def wrapper(*args, **kwargs):
        try:
            return body(*args, **kwargs)
        except UserError as err:
            message = secrets.redact(str(err))  # an --arg quoted back could hold the token
            raise Exit(f"error: {message}".replace("\n", "\nerror: "), code=2) from None
        except StoppedWatching as stopped:
            raise Exit(f"\n{stopped}", code=130) from None
        except KeyboardInterrupt:
            raise Exit(
                "\ninterrupted: anything started on the VM goes on. Run the same command again to carry on.", code=130
            ) from None
        except BrokenPipeError:  # `fab plan | head`: the reader has all it wanted
            _reader_gone()
            raise Exit(code=0) from None

    return wrapper


def _reader_gone() -> None:
    """What is left to print goes nowhere (Python would complain at exit, flushing into the closed pipe)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def quiet_broken_pipe() -> None:
    """`fab --help | head`: invoke's own printing (help, --list) ends quietly when the reader has all it wanted."""
    earlier = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, BrokenPipeError):
            _reader_gone()
            return
        earlier(kind, value, traceback)

    sys.excepthook = hook


def open_session(
    c: Context,
    overrides: list[str],
    run_name: str | None = None,
    here: dict[str, str] | None = None,
    named: str = "given with --run-name",
    **options: bool,
) -> Session:
    """The command's session (tasks/sessions.py, which says what the `options` are). Inputs that passed the local
    checks before dial the VM at once: the connection opens while the jobs' schema imports and the checks run
    again (jobs/checked.py). With `here` (the environment its commands see), this machine is the VM (fab demo);
    `named`: who chose `run_name`."""
    with _no_collection():
        inputs = LocalInputs(overrides, run_name, options)
        if here is not None:
            from ..vm.here import HereDial

            dial = HereDial(here)
        else:
            dial = Dial(c, console.print, connects=not options.get("recover")) if inputs.passed_before() else None
        from . import sessions  # the jobs' schema (pydantic) and everything a session needs

        return sessions.open_session(c, inputs, dial, overrides, run_name, **options, named=named)


_frozen = False  # whether the command's first session was frozen (_no_collection)


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """No garbage collection while the command's first session opens: its imports and objects live on, and collecting
    among them found nothing (10 ms of a no-op `fab train`, 2026-12-07). They are then frozen out of later collections'
    way. A later session (`fab train --watch` recovering) is collected as usual: frozen, a dropped one's cycles (its SSH
    connection) would live until exit."""
    global _frozen
    if _frozen or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        _frozen = True
        gc.enable()


def prepare(session: Session) -> None:
    """Before a pipeline starts: the secrets and the task's files on the VM, and the VM ready (its startup script
    done)."""
    vm_spec, task = session.plan.spec.vm, session.plan.task
    changed, ready = session.vm.prepare(session.secrets, vm_spec.startup_marker)
    if not task.builtin:  # its files travel as the other inputs do: into a folder of the VM's named by their digest
        changed += session.vm.put_task(
            task.vm_folder(session.plan.layout), task.uploads(), task.vm_spec(session.plan.layout), task.digest
        )
    for line in changed:
        console.print(f"{session.vm.name}: {line}")
    if not ready:
        session.vm.wait_for_startup(vm_spec.startup_marker, vm_spec.startup_log, console)
