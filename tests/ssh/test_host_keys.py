"""Host keys: only the VM's own key is accepted, pinned from the Compute Engine API or known_hosts.

The loopback sshd plays the VM; tests/computestub.py plays the Compute Engine API's
guest attributes; a `pulumi` on PATH prints the stack's outputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.errors import UserError
from bootstrap.vm import hostkeys
from tests import computestub
from tests.loopback import REPO, Fab

INSTANCE = "tpu-rl-v6e-8"


def fingerprint(public_key_file) -> str:
    """OpenSSH's own fingerprint of a key (what the user compares)."""
    return subprocess.run(["ssh-keygen", "-lf", public_key_file], capture_output=True, text=True).stdout.split()[1]


def key_fields(public_key_file) -> tuple[str, str]:
    kind, blob = public_key_file.read_text().split()[:2]
    return kind, blob


@pytest.fixture
def other_key(tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp_path / "other"], check=True)
    return tmp_path / "other.pub"


class Stack:
    """fab without -H: the VM from `pulumi stack output --json`, its keys from the Compute API stand-in."""

    def __init__(self, fab: Fab, compute: computestub.Compute, instance_id: str = "1001"):
        self.fab, self.compute = fab, compute
        self.bin = fab.tmp / "pulumi-bin"
        self.bin.mkdir(exist_ok=True)
        self.pins = fab.tmp / "pins" / "known_hosts"
        self.recreate(instance_id)

    def recreate(self, instance_id: str) -> None:
        self.outputs(
            {
                "backend": "vm",
                "hosts": [f"127.0.0.1:{self.fab.host.port}"],
                "ssh_user": self.fab.host.user,
                "instance_id": instance_id,
                "instance_name": INSTANCE,
                "project": "my-project",
                "zone": "us-east5-b",
            }
        )

    def outputs(self, outputs: dict) -> None:
        """What `pulumi stack output --json` prints."""
        script = self.bin / "pulumi"
        script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(outputs)}\nEOF\n")
        script.chmod(0o755)

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        env = {
            **self.fab.env(),
            "PATH": f"{self.bin}:{self.fab.env()['PATH']}",
            hostkeys.COMPUTE_API_ENV: self.compute.url,
            "TPU_RL_KNOWN_HOSTS": str(self.pins),
        }
        fab = str(Path(sys.executable).with_name("fab"))
        command = [fab, "-r", str(REPO), "-i", str(self.fab.host.key), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_stack_vm_connects_with_the_published_key_and_pins_it(fab, compute):
    compute.host_keys[INSTANCE] = [key_fields(fab.host.host_key)]
    stack = Stack(fab, compute)
    result = stack("status")
    assert result.returncode == 0, result.stderr
    assert f"pinned {INSTANCE}'s SSH host keys: ssh-ed25519 {fingerprint(fab.host.host_key)}" in result.stdout
    assert stack.pins.read_text().startswith(f"compute.1001,[127.0.0.1]:{fab.host.port} ssh-ed25519 ")
    asked = len(compute.requests)
    assert stack("status").returncode == 0
    assert len(compute.requests) == asked  # pinned: the API is not asked again


def test_stack_vm_with_another_key_is_refused_showing_both(fab, compute, other_key):
    compute.host_keys[INSTANCE] = [key_fields(other_key)]
    stack = Stack(fab, compute, instance_id="2002")
    result = stack("status")
    assert result.returncode == 2
    assert f"expected ssh-ed25519 {fingerprint(other_key)}, got ssh-ed25519 {fingerprint(fab.host.host_key)}" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_pinned_key_holds_when_the_api_later_says_otherwise_and_a_recreated_vm_is_repinned(fab, compute, other_key):
    compute.host_keys[INSTANCE] = [key_fields(fab.host.host_key)]
    stack = Stack(fab, compute, instance_id="3003")
    assert stack("status").returncode == 0
    compute.host_keys[INSTANCE] = [key_fields(other_key)]  # the API is not what decides once pinned
    assert stack("status").returncode == 0
    stack.recreate("3004")  # a new VM at the same address: its own (published) key is pinned ...
    result = stack("status")
    assert result.returncode == 2 and "the host key changed" in result.stderr  # ... and this sshd is not it
    assert "compute.3003" not in stack.pins.read_text() and "compute.3004" in stack.pins.read_text()


def test_stack_vm_still_booting_is_waited_for(fab, compute):
    compute.host_keys[INSTANCE] = [key_fields(fab.host.host_key)]
    compute.not_yet[INSTANCE] = 1
    result = Stack(fab, compute, instance_id="4004")("status")
    assert result.returncode == 0, result.stderr
    assert f"waiting for {INSTANCE} to publish its SSH host keys" in result.stdout


def test_keys_never_published_end_in_a_clear_error(compute, monkeypatch):
    monkeypatch.setenv(hostkeys.COMPUTE_API_ENV, compute.url)
    said = []
    with pytest.raises(UserError, match="has not published its SSH host keys .* after 1 s; is the VM running"):
        hostkeys.wait_for_keys("my-project", "us-east5-b", "never-booted", said.append, wait=1)
    assert said == ["waiting for never-booted to publish its SSH host keys (first boot; up to 1 s)"]


def test_unknown_host_is_refused_until_trusted_once(fab):
    known_hosts = fab.home / ".ssh" / "known_hosts"
    known_hosts.write_text("")
    result = fab("status")
    assert result.returncode == 2
    expected = f"unknown host, not in ~/.ssh/known_hosts (its key: ssh-ed25519 {fingerprint(fab.host.host_key)})"
    assert expected in result.stderr
    assert f"trust it once: fab -H {fab.host.target} trust-host" in result.stderr
    trusted = fab("trust-host")
    assert trusted.returncode == 0, trusted.stderr
    assert f"recorded [127.0.0.1]:{fab.host.port} ssh-ed25519 {fingerprint(fab.host.host_key)}" in trusted.stdout
    assert known_hosts.read_text() == fab.host.known_hosts_line()
    assert fab("status").returncode == 0


def test_changed_host_key_is_refused_even_by_trust_host(fab, other_key):
    kind, blob = key_fields(other_key)
    (fab.home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{fab.host.port} {kind} {blob}\n")
    for command in ("status", "trust-host"):
        result = fab(command)
        assert result.returncode == 2
        assert f"expected ssh-ed25519 {fingerprint(other_key)}, got ssh-ed25519 {fingerprint(fab.host.host_key)}" in (
            result.stderr
        )
