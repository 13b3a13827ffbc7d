"""The Compute Engine API as fab uses it: the stack VM's guest attributes and whether the VM is still there.

A reservation-bound, SPOT or FLEX_START VM is deleted on host maintenance, preemption or
the end of its run time, and autostop stops one: then SSH only times out. Asking the API
turns that into one line that says what happened and the fix (`fab train --recover`).
The Google client library is imported only when the API is called: it adds about half a
second to every `fab` otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .. import beside
from ..errors import UserError, VmUnavailable

# For tests: a local stand-in of the Compute Engine API (plain http, no credentials).
COMPUTE_API_ENV = "TPU_RL_COMPUTE_API"
RECOVER = "fab train --recover"
RUNNING = ("PROVISIONING", "STAGING", "RUNNING", "REPAIRING")  # on its way up, or up
# A FLEX_START instance waiting for capacity (Compute Engine's instance status PENDING). The provider's create waits
# for RUNNING and stops on any state it does not list, this one included (docs/maintainers.md: the first pulumi up).
WAITING = "PENDING"
T = TypeVar("T")


def instances_client():
    with beside.importing():  # also called in the dial's thread (vm/dial.py)
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

    endpoint = os.environ.get(COMPUTE_API_ENV)
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        options = ClientOptions(api_endpoint=endpoint)
        return compute_v1.InstancesClient(credentials=AnonymousCredentials(), transport="rest", client_options=options)
    return compute_v1.InstancesClient(transport="rest")


def ask(what: str, permission: str, project: str, call: Callable[[], T], not_found: T) -> T:
    """One API call, its failures in one line each; `not_found` when the API answers 404."""
    with beside.importing():
        import requests
        from google.api_core import exceptions
        from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError

    try:
        return call()
    except DefaultCredentialsError:
        raise UserError(f"no Google credentials to read {what}: run `gcloud auth application-default login`") from None
    except exceptions.NotFound:
        return not_found
    except exceptions.Forbidden:
        raise UserError(f"your Google account may not read {what} ({permission} on {project})") from None
    except GoogleAuthError as err:  # expired or revoked application-default credentials
        raise UserError(
            f"your Google credentials failed reading {what} ({err}): run `gcloud auth application-default login`"
        ) from None
    except (exceptions.GoogleAPIError, requests.RequestException) as err:  # the network, or the API: again later
        raise VmUnavailable(f"the Compute Engine API failed reading {what}: {err}") from None


@dataclass(frozen=True)
class Instance:
    id: str
    status: str  # Compute Engine's: RUNNING, TERMINATED (stopped), SUSPENDED, ...


def instance(project: str, zone: str, name: str) -> Instance | None:
    """The instance as the API sees it now; None when it does not exist."""
    found = ask(
        f"the state of {name}",
        "compute.instances.get",
        project,
        lambda: instances_client().get(project=project, zone=zone, instance=name, timeout=30),
        None,
    )
    return None if found is None else Instance(str(found.id), found.status)


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
