"""fab against the Pulumi stack's VM: a stand-in `pulumi` CLI, the Compute Engine API stand-in, the loopback
sshd; and the VM lost (`lose`, `wipe`), as a new VM finds things.

The stand-in `pulumi` prints the stack's outputs (`stack output --json`) and, for `up`,
records its arguments, then "recreates" the VM: the outputs become the next ones
(`after_up`) and the Compute Engine stand-in learns the new instance; before any `after_up`, it fails as
Compute Engine does when Spot capacity is short.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

from bootstrap.vm import compute as compute_api
from tests import computestub, fabfork
from tests.loopback import REPO, Fab, Runs, write_hub_cache

INSTANCE = "tpu-rl-v6e-8"
PULUMI = """#!{python}
import json, pathlib, sys, urllib.request
here = pathlib.Path(__file__).parent
if sys.argv[1:3] == ["stack", "output"]:
    print((here / "outputs.json").read_text())
elif sys.argv[1:2] == ["up"]:
    with open(here / "up-calls.jsonl", "a") as calls:
        calls.write(json.dumps(sys.argv[1:]) + "\\n")
    if not (here / "after-up.json").exists():  # as Compute Engine answers when no Spot VM is to be had
        sys.exit("error: ZONE_RESOURCE_POOL_EXHAUSTED: not enough resources available to fulfill the request")
    after = json.loads((here / "after-up.json").read_text())
    (here / "outputs.json").write_text(json.dumps(after["outputs"]))
    body = json.dumps(after["instance"]).encode()
    urllib.request.urlopen(urllib.request.Request(after["control"], data=body, method="PUT"))
    print("Updating (dev): 1 created")
else:
    sys.exit(f"pulumi stand-in: unexpected {{sys.argv[1:]}}")
"""


class Stack(Runs):
    """fab without -H: the VM from the stack's outputs, its keys and state from the Compute API stand-in."""

    def __init__(self, fab: Fab, compute: computestub.Compute, instance_id: str = "1001"):
        self.fab, self.compute = fab, compute
        self.bin = fab.tmp / "pulumi-bin"
        self.bin.mkdir(exist_ok=True)
        self.pins = fab.tmp / "pins" / "known_hosts"
        script = self.bin / "pulumi"
        script.write_text(PULUMI.format(python=sys.executable))
        script.chmod(0o755)
        self.recreate(instance_id)

    def outputs_for(self, instance_id: str, port: int | None = None) -> dict:
        return {
            "backend": "vm",
            "hosts": [f"127.0.0.1:{port or self.fab.host.port}"],
            "ssh_user": self.fab.host.user,
            "instance_id": instance_id,
            "instance_name": INSTANCE,
            "instance_urn": "urn:pulumi:dev::tpu-rl::tpu-rl:index:TpuVm$gcp:compute/instance:Instance::tpu-vm",
            "project": "my-project",
            "zone": "us-east5-b",
        }

    def recreate(self, instance_id: str) -> None:
        """A new VM under the stack, running."""
        self.outputs(self.outputs_for(instance_id))
        self.compute.instances[INSTANCE] = {"id": instance_id, "status": "RUNNING"}

    def unreachable(self, instance_id: str) -> None:
        """The stack's outputs still name the old VM, at an address where nothing answers any more."""
        self.outputs(self.outputs_for(instance_id, port=closed_port()))

    def outputs(self, outputs: dict) -> None:
        """What `pulumi stack output --json` prints."""
        (self.bin / "outputs.json").write_text(json.dumps(outputs))

    def after_up(self, instance_id: str) -> None:
        """What the stand-in `pulumi up` makes: a running VM with this id at the loopback host."""
        after = {
            "outputs": self.outputs_for(instance_id),
            "instance": {"id": instance_id, "status": "RUNNING"},
            "control": f"{self.compute.url}/stub/instances/{INSTANCE}",
        }
        (self.bin / "after-up.json").write_text(json.dumps(after))

    def up_calls(self) -> list[list[str]]:
        calls = self.bin / "up-calls.jsonl"
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    def env(self) -> dict[str, str]:
        return {
            **self.fab.env(),
            "PATH": f"{self.bin}:{self.fab.env()['PATH']}",
            compute_api.COMPUTE_API_ENV: self.compute.url,
            "TPU_RL_KNOWN_HOSTS": str(self.pins),
        }

    def command(self, *args: str) -> list[str]:
        return [fabfork.FAB, "-r", str(REPO), "-i", str(self.fab.host.key), *args]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lose(fab: Fab) -> None:
    """The VM is gone at once: its driver, runners and jobs die without a word."""
    state = fab.tmp / "state"
    records = [state / "pipeline" / "driver.json", *state.glob("**/runner.json"), *state.glob("**/process.json")]
    for record in records:
        pid = json.loads(record.read_text())["pid"]
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def wipe(fab: Fab) -> None:
    """What a new VM does not have: the state folder, /dev/shm, the environment and the Hugging Face cache."""
    for folder in ("state", "shm", "venv", "hf_home"):
        shutil.rmtree(fab.tmp / folder, ignore_errors=True)
    write_hub_cache(fab.tmp / "hf_home")  # what the Hub serves a new VM's prefetch (offline here)


def drop_connections(fab: Fab) -> None:
    """Every SSH connection to the loopback "VM" breaks at once, as a deleted VM's do: its sshd's children die."""
    listener = (fab.host.key.parent / "sshd.pid").read_text().strip()
    children = subprocess.run(["pgrep", "-P", listener], capture_output=True, text=True).stdout.split()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
