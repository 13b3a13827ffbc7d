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


def test_the_shutdown_script_records_a_preemption_before_the_vm_goes(vm):
    """Compute Engine runs it for about 30 s before deleting a preempted Spot VM (tests/unit/test_preempted.py
    runs it)."""
    script = vm["metadata"]["shutdown-script"]
    assert script == (REPO / "bootstrap" / "shutdown.sh").read_text()
    assert "instance/preempted" in script and "preempted.py" in script


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


def test_ssh_keys_come_with_os_login_said_off_on_the_instance(vm):
    """A project with OS Login on ignores ssh-keys unless the instance says otherwise: fab could not log in."""
    assert vm["metadata"]["enable-oslogin"] == "FALSE" and vm["metadata"]["ssh-keys"].startswith("tpu-rl:ssh-ed25519 ")


def test_the_boot_disk_is_one_a_v6e_takes(vm):
    assert vm["bootDisk"]["initializeParams"]["type"] == "hyperdisk-balanced"


def test_a_new_machine_type_or_identity_replaces_the_vm_and_gces_own_metadata_is_kept():
    """In place, the provider would refuse both without allow_stopping_for_update; the program means a new VM. Keys
    Compute Engine may write on a TPU VM are never removed by the next pulumi up."""
    (instance,) = run_program({}).of_type(INSTANCE)
    assert set(instance.options["replaceOnChanges"]) == {"machineType", "serviceAccount"}
    assert instance.options["deleteBeforeReplace"] is True  # its name is fixed
    assert set(instance.options["ignoreChanges"]) == {
        f'metadata["{key}"]'
        for key in ("tpu-env", "accelerator-type", "agent-worker-number", "worker-network-endpoints")
    }


def test_a_stack_name_gce_refuses_as_a_label_is_cleaned():
    (instance,) = run_program({}, name="Dev.Team").of_type(INSTANCE)
    assert instance.inputs["labels"]["stack"] == "dev-team"


@pytest.mark.parametrize(("zone", "warned"), [("us-east5-a", False), ("us-east5-b", True)])
def test_flex_start_outside_googles_flex_start_zones_is_warned(zone, warned, monkeypatch):
    said = []
    monkeypatch.setattr("pulumi.log.warn", lambda text, *args, **kwargs: said.append(text))
    run_program({"gcp:zone": zone, "tpu-rl:provisioningModel": "FLEX_START", "tpu-rl:maxRunDurationSeconds": "14400"},
                drop=("tpu-rl:reservation",))  # fmt: skip
    flex = [line for line in said if "flex-start zones" in line]
    assert bool(flex) is warned and (not warned or "asia-northeast1-b, us-east5-a" in flex[0])
