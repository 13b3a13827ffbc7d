"""The stack's settings from plain dicts (no Pulumi, no mocks): every bad value is one ConfigError naming its key."""

from __future__ import annotations

import base64
import json
import time
import tracemalloc

import pytest

from infra.settings import ConfigError, read

from .program import BASE_CONFIG, PUBLIC_KEY


def raw() -> dict:
    """BASE_CONFIG as pulumi config hands it over: strings, lists as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in BASE_CONFIG.items()}


def case(key: str, value, expect: str) -> tuple[dict, str, str]:
    return ({key: value if isinstance(value, str) or value is None else json.dumps(value)}, key, expect)


T = "tpu-rl:"
CASES = [
    case("gcp:project", None, "missing"),
    case("gcp:project", "My Project", "'My Project' is not a valid name"),
    case("gcp:project", "ab", "is not a valid name"),
    case("gcp:zone", "us-west1-a", "'us-west1-a' has no TPU v6e"),
    case(T + "v6eZones", "us-east5-b", "expected a list of strings"),
    case(T + "v6eZones", [1, 2], "expected a list of strings"),
    case(T + "v6eZones", ["us east"], "'us east' is not a zone name"),
    case(T + "instanceName", "TPU_VM", "'TPU_VM' is not a valid name"),
    case(T + "instanceName", "a" * 64, "is not a valid name"),
    case(T + "instanceName", "vm-", "'vm-' is not a valid name"),
    case(T + "machineType", "n2-standard-8", "'n2-standard-8' is not a v6e machine type"),
    case(T + "image", "projects/x images", "contains white space"),
    case(T + "bootDiskSizeGb", "50", "50 GB is too small"),
    case(T + "bootDiskSizeGb", "-200", "'-200' is not a whole number"),
    case(T + "bootDiskSizeGb", "2e2", "'2e2' is not a whole number"),
    case(T + "bootDiskSizeGb", "99999999999999999999", "is not a whole number from 1 to 65536"),
    case(T + "provisioningModel", "CHEAP", "unknown model 'CHEAP'"),
    case(T + "reservation", "My Reservation", "'My Reservation' is not a valid name"),
    case(T + "maxRunDurationSeconds", "-5", "'-5' is not a whole number"),
    case(T + "maxRunDurationSeconds", "0", "'0' is not a whole number from 1"),
    case(T + "maxRunDurationSeconds", "1.5", "'1.5' is not a whole number"),
    case(T + "sshUser", "Root User", "'Root User' is not a valid name"),
    case(T + "sshUser", "root", "root may not log in over SSH"),
    case(T + "machineType", "ct6e-standard-8t\n", "'ct6e-standard-8t\\n' has white space around it"),
    case(T + "image", "ubuntu-2204", "'ubuntu-2204' is not a Compute Engine image"),
    case(T + "image", "projects/my-project/global/images/../x", "is not a Compute Engine image"),
    case(
        T + "sshPublicKey",
        f"ssh-ed25519 {base64.b64encode(base64.b64decode(PUBLIC_KEY.split()[1])[:-4]).decode()} user@laptop",
        "the key data is not a valid ssh-ed25519 key",
    ),
    case(T + "sshUser", "x" * 40, "is not a valid name"),
    case(T + "sshPublicKey", PUBLIC_KEY + "\n" + PUBLIC_KEY.replace("user@", "other@"), "holds more than one line"),
    case(T + "sshPublicKey", "not a key", "not an OpenSSH public key"),
    case(T + "sshPublicKey", "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ== x", "the key data is damaged"),
    case(T + "osLogin", "maybe", "'maybe' is not true or false"),
    case(T + "sshSourceRanges", [], "is an empty list"),
    case(T + "sshSourceRanges", "100.64.7.0/24", "expected a list of strings"),
    case(T + "sshSourceRanges", ["100.64.7.7/33"], "'100.64.7.7/33' is not a CIDR range"),
    case(T + "sshSourceRanges", ["100.64.7.7/24"], "has host bits set"),
    # what would buy a VM nobody can reach, or fail in GCE
    case(T + "sshSourceRanges", ["203.0.113.7/32"], "203.0.113.7/32 is a documentation range (the placeholder?)"),
    case(T + "sshSourceRanges", ["100.64.7.0/24", "192.0.2.0/25"], "192.0.2.0/25 is a documentation range"),
    case(T + "sshSourceRanges", ["198.51.100.0/24"], "198.51.100.0/24 is a documentation range"),
    case(T + "sshSourceRanges", ["2a00:1450::/32"], "2a00:1450::/32 is an IPv6 range: the VM has no IPv6 address"),
    case(T + "sshSourceRanges", ["::/0"], "::/0 is an IPv6 range"),
    case(T + "sshSourceRanges", ["2001:db8::/32"], "2001:db8::/32 is an IPv6 range"),
    case("gcp:project", "my-gcp-project", "my-gcp-project is Pulumi.dev.yaml's placeholder"),
    case(T + "reservation", "my-v6e-8-reservation", "my-v6e-8-reservation is Pulumi.dev.yaml's placeholder"),
    case(T + "instanceName", "a" * 57, "57 characters: its network tag tpu-rl-NAME would pass GCE's 63"),
    case(T + "sshSourceRanges", ["me"], "'me' is not a CIDR range"),
    case(T + "network", "My Net", "'My Net' is not a valid name"),
    case(T + "resultsBucket", "Results Bucket", "'Results Bucket' is not a valid name"),
    case(T + "resultsBucket", "ab", "'ab' is not a valid name"),
    case(T + "serviceAccountEmail", "me@example.com", "'me@example.com' is not a valid name"),
    case(T + "sshSourceRange", ["0.0.0.0/0"], "unknown key. Did you mean tpu-rl:sshSourceRanges?"),
    case(T + "sshUsr", "me", "unknown key. Did you mean tpu-rl:sshUser?"),
]


@pytest.mark.parametrize(("changes", "key", "expect"), CASES, ids=[f"{c[1]}={str(c[0][c[1]])[:30]}" for c in CASES])
def test_bad_value_is_one_line_naming_the_key(changes, key, expect):
    config = {**raw(), **changes}
    config = {k: v for k, v in config.items() if v is not None}
    tracemalloc.start()
    started = time.process_time()
    with pytest.raises(ConfigError) as raised:
        read(config)
    cpu = time.process_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    message = str(raised.value)
    assert message.startswith(f"{key}: ") and expect in message, message
    assert "\n" not in message
    assert cpu < 2 and peak < 10 << 20


def test_the_longest_instance_name_whose_network_tag_fits_is_taken():
    name = "a" * 56  # tpu-rl-NAME: 63 characters, GCE's most
    assert read({**raw(), T + "instanceName": name}).instance_name == name


def test_a_flex_start_vm_runs_seven_days_at_most():
    flex = {**raw(), T + "provisioningModel": "FLEX_START"}
    flex.pop(T + "reservation", None)
    assert read({**flex, T + "maxRunDurationSeconds": str(7 * 24 * 3600)}).max_run_duration_s == 604800
    with pytest.raises(ConfigError, match="604801 s is more than a flex-start VM may run"):
        read({**flex, T + "maxRunDurationSeconds": "604801"})


def test_image_references_compute_engine_takes():
    for image in (
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
        "projects/my-project/global/images/my-image-1",
        "https://www.googleapis.com/compute/v1/projects/my-project/global/images/my-image-1",
    ):
        assert read({**raw(), T + "image": image}).image == image


@pytest.mark.parametrize(
    ("ranges", "open_to_all"),
    [
        (["0.0.0.0/0"], True),
        (["100.64.7.0/24", "0.0.0.0/0"], True),
        (["0.0.0.0/1", "128.0.0.0/1"], True),
        (["0.0.0.0/1"], False),
        (["100.64.7.0/24", "8.8.8.0/24"], False),
    ],
)
def test_ranges_that_cover_every_address_are_flagged(ranges, open_to_all):
    assert read({**raw(), "tpu-rl:sshSourceRanges": json.dumps(ranges)}).ssh_open_to_all is open_to_all


def test_unset_ranges_mean_open_to_all_with_the_warning():
    config = {k: v for k, v in raw().items() if k != "tpu-rl:sshSourceRanges"}
    settings = read(config)
    assert settings.ssh_source_ranges == ("0.0.0.0/0",) and settings.ssh_open_to_all


def test_values_are_typed():
    settings = read(
        {**raw(), "tpu-rl:bootDiskSizeGb": "300", "tpu-rl:osLogin": "false", "tpu-rl:v6eZones": '["us-east5-b"]'}
    )
    assert settings.boot_disk_gb == 300 and settings.os_login is False and settings.v6e_zones == ("us-east5-b",)
    assert settings.ssh_source_ranges == ("100.64.7.0/24",) and settings.region == "us-east5"
