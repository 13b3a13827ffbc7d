"""Trusting a VM given with -H: its SSH host key recorded once in ~/.ssh/known_hosts."""

from __future__ import annotations

from fabric import Connection, task

from ..errors import UserError
from ..vm import connect, hostkeys
from .common import console, reports_errors


@task
@reports_errors
def trust_host(c):
    """Record the -H host's SSH key in ~/.ssh/known_hosts if it has none there (like ssh's accept-new).

    Check the fingerprint it prints against the VM's own (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`
    on the VM). A host whose recorded key changed is still refused. The stack's VM needs none of this: its
    keys are pinned from the Compute Engine API.
    """
    if not isinstance(c, Connection):
        raise UserError("trust-host is for a VM given with -H; the stack's VM is pinned from the Compute Engine API")
    conn = connect.connection(c, console.print)
    policy = hostkeys.trust_new(conn.client)
    connect.open_connection(conn).close()
    if policy.recorded:
        name, key = policy.recorded
        console.print(f"recorded {name} {hostkeys.describe(key)} in {hostkeys.USER_KNOWN_HOSTS}")
    else:
        console.print(f"{conn.host}:{conn.port} is already in {hostkeys.USER_KNOWN_HOSTS}; nothing to do")
