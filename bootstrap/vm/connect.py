"""Reach the one VM: from Fabric's -H, or from the Pulumi stack's outputs.

The SSH backend drives exactly one VM. A multi-host slice is not several SSH hosts
running the same command: MaxText 0.2.3 runs multi-host GRPO only through Pathways on
GKE, so several hosts are refused with a pointer there. Every way a connection can
fail ends in one line that names the host and the fix, within a connect timeout.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable

import paramiko
from fabric import Connection
from invoke import Context
from paramiko.ssh_exception import NoValidConnectionsError

from ..errors import UserError, VmUnavailable
from ..paths import REPO
from . import compute, hostkeys

CONNECT_TIMEOUT_SECONDS = 15
KEEPALIVE_SECONDS = 30
# paramiko logs a failed handshake itself ("Exception (client): ..."); fab says it once, in its own words.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
DEFAULT_USER = "tpu-rl"  # tpu-rl:sshUser's default (infra/settings.py)
MULTI_HOST = (
    "the SSH backend drives one VM, but {count} hosts were given ({hosts}). MaxText 0.2.3 runs multi-host GRPO "
    "only through Pathways on GKE; use the GKE backend for slices bigger than one VM"
)


def stack_outputs() -> dict:
    if shutil.which("pulumi") is None:
        raise UserError(
            f"no VM: pass -H {DEFAULT_USER}@VM_IP (the VM's user is tpu-rl:sshUser, default {DEFAULT_USER}; -H VM_IP "
            "alone logs in as your laptop's user), or install the Pulumi CLI so fab can read the stack's outputs"
        )
    result = subprocess.run(["pulumi", "stack", "output", "--json"], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(
            f"no VM: `pulumi stack output --json` failed: {result.stderr.strip()[-300:]} (run `pulumi up` first, or pass -H)"
        )
    return json.loads(result.stdout)


def _cli_hosts(argv: list[str]) -> list[str]:
    """The hosts given with -H/--hosts (Fabric runs a task once per host: refuse before the first)."""
    for index, arg in enumerate(argv):
        for flag in ("-H", "--hosts"):
            if arg == flag and index + 1 < len(argv):
                return argv[index + 1].split(",")
            if arg.startswith(flag + ("=" if flag == "--hosts" else "")) and arg != flag:
                return arg[len(flag) :].lstrip("=").split(",")
    return []


def one_host(hosts: list[str]) -> str:
    if len(hosts) != 1:
        raise UserError(MULTI_HOST.format(count=len(hosts), hosts=", ".join(hosts)))
    return hosts[0]


def refuse_several_hosts(c: Context, outputs: dict | None) -> None:
    """Several hosts, from -H or the stack: refused first, before anything needs the network."""
    hosts = _cli_hosts(sys.argv[1:]) if isinstance(c, Connection) else (outputs or {}).get("hosts") or []
    if len(hosts) > 1:
        one_host(hosts)


def connection(c: Context, say: Callable[[str], None], outputs: dict | None = None) -> Connection:
    """The Connection to the VM (not yet opened): host keys pinned, connect, banner and auth timeouts.

    The stack's VM (from its `outputs`) is pinned from the Compute Engine API; a host given
    with -H must be in ~/.ssh/known_hosts (see hostkeys.py).
    """
    refuse_several_hosts(c, outputs)
    if isinstance(c, Connection):
        conn = c
        hostkeys.use_known_hosts(conn.client)
    else:
        outputs = outputs if outputs is not None else stack_outputs()
        if not outputs.get("hosts"):
            raise UserError(
                'the Pulumi stack has no `hosts` output yet: run `pulumi up` first (if it stopped on "unexpected state '
                "'PENDING'\", the VM waits for capacity: run `pulumi up --refresh` once it is RUNNING; docs/vm.md)"
            )
        conn = Connection(one_host(outputs["hosts"]), user=outputs.get("ssh_user"), config=c.config)
        hostkeys.pin_stack_vm(conn.client, outputs, conn.host, conn.port, say)
    # fab -t puts the timeout in connect_kwargs as well, which Connection.open then refuses as ambiguous
    timeout = int(conn.connect_kwargs.pop("timeout", 0)) or conn.connect_timeout or CONNECT_TIMEOUT_SECONDS
    conn.connect_timeout = timeout
    conn.connect_kwargs.setdefault("banner_timeout", timeout)
    conn.connect_kwargs.setdefault("auth_timeout", timeout)
    return conn


def open_connection(conn: Connection, outputs: dict | None = None) -> Connection:
    """Open it, or raise one line that says what went wrong and what to do: for the stack's VM (its
    `outputs`) that it is gone or stopped, when the Compute Engine API says so."""
    try:
        return _open(conn)
    except UserError as failed:
        if outputs is None:
            raise
        try:
            gone = compute.gone(outputs)
        except UserError as api:  # offline, or no credentials: the SSH failure is still the message
            unknown = f"{failed}; whether the VM still exists is unknown: {api}"
            raise (VmUnavailable if isinstance(failed, VmUnavailable) else UserError)(unknown) from None
        if gone and (gone.foreign or gone.waiting):  # an instance the stack did not make, or one waiting for capacity
            raise UserError(str(gone)) from None  # is the user's to decide on
        if gone:
            raise VmUnavailable(gone.reason, gone.advice) from None
        raise


def recover(outputs: dict | None, say: Callable[[str], None]) -> tuple[dict, bool]:
    """Recreate the stack's VM with the user's own `pulumi up` when it is gone; the stack's outputs after, and
    whether it was recreated.

    A deleted VM is dropped from the state by the refresh and created again; a stopped one is replaced;
    only the instance is targeted. A VM that runs as the stack says is left alone, and an instance the
    stack did not make (another id under its name) is never touched.
    """
    if outputs is None:
        raise UserError("--recover recreates the Pulumi stack's VM; a VM given with -H is yours to recreate")
    gone = compute.gone(outputs)
    if gone is None:
        say(f"the stack's VM {outputs['instance_name']} runs: nothing to recreate")
        return outputs, False
    if gone.foreign or gone.waiting:
        raise UserError(str(gone))
    if not outputs.get("instance_urn") or gone.exists and not outputs.get("instance_id"):
        missing = "instance_urn" if not outputs.get("instance_urn") else "instance_id"  # without the id: whose VM?
        raise UserError(f"the Pulumi stack has no `{missing}` output: run `pulumi up` with this version first")
    # Only the instance (and what depends on it): other changes to the stack wait for the user's own `pulumi up`.
    target = "--target-replace" if gone.exists else "--target"
    command = ["pulumi", "up", "--yes", "--skip-preview", "--refresh", target, outputs["instance_urn"]]
    command += ["--target-dependents"]
    say(f"the stack's VM {gone.name} {gone.why}: recreating it with `{' '.join(command)}`")
    if subprocess.run(command, cwd=REPO, stdin=subprocess.DEVNULL).returncode != 0:  # Spot capacity short, often
        raise VmUnavailable(
            f"`{' '.join(command)}` failed (its output is above)", f"; fix that, then {compute.RECOVER} again"
        )
    hostkeys.Pins().forget(str(outputs.get("instance_id")))
    return stack_outputs(), True


def _open(conn: Connection) -> Connection:
    where = f"{conn.user}@{conn.host}:{conn.port}"
    timeout = conn.connect_timeout
    sock = None
    try:
        if not conn.gateway:  # a ProxyJump or ProxyCommand brings its own socket
            sock = conn.connect_kwargs["sock"] = _socket(conn.host, conn.port, timeout)
        conn.open()
    except Unreachable as err:
        raise VmUnavailable(f"{where}: cannot reach it ({err}); is the address right, and the VM running?") from None
    except paramiko.BadHostKeyException as err:
        raise UserError(
            f"{where}: the host key changed: expected {hostkeys.describe(err.expected_key)}, got {hostkeys.describe(err.key)}. "
            "Refused: another machine may answer at this address. If the VM was recreated, run `pulumi refresh` "
            "(stack VM) or remove the old key with ssh-keygen -R (-H)"
        ) from None
    except hostkeys.UnknownHostKey as err:
        raise UserError(
            f"{where}: unknown host, not in {hostkeys.USER_KNOWN_HOSTS} (its key: {hostkeys.describe(err.key)}). "
            f"If that is your VM's key, trust it once: fab -H {conn.user}@{conn.host}:{conn.port} trust-host"
        ) from None
    except paramiko.AuthenticationException:
        raise UserError(
            f"{where}: the VM refused {conn.user}'s SSH key (the VM's user is tpu-rl:sshUser, default {DEFAULT_USER}: "
            f"-H {DEFAULT_USER}@{conn.host}; is tpu-rl:sshPublicKey the key you log in with? pass it with -i KEY)"
        ) from None
    except (NoValidConnectionsError, ConnectionRefusedError):
        raise VmUnavailable(
            f"{where}: connection refused (the VM may still be booting, or sshd is not running on port {conn.port})"
        ) from None
    except socket.gaierror:
        raise UserError(f"{where}: unknown host name (check -H, or the stack's `hosts` output)") from None
    except TimeoutError:
        raise VmUnavailable(
            f"{where}: no answer within {timeout} s (is the VM running, and tpu-rl:sshSourceRanges open to your address?)"
        ) from None
    except (paramiko.SSHException, EOFError, OSError) as err:
        raise UserError(
            f"{where}: the SSH handshake failed within {timeout} s ({err or type(err).__name__}); "
            "is this the VM's SSH port, and is the VM overloaded?"
        ) from None
    finally:
        conn.connect_kwargs.pop("sock", None)  # used once: opened again, the connection makes its own
        if sock is not None and (conn.transport is None or conn.transport.sock is not sock):
            sock.close()  # never handed to the SSH transport
    conn.transport.set_keepalive(KEEPALIVE_SECONDS)
    return conn


def _socket(host: str, port: int, timeout: float) -> socket.socket:
    """The TCP connection, without Nagle's delay. fab's messages are small and each waits for its answer;
    with it, a message written in two parts waited for the server's delayed ACK (40 ms on Linux): on the
    loopback host the SSH handshake took 0.07 s instead of 0.03 s, and a request sent with its EOF, or a
    command's start on a new channel, 0.045 s more."""
    # An ASCII name as bytes: a str is encoded by the IDNA codec, whose import cost a command that dials 7 ms (2026-12-07)
    address = host.encode() if host.isascii() else host
    try:
        sock = socket.create_connection((address, port), timeout)
    except (ConnectionRefusedError, TimeoutError, socket.gaierror):
        raise
    except OSError as err:  # no route, network unreachable: said as such, not as a refusal or a handshake
        raise Unreachable(err.strerror or str(err)) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Unreachable(OSError):
    """No TCP connection to the VM, for a reason other than a refusal or a timeout."""
