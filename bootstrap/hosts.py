"""The workers to drive: from Fabric's -H, or from the Pulumi stack's outputs.

Hosts are always a list: a v6e-8 is one worker, bigger slices have several,
and every job runs on all of them.
"""

from __future__ import annotations

import json
import shutil
import subprocess

from fabric import Connection
from invoke import Context

from .errors import UserError
from .paths import REPO
from .vm import Worker

KEEPALIVE_SECONDS = 30


def stack_outputs() -> dict:
    if shutil.which("pulumi") is None:
        raise UserError("no hosts: pass -H user@host, or install the Pulumi CLI so fab can read the stack's outputs")
    result = subprocess.run(["pulumi", "stack", "output", "--json"], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(
            f"no hosts: `pulumi stack output --json` failed: {result.stderr.strip()[-300:]} (run `pulumi up` first, or pass -H)"
        )
    return json.loads(result.stdout)


def connections(c: Context) -> list[Connection]:
    if isinstance(c, Connection):
        return [c]
    outputs = stack_outputs()
    if not outputs.get("hosts"):
        raise UserError("the Pulumi stack has no `hosts` output yet: run `pulumi up` first")
    return [Connection(host, user=outputs.get("ssh_user"), config=c.config) for host in outputs["hosts"]]


def workers(c: Context, state_dir: str) -> list[Worker]:
    result = []
    for index, conn in enumerate(connections(c)):
        conn.open()
        conn.transport.set_keepalive(KEEPALIVE_SECONDS)
        result.append(Worker(conn, index, state_dir))
    return result
