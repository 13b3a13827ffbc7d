"""Every bad config value stops the program before a resource is declared."""

import pytest

from .program import Stack, run_program

CASES = [
    ({}, ("tpu-rl:reservation",), "tpu-rl:reservation: missing"),
    ({"gcp:zone": "us-west1-a"}, (), "gcp:zone: 'us-west1-a' has no TPU v6e"),
    ({}, ("gcp:zone",), "gcp:zone: missing"),
    ({}, ("gcp:project",), "gcp:project: missing"),
    ({"tpu-rl:bootDiskSizeGb": "50"}, (), "tpu-rl:bootDiskSizeGb: 50 GB is too small"),
    ({"tpu-rl:provisioningModel": "CHEAP"}, (), "tpu-rl:provisioningModel: unknown model 'CHEAP'"),
    ({"tpu-rl:machineType": "n2-standard-8"}, (), "tpu-rl:machineType: 'n2-standard-8' is not a v6e"),
    ({"tpu-rl:sshPublicKey": "not a key"}, (), "tpu-rl:sshPublicKey: not an OpenSSH public key"),
    ({"tpu-rl:sshPublicKey": "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ== x"}, (), "the key data is damaged"),
    ({}, ("tpu-rl:sshPublicKey",), "tpu-rl:sshPublicKey: missing"),
    ({"tpu-rl:provisioningModel": "SPOT"}, (), "tpu-rl:reservation: a SPOT VM cannot consume a reservation"),
    ({"tpu-rl:provisioningModel": "FLEX_START"}, ("tpu-rl:reservation",), "tpu-rl:maxRunDurationSeconds: missing"),
    ({"tpu-rl:sshUser": "Root User"}, (), "tpu-rl:sshUser: 'Root User' is not a valid"),
    ({"tpu-rl:osLogin": "true"}, (), "tpu-rl:sshPublicKey: set together with tpu-rl:osLogin"),
    ({"tpu-rl:sshSourceRange": ["0.0.0.0/0"]}, (), "tpu-rl:sshSourceRange: unknown key"),  # a typo is not ignored
    ({"tpu-rl:sshSourceRanges": []}, (), "tpu-rl:sshSourceRanges: is an empty list"),
    # the job files' 8B GRPO run needs more HBM than 4 or 1 v6e chips hold: refused before any VM is made
    ({"tpu-rl:machineType": "ct6e-standard-4t"}, (), "tpu-rl:machineType: ct6e-standard-4t does not fit the job files"),
    ({"tpu-rl:machineType": "ct6e-standard-1t"}, (), "vm.accelerator: v6e-1 (the stack's tpu-rl:machineType"),
]


@pytest.mark.parametrize(("config", "drop", "message"), CASES, ids=[c[2][:40] for c in CASES])
def test_config_error_names_key_and_fix(config, drop, message):
    stack = Stack()
    with pytest.raises(Exception) as raised:
        run_program(config, drop=drop, stack=stack)
    assert type(raised.value).__name__ == "ConfigError"
    assert stack.resources == []  # stopped before anything was declared
    text = str(raised.value)
    assert message in text
    assert text.count("\n") <= 1  # one line: key, problem, fix
