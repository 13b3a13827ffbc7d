"""A lost VM: said in one line with the fix, and `fab train --recover` recreates it and carries on.

The loopback sshd plays the VM before and after; the Compute Engine API stand-in says
whether the stack's instance exists and runs; the stand-in `pulumi up` (tests/stack.py)
"recreates" it under a new instance id. A wiped VM is its state folder, "/dev/shm", the
environment and the Hugging Face cache removed, as a new VM has none of them.
"""

from __future__ import annotations

import shutil
import socket

import pytest

from tests.loopback import Fab, write_hub_cache
from tests.stack import INSTANCE, Stack

SMALL = ("--arg", "vars.num_batches=2")


def unreachable(stack: Stack, instance_id: str) -> None:
    """The stack's outputs still name the old VM, at an address where nothing answers any more."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    stack.outputs(stack.outputs_for(instance_id, port=closed))


def wipe(fab: Fab) -> None:
    for folder in ("state", "shm", "venv", "hf_home"):
        shutil.rmtree(fab.tmp / folder, ignore_errors=True)
    write_hub_cache(fab.tmp / "hf_home")  # what the Hub serves a new VM's prefetch (offline here)


@pytest.fixture
def stack(fab, compute) -> Stack:
    compute.host_keys[INSTANCE] = [tuple(fab.host.host_key.read_text().split()[:2])]
    return Stack(fab, compute, instance_id="1001")


@pytest.mark.parametrize(
    "status, instance_id, why",
    [
        (None, "1001", "no longer exists (deleted on host maintenance, preemption or the end of its run time)"),
        ("TERMINATED", "1001", "is TERMINATED (stopped: by autostop or from the VM itself)"),
        ("RUNNING", "9009", "was replaced outside this stack (instance id 9009, the stack's is 1001)"),
    ],
)
def test_a_lost_vm_is_one_line_that_names_the_fix(stack, compute, status, instance_id, why):
    assert stack("status").returncode == 0  # pinned while it ran
    unreachable(stack, "1001")
    if status is None:
        del compute.instances[INSTANCE]
    else:
        compute.instances[INSTANCE] = {"id": instance_id, "status": status}
    result = stack("train", *SMALL)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: the stack's VM {INSTANCE} {why}; its /dev/shm went with it. "
        "Recreate it and carry on: fab train --recover\n"
    )
    assert stack.up_calls() == []  # only --recover runs pulumi up


def test_a_vm_that_answers_but_refuses_ssh_is_not_called_lost(stack):
    """The API says it runs as the stack says: the SSH failure itself is the message."""
    assert stack("status").returncode == 0
    unreachable(stack, "1001")
    result = stack("status")
    assert result.returncode == 2 and "connection refused" in result.stderr and "--recover" not in result.stderr


def test_recover_recreates_a_deleted_vm_and_the_run_carries_on_there(fab, stack, compute):
    first = stack("train", "--run-name", "r1", *SMALL, timeout=600)
    assert first.returncode == 0, first.stderr
    wipe(fab)
    del compute.instances[INSTANCE]
    unreachable(stack, "1001")
    lost = stack("train", "--run-name", "r1", *SMALL)
    assert lost.returncode == 2 and "fab train --recover" in lost.stderr
    assert not (fab.tmp / "state").exists()  # nothing was started anywhere

    stack.after_up("2002")
    recovered = stack("train", "--run-name", "r1", "--recover", *SMALL, timeout=600)
    assert recovered.returncode == 0, recovered.stderr
    assert stack.up_calls() == [["up", "--yes", "--skip-preview", "--refresh"]]
    assert "recreating it with `pulumi up --yes --skip-preview --refresh`" in recovered.stdout
    assert f"pinned {INSTANCE}'s SSH host keys" in recovered.stdout
    assert "compute.2002" in stack.pins.read_text() and "compute.1001" not in stack.pins.read_text()
    for job in ("setup", "prefetch", "convert", "train", "export"):
        assert f"{job}: starting" in recovered.stdout  # nothing was kept on the lost VM: all of it ran again
    assert (fab.job_dir("r1", "export") / "done").exists()
    assert (fab.tmp / "shm" / "llama3.1-8b-Instruct" / "hf-trained" / "r1" / "SHA256SUMS").exists()


def test_recover_replaces_a_stopped_vm_and_leaves_a_running_one_alone(fab, stack, compute):
    assert stack("train", "--run-name", "r1", *SMALL, timeout=600).returncode == 0
    untouched = stack("train", "--run-name", "r1", "--recover", *SMALL)
    assert untouched.returncode == 0, untouched.stderr
    assert f"the stack's VM {INSTANCE} runs: nothing to recreate" in untouched.stdout
    assert stack.up_calls() == []

    compute.instances[INSTANCE]["status"] = "TERMINATED"
    stack.after_up("3003")
    recovered = stack("train", "--run-name", "r1", "--recover", *SMALL)
    assert recovered.returncode == 0, recovered.stderr
    urn = stack.outputs_for("1001")["instance_urn"]
    assert stack.up_calls() == [["up", "--yes", "--skip-preview", "--refresh", "--replace", urn]]
    assert "export: done already" in recovered.stdout  # the loopback "new" VM kept its files: nothing ran again
