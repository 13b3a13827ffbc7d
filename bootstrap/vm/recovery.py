"""`fab train --watch`: stay attached, and when the VM is lost carry the run on by itself.

A Spot VM is deleted when preempted; any VM may lose its connection, be stopped or deleted. Each time, this
does what the user would type, `fab train --recover`: recreate the stack's VM (only a gone or stopped one), restore
the environment and the last committed checkpoint, and resume the same run. It tries a bounded number of times,
waiting twice as long after each failed try (Spot capacity is often short for a while), and says and notifies
each try. Anything else that stops the run (a job that failed, a bad input) ends the watch at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .. import secrets
from ..errors import UserError, VmUnavailable
from ..remote import notify

TRIES = 5  # recoveries of one `fab train --watch`, by default
# The first wait before a recovery, doubled after each (tests: shorter); never longer than LONGEST_WAIT_SECONDS.
FIRST_WAIT_SECONDS = float(os.environ.get("TPU_RL_WATCH_WAIT_SECONDS", "60"))
LONGEST_WAIT_SECONDS = 30 * 60


def wait_before(recovery: int) -> float:
    """Seconds to wait before recovery number `recovery` (1, 2, ...)."""
    return min(FIRST_WAIT_SECONDS * 2 ** (recovery - 1), LONGEST_WAIT_SECONDS)


def watch(
    attempt: Callable[[bool, Callable[[], None]], None],
    tries: int,
    say: Callable[[str], None],
    tell: Callable[[str, dict], None],
    sleep: Callable[[float], None] = time.sleep,
    preempted: Callable[[float], str | None] = lambda since: None,
) -> None:
    """Run `attempt(recovering, progressed)` until it returns; after a VmUnavailable, wait and try again as a
    recovery, at most `tries` times in a row. An attempt that calls `progressed()` moved the run on since the last
    loss (train trained a step on its VM): the next loss (another preemption, hours later) starts the count and the
    waits afresh. A new VM that answers and is lost again before the run moved counts as a try, so the watch never
    pays for VMs without end. Each loss says why (`preempted(since)`: the VM's own record of a preemption since
    then, if any), each recovery and giving up is said and told."""
    recovery, going = 0, [False]

    def progressed() -> None:
        going[0] = True

    while True:
        going[0], began = False, time.time()
        try:
            attempt(recovery > 0, progressed)
            return
        except VmUnavailable as lost:
            if going[0]:
                recovery = 0
            why = lost.reason.split("\n")[0]
            if record := preempted(began):
                why = f"{why}; it was {record}"
            if recovery >= tries:
                said = f"{why}; fab train --watch gave up after {tries} recoveries (--tries)"
                tell(said, {"state": "gave-up", "recoveries": tries})
                raise UserError(said) from None
            recovery += 1
            seconds = wait_before(recovery)
            said = f"the VM cannot carry the run on ({why}); recovery {recovery} of {tries} in {seconds:.0f} s"
            say(said)
            tell(said, {"state": "recovering", "recovery": recovery, "tries": tries})
            sleep(seconds)


def teller(notify_entries: list[str], say: Callable[[str], None]) -> Callable[[str, dict], None]:
    """Tell results.notify's receivers from this machine (the VM that would tell them may be gone): their URLs
    from this machine's environment, as fab train hands them to the VM; each outcome said in one line."""
    urls = secrets.notify_urls(notify_entries, "jobs/pipeline.yaml", required=False)

    def tell(text: str, event: dict) -> None:
        for entry in notify_entries:
            name, _, kind = entry.partition(":")
            if url := urls.get(f"{secrets.NOTIFY_PREFIX}{name}"):
                outcome = notify.send(url, notify.kind_of(url, kind), text, {**event, "text": text})
                if not outcome.get("ok"):
                    say(f"notify {name}: not told ({outcome.get('error', 'failed')})")

    return tell
