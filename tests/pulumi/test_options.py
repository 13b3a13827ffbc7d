"""Optional resources, access and the other provisioning models."""

import pytest

from .program import run_program

INSTANCE = "gcp:compute/instance:Instance"
BUCKET = "gcp:storage/bucket:Bucket"
FIREWALL = "gcp:compute/firewall:Firewall"
ACCOUNT = "gcp:serviceaccount/account:Account"
BUCKET_IAM = "gcp:storage/bucketIAMMember:BucketIAMMember"


def test_no_bucket_by_default():
    stack = run_program({})
    assert stack.of_type(BUCKET) == []
    assert stack.of_type(BUCKET_IAM) == []


def test_bucket_when_configured_uniform_and_private():
    stack = run_program({"tpu-rl:resultsBucket": "my-results"})
    bucket = stack.one(BUCKET)
    assert bucket["name"] == "my-results"
    assert bucket["uniformBucketLevelAccess"] is True
    assert bucket["publicAccessPrevention"] == "enforced"
    assert bucket["location"] == "US-EAST5"
    grants = [
        r.inputs for r in stack.of_type(BUCKET_IAM)
    ]  # objects, and storage.buckets.get (MaxText checks the bucket first)
    assert sorted(g["role"] for g in grants) == ["roles/storage.legacyBucketReader", "roles/storage.objectAdmin"]
    assert all(g["bucket"] == "my-results" and g["member"].startswith("serviceAccount:tpu-rl-") for g in grants)
    assert len({g["member"] for g in grants}) == 1  # the VM's own identity, nothing project-wide
    assert stack.outputs["bucket"] == "my-results"


def test_dedicated_service_account_by_default():
    stack = run_program({})
    account = stack.one(ACCOUNT)
    vm = stack.one(INSTANCE)
    assert vm["serviceAccount"]["email"] == f"{account['accountId']}@my-project.iam.gserviceaccount.com"


def test_existing_service_account_creates_none():
    stack = run_program({"tpu-rl:serviceAccountEmail": "sa@p.iam.gserviceaccount.com"})
    assert stack.of_type(ACCOUNT) == []
    assert stack.one(INSTANCE)["serviceAccount"]["email"] == "sa@p.iam.gserviceaccount.com"


def test_firewall_ssh_only_from_configured_ranges_and_only_this_vm():
    stack = run_program({})
    rule = stack.one(FIREWALL)
    assert rule["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert rule["sourceRanges"] == ["100.64.7.0/24"]
    assert rule["targetTags"] == stack.one(INSTANCE)["tags"]


def test_os_login_replaces_ssh_keys():
    vm = run_program({"tpu-rl:osLogin": "true"}, drop=("tpu-rl:sshPublicKey",)).one(INSTANCE)
    assert vm["metadata"]["enable-oslogin"] == "TRUE"
    assert "ssh-keys" not in vm["metadata"]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("STANDARD", {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE", "automaticRestart": True}),
        (
            "SPOT",
            {
                "provisioningModel": "SPOT",
                "onHostMaintenance": "TERMINATE",
                "automaticRestart": False,
                "preemptible": True,
                "instanceTerminationAction": "DELETE",
            },
        ),
    ],
)
def test_other_provisioning_models(model, expected):
    drop = ("tpu-rl:reservation",) if model == "SPOT" else ()
    vm = run_program({"tpu-rl:provisioningModel": model}, drop=drop).one(INSTANCE)
    assert vm["scheduling"] == expected


def test_flex_start_has_max_run_duration_and_no_reservation():
    vm = run_program(
        {"tpu-rl:provisioningModel": "FLEX_START", "tpu-rl:maxRunDurationSeconds": "14400"},
        drop=("tpu-rl:reservation",),
    ).one(INSTANCE)
    assert vm["scheduling"]["maxRunDuration"] == {"seconds": 14400}
    assert vm["scheduling"]["automaticRestart"] is False
    assert "reservationAffinity" not in vm
