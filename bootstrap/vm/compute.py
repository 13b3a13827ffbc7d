"""The Compute Engine API as fab uses it: the stack VM's guest attributes and whether the VM is still there.

A reservation-bound, SPOT or FLEX_START VM is deleted on host maintenance, preemption or
the end of its run time, and autostop stops one: then SSH only times out. Asking the API
turns that into one line that says what happened and the fix (`fab train --recover`).
The two calls are plain REST GETs with the user's application-default credentials: the
google-cloud-compute client builds a class for each of the API's thousand types as it is
imported, 2 CPU-s on every first contact and every lost VM, for two GETs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import beside
from ..errors import UserError, VmUnavailable

# For tests: a local stand-in of the Compute Engine API (plain http, no credentials).
COMPUTE_API_ENV = "TPU_RL_COMPUTE_API"
API = "https://compute.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
RECOVER = "fab train --recover"
RUNNING = ("PROVISIONING", "STAGING", "RUNNING", "REPAIRING")  # on its way up, or up
# A FLEX_START instance waiting for capacity (Compute Engine's instance status PENDING). The provider's create waits
# for RUNNING and stops on any state it does not list, this one included (docs/maintainers.md: the first pulumi up).
WAITING = "PENDING"
TIMEOUT_SECONDS = 30
# A 429 or 5xx is asked again, waiting 0.5, 1, 2 then 4 s (or what Retry-After says), as the client library did.
RETRIES, BACKOFF_SECONDS = 4, 0.5
LOGIN = "run `gcloud auth application-default login`"


def ask(what: str, permission: str, project: str, path: str, params: dict | None = None) -> dict | None:
    """GET compute/v1/projects/`project`/`path` as JSON, its failures in one line each; None when the API answers
    404. `what` and `permission` name the read in those lines."""
    with beside.importing():  # also called in the dial's thread (vm/dial.py); google.auth imports as it reads
        import requests
        from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError, RefreshError, TransportError

        try:
            session = _session()
        except DefaultCredentialsError as err:  # none found, or a GOOGLE_APPLICATION_CREDENTIALS file it cannot read
            raise UserError(f"no Google credentials to read {what} ({err}): {LOGIN}") from None
    url = f"{os.environ.get(COMPUTE_API_ENV) or API}/compute/v1/projects/{project}/{path}"
    failed = f"the Compute Engine API failed reading {what}"
    try:
        answer = session.get(url, params=params, timeout=TIMEOUT_SECONDS)
    except (TransportError, requests.RequestException) as err:  # the network, asking or refreshing the token: later
        raise VmUnavailable(f"{failed}: {err}") from None
    except GoogleAuthError as err:  # expired or revoked application-default credentials, or the token server now
        said = str(err.args[0]) if err.args else str(err)  # a RefreshError's first is its line, then the answer
        if isinstance(err, RefreshError) and err.retryable:
            raise VmUnavailable(f"{failed}: {said}") from None
        raise UserError(f"your Google credentials failed reading {what} ({said}): {LOGIN}") from None
    finally:
        session.close()
    if answer.status_code == 404:
        return None
    if answer.status_code == 403 and "rateLimitExceeded" not in answer.text:  # the API disabled, a role missing
        raise UserError(f"your Google account may not read {what} ({permission} on {project}): {_said(answer)}")
    if answer.status_code == 401:
        raise UserError(f"your Google credentials failed reading {what} ({_said(answer)}): {LOGIN}")
    if not answer.ok:  # the API, after its retries: again later
        raise VmUnavailable(f"{failed}: {_said(answer)}")
    try:
        found = answer.json()
    except ValueError:  # a proxy's or a portal's page
        found = None
    if not isinstance(found, dict):
        raise VmUnavailable(f"{failed}: not the API's JSON: {_said(answer)}")
    return found


def _session():
    """Requests signed with the application-default credentials (gcloud's login, or the VM's service account), or
    none for the stand-in; a 429 or 5xx asked again."""
    import google.auth
    import google.auth.compute_engine  # noqa: F401  what a refresh imports, here: inside beside.importing()
    import google.oauth2._client  # noqa: F401
    import google.oauth2.credentials  # noqa: F401
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    if os.environ.get(COMPUTE_API_ENV):  # nothing to refresh on a 401 either
        session = AuthorizedSession(AnonymousCredentials(), refresh_status_codes=())
    else:
        session = AuthorizedSession(google.auth.default(scopes=[SCOPE])[0])
    retry = Retry(
        total=RETRIES,
        connect=0,
        read=0,
        status=RETRIES,
        backoff_factor=BACKOFF_SECONDS,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods={"GET"},
        raise_on_status=False,
    )
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=retry))
    return session


def _said(answer) -> str:
    """The API's own error, on one line: its status and message."""
    try:
        message = answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = answer.text
    return f"{answer.status_code} {answer.reason}: {' '.join(str(message).split())[:300]}"


@dataclass(frozen=True)
class Instance:
    id: str
    status: str  # Compute Engine's: RUNNING, TERMINATED (stopped), SUSPENDED, ...


def instance(project: str, zone: str, name: str) -> Instance | None:
    """The instance as the API sees it now; None when it does not exist."""
    found = ask(f"the state of {name}", "compute.instances.get", project, f"zones/{zone}/instances/{name}")
    return None if found is None else Instance(str(found["id"]), found["status"])


@dataclass(frozen=True)
class Gone:
    """The stack's VM cannot serve the run: deleted, or still there but stopped or another instance."""

    name: str
    why: str
    exists: bool  # a stopped instance must be replaced; a deleted one is only created again
    foreign: bool = False  # another instance has the name: never touched by fab
    waiting: bool = False  # made, and waiting for capacity: never replaced (it would lose its place)

    def __str__(self) -> str:
        if self.waiting:
            return (
                f"the stack's VM {self.name} {self.why}; nothing is recreated. Once `gcloud compute instances describe "
                f"{self.name} --format='value(status)'` says RUNNING, run `pulumi up --refresh` (a first pulumi up "
                "stops on \"unexpected state 'PENDING'\": this records the VM it made), then fab train"
            )
        if self.foreign:
            return (
                f"the stack's VM {self.name} {self.why}; fab never replaces an instance the stack did not make: "
                "if it is yours to lose, delete it, then fab train --recover; or give this stack another "
                "tpu-rl:instanceName and run pulumi up"
            )
        return self.reason + self.advice

    @property
    def reason(self) -> str:
        return f"the stack's VM {self.name} {self.why}; its /dev/shm went with it"

    advice = f". Recreate it and carry on: {RECOVER}"


def gone(outputs: dict) -> Gone | None:
    """What keeps the stack's VM from serving this run; None when it runs as the stack says."""
    name, expected = outputs["instance_name"], str(outputs.get("instance_id") or "")
    found = instance(outputs["project"], outputs["zone"], name)
    if found is None:
        return Gone(
            name, "no longer exists (deleted on host maintenance, preemption or the end of its run time)", False
        )
    # Identity before status: a stopped instance that the stack did not make is still not ours to replace.
    if expected and found.id != expected:
        return Gone(name, f"is another instance (id {found.id}, the stack's is {expected})", True, foreign=True)
    if found.status == WAITING:
        return Gone(name, "is PENDING: waiting for capacity (FLEX_START)", True, waiting=True)
    if found.status not in RUNNING:
        return Gone(name, f"is {found.status} (stopped: by autostop or from the VM itself)", True)
    return None
