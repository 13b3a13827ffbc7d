"""Pulumi.yaml declares every key the program reads; Pulumi.dev.yaml is placeholders, no secret."""

from pathlib import Path

import pytest
import yaml

from infra import settings

from .program import run_program

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


def test_dev_stack_holds_placeholders_that_the_program_refuses():
    config = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]
    assert not any("secure" in str(v) for v in config.values())
    with pytest.raises(
        Exception, match="tpu-rl:sshPublicKey: the key data is not base64 \\(is it still the placeholder\\?\\)"
    ):
        run_program({k: v for k, v in config.items()})
