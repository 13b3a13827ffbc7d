"""Work beside a command in daemon threads, never cut off at exit in the middle of it.

The Hub check and the dial (vm/dial.py) run in daemon threads, so that a command never waits for them
before it needs their answer. But at exit CPython stops a daemon thread where it next takes the GIL,
and inside an extension module that crashed fab: `fab setup` failing at once ended with SIGSEGV in 9
runs of 30 while its Hub check was still importing huggingface_hub or asking the Hub. So the exit waits
for the work that must finish (the Hub check: its requests time out) and for imports begun beside; a
dial still connecting is never waited for.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401  (see below)
import contextlib
import threading
from collections.abc import Callable, Iterator

# concurrent.futures.thread registers with threading's exit as it is imported, which CPython refuses once the
# exit began: huggingface_hub's hf_api imports it, so a Hub check importing it while the exit waits printed
# "Error importing huggingface_hub.hf_api: can't register atexit after shutdown". Imported here, it is always
# there before (0.3 ms).

EXIT_WAIT_SECONDS = 60  # longer than any of that work takes (the Hub's requests time out after 30 s)

_running = 0  # work that must finish, and imports, begun beside the command
_changed = threading.Condition()


def start(target: Callable[[], None], finish: bool = False) -> None:
    """`target` in a daemon thread; with `finish`, the exit waits for it to end."""
    if finish:
        _count(+1)  # before the thread starts: an exit right after this call waits too
        threading.Thread(target=_counted, args=(target,), daemon=True).start()
    else:
        threading.Thread(target=target, daemon=True).start()


@contextlib.contextmanager
def importing() -> Iterator[None]:
    """Around imports in a thread the exit does not wait for: it waits for them."""
    _count(+1)
    try:
        yield
    finally:
        _count(-1)


def _counted(target: Callable[[], None]) -> None:
    try:
        target()
    finally:
        _count(-1)


def _count(change: int) -> None:
    global _running
    with _changed:
        _running += change
        _changed.notify_all()


@atexit.register
def _wait() -> None:
    with _changed:
        _changed.wait_for(lambda: _running == 0, EXIT_WAIT_SECONDS)
