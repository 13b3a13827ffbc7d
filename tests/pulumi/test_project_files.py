"""Pulumi.yaml declares every key the program reads; Pulumi.dev.yaml is placeholders, no secret."""

from pathlib import Path

import pytest
import yaml

from infra import settings

from .program import PUBLIC_KEY, Stack, run_program

REPO = Path(__file__).resolve().parents[2]


def keys_read_by_program() -> set[str]:
    return {key.removeprefix("tpu-rl:") for key in settings.KEYS if key.startswith("tpu-rl:")}


def test_every_key_the_program_reads_has_a_typed_schema():
    project = yaml.safe_load((REPO / "Pulumi.yaml").read_text())
    assert project["name"] == "tpu-rl"
    schema = project["config"]
    assert keys_read_by_program() == set(schema)
    for key, entry in schema.items():
        assert entry["type"] in ("string", "integer", "boolean", "array"), key
        assert entry["description"], key


def test_local_backend_by_default():
    assert yaml.safe_load((REPO / "Pulumi.yaml").read_text())["backend"]["url"] == "file://~"


@pytest.mark.parametrize(
    ("filled", "refused"),
    [
        ({}, "gcp:project: my-gcp-project is Pulumi.dev.yaml's placeholder"),
        ({"gcp:project": "my-project"}, "tpu-rl:reservation: my-v6e-8-reservation is Pulumi.dev.yaml's placeholder"),
        (
            {"gcp:project": "my-project", "tpu-rl:reservation": "r1"},
            "tpu-rl:sshPublicKey: the key data is not base64 (is it still the placeholder?)",
        ),
        (
            {"gcp:project": "my-project", "tpu-rl:reservation": "r1", "tpu-rl:sshPublicKey": PUBLIC_KEY},
            "tpu-rl:sshSourceRanges: 203.0.113.7/32 is a documentation range (the placeholder?)",
        ),
    ],
)
def test_dev_stacks_every_placeholder_is_refused_before_anything_is_declared(filled, refused):
    """A VM bought with a placeholder would be one nobody can reach: each is refused, in one line, until the user
    has replaced them all."""
    config = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]
    assert not any("secure" in str(v) for v in config.values())
    stack = Stack()
    with pytest.raises(Exception) as raised:
        run_program({**config, **filled}, stack=stack)
    assert str(raised.value).startswith(refused) and "\n" not in str(raised.value) and stack.resources == []
