"""Host keys: only the VM's own key is accepted, pinned from the Compute Engine API or known_hosts.

The loopback sshd plays the VM; tests/computestub.py plays the Compute Engine API's
guest attributes; a stand-in `pulumi` on PATH prints the stack's outputs (tests/stack.py).
"""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest

from bootstrap.errors import UserError
from bootstrap.vm import compute as compute_api
from bootstrap.vm import hostkeys
from tests.loopback import REPO
from tests.stack import INSTANCE, Stack

BROKEN_KEY = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + b"\x01" * 7).decode()  # base64, but no key


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


def test_only_a_valid_ed25519_key_is_pinned(fab, compute, tmp_path):
    """Any process on the VM may write guest attributes: other types and broken keys are never pinned."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", tmp_path / "planted"], check=True)
    kind, blob = key_fields(fab.host.host_key)
    compute.host_keys[INSTANCE] = [key_fields(tmp_path / "planted.pub"), (kind, BROKEN_KEY), (kind, blob)]
    stack = Stack(fab, compute, instance_id="5005")
    result = stack("status")
    assert result.returncode == 0, result.stderr
    pinned = stack.pins.read_text().splitlines()
    assert pinned == [f"compute.5005,[127.0.0.1]:{fab.host.port} {kind} {blob}"]


def test_a_broken_published_key_alone_is_one_line_after_the_wait(compute, monkeypatch):
    monkeypatch.setenv(compute_api.COMPUTE_API_ENV, compute.url)
    compute.host_keys["broken-vm"] = [("ssh-ed25519", BROKEN_KEY)]
    compute.instances["broken-vm"] = {"id": "6006", "status": "RUNNING"}
    with pytest.raises(UserError, match="broken-vm has not published a valid ssh-ed25519 SSH host key"):
        hostkeys.wait_for_keys("my-project", "us-east5-b", "broken-vm", lambda line: None, wait=0)


def test_pins_written_by_many_fabs_at_once_never_fail(tmp_path):
    """Each writer has its own temporary file; the pins file is always whole."""
    script = (
        "import sys, paramiko\n"
        "from pathlib import Path\n"
        "from bootstrap.vm.hostkeys import Pins\n"
        "key = paramiko.Ed25519Key.from_private_key_file(sys.argv[2])\n"
        "for i in range(150):\n"
        "    Pins(Path(sys.argv[1])).pin(sys.argv[3], f'[127.0.0.1]:{i}', [key])\n"
    )
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp_path / "k"], check=True)
    pins = tmp_path / "known_hosts"
    writers = [
        subprocess.Popen([sys.executable, "-c", script, pins, tmp_path / "k", str(n)], cwd=REPO, stderr=subprocess.PIPE)
        for n in range(4)
    ]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0, 0], errors
    assert hostkeys.read_entries(pins)  # readable


def test_keys_never_published_end_in_a_clear_error(compute, monkeypatch):
    monkeypatch.setenv(compute_api.COMPUTE_API_ENV, compute.url)
    compute.instances["never-booted"] = {"id": "7007", "status": "STAGING"}
    said = []
    with pytest.raises(UserError, match="has not published a valid ssh-ed25519 SSH host key .* after 1 s; is the VM"):
        hostkeys.wait_for_keys("my-project", "us-east5-b", "never-booted", said.append, wait=1)
    assert said == ["waiting for never-booted to publish its SSH host keys (first boot; up to 1 s)"]


def test_a_deleted_vm_is_said_at_once_instead_of_waiting_for_its_keys(compute, monkeypatch):
    monkeypatch.setenv(compute_api.COMPUTE_API_ENV, compute.url)
    with pytest.raises(UserError) as err:
        hostkeys.wait_for_keys("my-project", "us-east5-b", "deleted-vm", lambda line: None, wait=300)
    assert str(err.value) == (
        "the stack's VM deleted-vm no longer exists (deleted on host maintenance, preemption or the end of its run "
        "time); its /dev/shm went with it. Recreate it and carry on: fab train --recover"
    )


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


def test_trust_host_keeps_a_known_hosts_without_a_final_newline_and_skips_lines_it_cannot_read(fab, other_key):
    """OpenSSH skips a malformed line; an entry appended to a file that lacks its last newline stays its own line."""
    known_hosts = fab.home / ".ssh" / "known_hosts"
    kind, blob = key_fields(other_key)
    known_hosts.write_text(f"garbage-host ssh-ed25519 not*base64\nother.example {kind} {blob}")
    trusted = fab("trust-host")
    assert trusted.returncode == 0, trusted.stderr
    assert known_hosts.read_text().splitlines()[1:] == [
        f"other.example {kind} {blob}",
        fab.host.known_hosts_line().strip(),
    ]
    result = fab("status")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_changed_host_key_is_refused_even_by_trust_host(fab, other_key):
    kind, blob = key_fields(other_key)
    (fab.home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{fab.host.port} {kind} {blob}\n")
    for command in ("status", "trust-host"):
        result = fab(command)
        assert result.returncode == 2
        assert f"expected ssh-ed25519 {fingerprint(other_key)}, got ssh-ed25519 {fingerprint(fab.host.host_key)}" in (
            result.stderr
        )
