"""Which SSH host key `fab` accepts: pinned from the Compute Engine API, or the user's known_hosts.

Fabric accepts any host key by default, so a VM deleted on maintenance whose address
went to someone else would receive the Hugging Face token. Instead:

- The stack's VM publishes its host keys as guest attributes (`hostkeys/`, metadata
  `enable-guest-attributes=TRUE`). Before the first connection `fab` reads them from the
  Compute Engine API with the user's application-default credentials (as `gcloud compute
  ssh` does) and pins them in a project-local known_hosts file under `compute.<instance
  id>` and the address. A recreated VM has a new id and is pinned again; any other
  machine at that address is refused.
- With `-H`, the user's ~/.ssh/known_hosts decides. A changed key is always refused with
  both fingerprints; an unknown one is refused until `fab -H HOST trust-host` records it.

Either way the connection uses a reject policy: a key not pinned is never accepted.
The API itself is bootstrap/vm/compute.py's.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from ..errors import UserError
from ..paths import pinned_host_keys
from . import compute

# Only this type is pinned from the guest attributes: any process on the VM may write guest attributes, so
# a key the VM's sshd does not serve must not become trusted; the VM image's sshd serves ed25519, and the
# connection then negotiates that type (paramiko asks first for the type it knows).
PINNED_TYPE = "ssh-ed25519"
HOST_KEY_WAIT_SECONDS = 300  # the guest agent publishes the keys within a minute or two of the first boot
POLL_SECONDS = 5
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


class UnknownHostKey(paramiko.SSHException):
    """The host is not in known_hosts: refused, with its fingerprint for the user to check."""

    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


class RefuseUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(hostname, key)


class RecordNew(paramiko.MissingHostKeyPolicy):
    """ssh's accept-new: an unknown host's key is recorded in known_hosts; a changed one is still refused."""

    def __init__(self, path: Path):
        self.path = path
        self.recorded: tuple[str, paramiko.PKey] | None = None

    def missing_host_key(self, client, hostname, key):
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        ends_line = not self.path.exists() or self.path.read_bytes()[-1:] in (b"", b"\n")
        with open(self.path, "a") as known:
            known.write(("" if ends_line else "\n") + HostKeyEntry([hostname], key).to_line())
        self.recorded = (hostname, key)


def read_entries(path: Path) -> list[HostKeyEntry]:
    """The entries of a known_hosts file; like OpenSSH, a line that cannot be read is skipped."""
    entries = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            entry = HostKeyEntry.from_line(line, number)
        except (InvalidHostKey, paramiko.SSHException, ValueError):
            continue
        if entry is not None:
            entries.append(entry)
    return entries


def describe(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def lookup_name(host: str, port: int) -> str:
    """The name known_hosts files use for this address (as ssh and paramiko write it)."""
    return host if port == 22 else f"[{host}]:{port}"


# --- The stack's VM: keys from the Compute Engine API ------------------------------------


def published_keys(project: str, zone: str, instance: str) -> list[tuple[str, str]]:
    """The VM's host keys as (type, base64) from its guest attributes, checked as gcloud checks them.

    Empty when the VM has not published them yet.
    """
    answer = compute.ask(
        f"{instance}'s SSH host keys (its guest attributes, where they are pinned from)",
        "compute.instances.getGuestAttributes",
        project,
        f"zones/{zone}/instances/{instance}/getGuestAttributes",
        {"queryPath": "hostkeys/"},
    )
    keys = []
    for item in ((answer or {}).get("queryValue") or {}).get("items") or []:
        value = str(item.get("value") or "").strip()
        if item.get("namespace") != "hostkeys" or item.get("key") != PINNED_TYPE:
            continue
        try:
            blob = base64.b64decode(value, validate=True)
            paramiko.PKey.from_type_string(PINNED_TYPE, blob)  # a key of its type, not only base64
        except (binascii.Error, paramiko.SSHException, ValueError):
            continue
        if base64.b64encode(blob).decode() == value:
            keys.append((PINNED_TYPE, value))
    return keys


def wait_for_keys(
    project: str, zone: str, instance: str, say: Callable[[str], None], wait: float = HOST_KEY_WAIT_SECONDS
) -> list[tuple[str, str]]:
    """The published keys; a VM still booting gets `wait` seconds, with a heartbeat."""
    deadline = time.monotonic() + wait
    said = False
    while not (keys := published_keys(project, zone, instance)):
        if not said and (why := compute.gone({"project": project, "zone": zone, "instance_name": instance})):
            raise UserError(str(why))  # nothing will ever publish them
        if not said:
            say(f"waiting for {instance} to publish its SSH host keys (first boot; up to {wait:.0f} s)")
            said = True
        left = deadline - time.monotonic()
        if left <= 0:
            raise UserError(
                f"{instance} has not published a valid {PINNED_TYPE} SSH host key (guest attributes hostkeys/) "
                f"after {wait:.0f} s; is the VM running, and was it created with enable-guest-attributes=TRUE "
                "(pulumi up)?"
            )
        time.sleep(min(POLL_SECONDS, left))
    return keys


class Pins:
    """The project-local known_hosts file: each line `compute.<id>,<address> TYPE KEY`."""

    def __init__(self, path: Path | None = None):
        self.path = path or pinned_host_keys()
        self.entries = read_entries(self.path) if self.path.exists() else []

    def keys_for(self, instance_id: str) -> list[paramiko.PKey]:
        alias = f"compute.{instance_id}"
        return [e.key for e in self.entries if alias in e.hostnames and e.key.get_name() == PINNED_TYPE]

    def pin(self, instance_id: str, address: str, keys: list[paramiko.PKey]) -> None:
        """Record `keys` for this instance at this address, replacing what was pinned for either."""
        alias = f"compute.{instance_id}"
        kept = [e for e in self.entries if alias not in e.hostnames and address not in e.hostnames]
        self._write(kept + [HostKeyEntry([alias, address], key) for key in keys])

    def forget(self, instance_id: str) -> None:
        """Drop what was pinned for an instance that is gone (replaced by `fab train --recover`)."""
        self._write([e for e in self.entries if f"compute.{instance_id}" not in e.hostnames])

    def _write(self, entries: list[HostKeyEntry]) -> None:
        self.entries = entries
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")  # two fabs pinning at once
        temporary.write_text("".join(e.to_line() for e in self.entries))
        temporary.replace(self.path)


def pin_stack_vm(client: paramiko.SSHClient, outputs: dict, host: str, port: int, say: Callable[[str], None]) -> None:
    """Accept only the stack VM's own host keys at host:port (fetched and pinned on first use)."""
    instance_id = str(outputs.get("instance_id") or "")
    if not instance_id:
        raise UserError("the Pulumi stack has no `instance_id` output: run `pulumi up` with this version first")
    address = lookup_name(host, port)
    pins = Pins()
    keys = pins.keys_for(instance_id)
    if not keys or address not in {name for e in pins.entries for name in e.hostnames}:
        if not keys:
            published = wait_for_keys(outputs["project"], outputs["zone"], outputs["instance_name"], say)
            keys = [paramiko.PKey.from_type_string(kind, base64.b64decode(data)) for kind, data in published]
            say(f"pinned {outputs['instance_name']}'s SSH host keys: {', '.join(map(describe, keys))}")
        pins.pin(instance_id, address, keys)
    for key in keys:
        client.get_host_keys().add(address, key.get_name(), key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())


def use_known_hosts(client: paramiko.SSHClient) -> None:
    """Accept only what ~/.ssh/known_hosts holds for the host; refuse unknown hosts."""
    path = Path(USER_KNOWN_HOSTS).expanduser()
    known = client.get_host_keys()
    for entry in read_entries(path) if path.exists() else []:
        for name in entry.hostnames:
            known.add(name, entry.key.get_name(), entry.key)
    client.set_missing_host_key_policy(RefuseUnknown())


def trust_new(client: paramiko.SSHClient) -> RecordNew:
    """Like ssh's accept-new, on a client set up by `use_known_hosts`: an unknown host is recorded instead."""
    policy = RecordNew(Path(USER_KNOWN_HOSTS).expanduser())
    client.set_missing_host_key_policy(policy)
    return policy
