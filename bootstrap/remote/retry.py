"""One policy for what may pass, shared by the VM's runner and driver and the gke driver.

Cloud Storage and the Kubernetes API both answer 429 or 5xx, drop a connection or cut a TLS stream
while they are busy or upgraded, and a zonal control plane is away for minutes while GKE upgrades it.
Such a failure is tried again with backoff for RETRY_SECONDS before it counts: a storage outage never
becomes a failed job or a dead driver. What cannot pass (a 4xx: a refusal) is raised at once.

Standard library only: it runs on the VM and in a gke pod.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

RETRY_SECONDS = 900
MAX_BACKOFF_SECONDS = 30
# The first wait, doubled at each try. Tests only: the fault campaign (tests/unit/test_fault_campaign.py)
# sets TPU_RL_RETRY_BACKOFF_SECONDS to a few milliseconds, so that hundreds of injected 503s take seconds.
BACKOFF_SECONDS = float(os.environ.get("TPU_RL_RETRY_BACKOFF_SECONDS", "1"))
T = TypeVar("T")


def within(call: Callable[[], T], seconds: float) -> T:
    """`call()`'s result, whole within `seconds`: a socket's timeout bounds each read, not an answer trickled a
    byte at a time, so the call runs in a thread left behind (a daemon) once its time is up (TimeoutError)."""
    import threading

    answer: list = []

    def run() -> None:
        try:
            answer.append(call())
        except BaseException as err:  # noqa: BLE001 - handed to the caller as is
            answer.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if not answer:
        raise TimeoutError(f"no whole answer within {seconds:g} s")
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]


def may_pass(err: BaseException) -> bool:
    """A 429 or 5xx, a dropped or cut connection (a TLS error is an OSError), a timeout, a half answer, or
    an answer that is not JSON (a proxy's error page); not a certificate that fails verification."""
    import http.client  # here, not above: every fab command starts a tool on the VM, and few calls fail
    import ssl
    import urllib.error

    if isinstance(err, urllib.error.HTTPError):
        return err.code == 429 or err.code >= 500
    if isinstance(err, ssl.SSLCertVerificationError) or isinstance(
        getattr(err, "reason", None), ssl.SSLCertVerificationError
    ):
        return False
    return isinstance(err, (OSError, ValueError, http.client.HTTPException))


def retrying(
    call: Callable[[], T], transient: Callable[[BaseException], bool] = may_pass, seconds: float = RETRY_SECONDS
) -> T:
    """`call()`, tried again with backoff (BACKOFF_SECONDS doubling up to MAX_BACKOFF_SECONDS) for `seconds`
    while what fails is `transient`; then, or for anything else, its error."""
    deadline, attempt = time.monotonic() + seconds, 0
    while True:
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - `transient` decides, the rest is raised
            if not transient(err) or time.monotonic() > deadline:
                raise
        time.sleep(min(BACKOFF_SECONDS * 2**attempt, MAX_BACKOFF_SECONDS))
        attempt += 1
