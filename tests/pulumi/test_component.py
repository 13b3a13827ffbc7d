"""Existing stacks keep their resources: the component's children alias their old top-level URNs."""

from __future__ import annotations

import pulumi.runtime.mocks

from .program import run_program


def test_children_alias_their_top_level_urns(monkeypatch):
    registered = []
    original = pulumi.runtime.mocks.MockMonitor.RegisterResource

    def record(self, request):
        registered.append(request)
        return original(self, request)

    monkeypatch.setattr(pulumi.runtime.mocks.MockMonitor, "RegisterResource", record)
    run_program({"tpu-rl:resultsBucket": "my-results"})
    children = {r.name: r for r in registered if r.type.startswith("gcp:")}
    assert set(children) == {"results", "vm", "vm-writes-results", "vm-reads-bucket", "ssh", "tpu-vm"}
    (component,) = [r for r in registered if r.type == "tpu-rl:index:TpuVm"]
    for name, request in children.items():
        assert request.parent.endswith("tpu-rl:index:TpuVm::tpu-rl"), name
        # Alias(parent=ROOT_STACK_RESOURCE): the same name and type, directly under the stack, as before.
        assert any(alias.spec.noParent and not alias.spec.name for alias in request.aliases), name
    assert not component.aliases
