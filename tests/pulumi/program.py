"""Run __main__.py under Pulumi's own mocks: no CLI, no provider plugin, no cloud."""

from __future__ import annotations

import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi.runtime
import pulumi.runtime.mocks

PROGRAM = Path(__file__).resolve().parents[2] / "__main__.py"
FAKE_IP = "203.0.113.10"
FAKE_INSTANCE_ID = "4518913456271829501"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJdpTuWTtIyVcSQ6Zr2Vh4ZkD3tEeSz2bV6RIwdNv0s user@laptop"
BASE_CONFIG = {
    "gcp:project": "my-project",
    "gcp:zone": "us-east5-b",
    "tpu-rl:reservation": "my-v6e-reservation",
    "tpu-rl:sshPublicKey": PUBLIC_KEY,
    "tpu-rl:sshSourceRanges": ["100.64.7.0/24"],
}


@dataclass
class Resource:
    type: str
    name: str
    inputs: dict
    options: dict = field(default_factory=dict)  # what the engine is told besides the inputs (replaceOnChanges, ...)


@dataclass
class Stack:
    resources: list[Resource] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str) -> dict:
        (found,) = self.of_type(type_)
        return found.inputs


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self, stack: Stack):
        self.stack = stack

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.stack.resources.append(Resource(args.typ, args.name, dict(args.inputs)))
        outputs = dict(args.inputs)
        if args.typ == "gcp:compute/instance:Instance":
            outputs["networkInterfaces"] = [{"accessConfigs": [{"natIp": FAKE_IP}]}]
            outputs["instanceId"] = FAKE_INSTANCE_ID
        if args.typ == "gcp:container/cluster:Cluster":
            outputs.update(endpoint="203.0.113.20", masterAuth={"clusterCaCertificate": "Q0E="})
        if args.typ == "gcp:serviceaccount/account:Account":
            outputs["email"] = f"{args.inputs['accountId']}@my-project.iam.gserviceaccount.com"
            outputs["name"] = f"projects/my-project/serviceAccounts/{outputs['email']}"  # as the provider gives it
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


OPTIONS = ("replaceOnChanges", "ignoreChanges", "deleteBeforeReplace")


class RecordingMonitor(pulumi.runtime.mocks.MockMonitor):
    """Pulumi's mock monitor, also keeping the resource options of each registration (the mocks see inputs only)."""

    def __init__(self, mocks: RecordingMocks):
        super().__init__(mocks)
        self.stack = mocks.stack

    def RegisterResource(self, request):  # noqa: N802 - the monitor's gRPC name
        answer = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.stack.resources[-1].options = {name: getattr(request, name) for name in OPTIONS}
        return answer


def run_program(config: dict, drop: tuple[str, ...] = (), stack: Stack | None = None, name: str = "dev") -> Stack:
    """Run the program as stack `name` with BASE_CONFIG updated by `config` (minus `drop`), recording into `stack`."""
    merged = {**BASE_CONFIG, **config}
    for key in drop:
        merged.pop(key)
    stack = stack if stack is not None else Stack()
    mocks = RecordingMocks(stack)
    pulumi.runtime.set_mocks(mocks, project="tpu-rl", stack=name, preview=False, monitor=RecordingMonitor(mocks))
    pulumi.runtime.set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in merged.items()})
    exports: dict = {}

    @pulumi.runtime.test
    def program():
        original = pulumi.export
        pulumi.export = lambda name, value: exports.__setitem__(name, value)
        try:
            runpy.run_path(str(PROGRAM))
        finally:
            pulumi.export = original
        return pulumi.Output.all(**exports).apply(stack.outputs.update)

    program()
    return stack
