"""The VM matches the reference gcloud command, flag by flag (workload.md section 1)."""

import shutil

import pytest

from bootstrap.paths import REPO
from tests.loopback import edit_yaml

from .program import FAKE_INSTANCE_ID, FAKE_IP, PUBLIC_KEY, run_program

INSTANCE = "gcp:compute/instance:Instance"


@pytest.fixture(scope="module")
def vm() -> dict:
    return run_program({}).one(INSTANCE)


def test_machine_type(vm):
    assert vm["machineType"] == "ct6e-standard-8t"


def test_image_family_from_accelerator_images(vm):
    assert vm["bootDisk"]["initializeParams"]["image"] == (
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
    )


def test_boot_disk_200_gb(vm):
    assert vm["bootDisk"]["initializeParams"]["size"] == 200


def test_maintenance_policy_terminate(vm):
    assert vm["scheduling"]["onHostMaintenance"] == "TERMINATE"


def test_termination_action_delete(vm):
    assert vm["scheduling"]["instanceTerminationAction"] == "DELETE"


def test_provisioning_model_reservation_bound(vm):
    assert vm["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"


def test_specific_reservation_by_name(vm):
    assert vm["reservationAffinity"] == {
        "type": "SPECIFIC_RESERVATION",
        "specificReservation": {
            "key": "compute.googleapis.com/reservation-name",
            "values": ["my-v6e-reservation"],
        },
    }


def test_zone_and_name(vm):
    assert vm["zone"] == "us-east5-b"
    assert vm["name"] == "tpu-rl-v6e-8"


def test_startup_script_in_metadata_from_bootstrap(vm):
    script = vm["metadata"]["startup-script"]
    assert "/var/lib/tpu-rl/startup.done" in script
    assert "git" in script and "uv" in script
    assert "metadataStartupScript" not in vm  # would force a re-create on every change


def test_host_keys_published_as_guest_attributes(vm):
    assert vm["metadata"]["enable-guest-attributes"] == "TRUE"  # fab pins them before connecting


def test_ssh_keys_metadata(vm):
    assert vm["metadata"]["ssh-keys"] == f"tpu-rl:{PUBLIC_KEY}"


def test_config_overrides_machine_disk_image_name(tmp_path, monkeypatch):
    jobs = tmp_path / "jobs"  # a model four v6e chips hold (the shipped 8B run needs eight: test_config_errors)
    shutil.copytree(REPO / "jobs", jobs)
    edit_yaml(jobs / "train.yaml", lambda d: d["args"].update(override_model_config=True, base_emb_dim=1024))
    monkeypatch.setenv("TPU_RL_JOBS", str(jobs))
    vm = run_program(
        {
            "tpu-rl:machineType": "ct6e-standard-4t",
            "tpu-rl:bootDiskSizeGb": "300",
            "tpu-rl:image": "projects/p/global/images/custom",
            "tpu-rl:instanceName": "mine",
        }
    ).one(INSTANCE)
    assert vm["machineType"] == "ct6e-standard-4t"
    assert vm["bootDisk"]["initializeParams"]["size"] == 300
    assert vm["bootDisk"]["initializeParams"]["image"] == "projects/p/global/images/custom"
    assert vm["name"] == "mine"


def test_outputs_for_the_bootstrap():
    outputs = run_program({}).outputs
    assert outputs["hosts"] == [FAKE_IP]
    assert outputs["external_ip"] == FAKE_IP
    assert outputs["ssh_user"] == "tpu-rl"
    assert outputs["ssh_command"] == f"ssh tpu-rl@{FAKE_IP}"
    assert outputs["zone"] == "us-east5-b"
    assert outputs["project"] == "my-project"
    assert outputs["instance_name"] == "tpu-rl-v6e-8"
    assert outputs["instance_id"] == FAKE_INSTANCE_ID
    # what `fab train --recover` passes to `pulumi up --replace` for a stopped VM: the instance itself
    assert outputs["instance_urn"] == "urn:pulumi:dev::tpu-rl::tpu-rl:index:TpuVm$gcp:compute/instance:Instance::tpu-vm"
    assert outputs["bucket"] is None


def test_labels_on_everything_labelable():
    stack = run_program({"tpu-rl:resultsBucket": "my-results"})
    labelled = [r for r in stack.resources if "labels" in r.inputs]
    assert {r.type for r in labelled} >= {INSTANCE, "gcp:storage/bucket:Bucket"}
    for resource in labelled:
        assert resource.inputs["labels"]["app"] == "tpu-rl"
        assert resource.inputs["labels"]["stack"] == "dev"


def test_no_token_reaches_metadata_state_or_outputs(monkeypatch):
    token = "hf_" + "Q" * 34
    monkeypatch.setenv("HF_TOKEN", token)
    stack = run_program({})
    everything = repr([r.inputs for r in stack.resources]) + repr(stack.outputs)
    assert token not in everything
    assert "HF_TOKEN" not in everything
    assert "hf_" not in run_program({}).one(INSTANCE)["metadata"]["startup-script"]
