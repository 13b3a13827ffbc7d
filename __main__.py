"""A reservation-bound Cloud TPU v6e VM for GRPO post-training with MaxText.

Declares the Compute Engine instance of the reference workload (the same as
`gcloud compute instances create --machine-type=ct6e-standard-8t ...`), the SSH
access Fabric needs, an optional GCS bucket for durable results, and the stack
outputs `fab` reads. Every config key is checked before any resource is declared,
so a mistake costs seconds on the laptop instead of a failed `pulumi up`.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

PROJECT = "tpu-rl"
IMAGE = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
# Zones that offer v6e (Cloud TPU "regions and zones"); override with tpu-rl:v6eZones.
V6E_ZONES = [
    "us-central1-b",
    "us-east1-d",
    "us-east5-a",
    "us-east5-b",
    "europe-west4-a",
    "asia-northeast1-b",
    "southamerica-west1-a",
]
# The HF download (~32 GB with original/), the MaxText env with vLLM (~25 GB),
# the OS image and pip/uv caches: below this the convert job runs out of disk.
MIN_BOOT_DISK_GB = 100
PROVISIONING_MODELS = ("RESERVATION_BOUND", "STANDARD", "SPOT", "FLEX_START")
SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)


class ConfigError(Exception):
    """A stack config value that would make `pulumi up` fail or build the wrong VM."""


def fail(key: str, problem: str, fix: str) -> None:
    raise ConfigError(f"{key}: {problem}. {fix}")


def check_public_key(key: str, value: str) -> None:
    """An OpenSSH public key line whose base64 blob really holds the named key type."""
    parts = value.split()
    fix = f'Set it to the one line of your .pub file: pulumi config set {key} "$(cat ~/.ssh/id_ed25519.pub)"'
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        fail(key, f"not an OpenSSH public key (type must be one of {', '.join(SSH_KEY_TYPES[:3])}, ...)", fix)
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except binascii.Error:
        fail(key, "the key data is not base64 (is it still the placeholder?)", fix)
    try:
        (length,) = struct.unpack(">I", blob[:4])
        embedded = blob[4 : 4 + length].decode()
    except (struct.error, UnicodeDecodeError):
        embedded = None
    if embedded != parts[0]:
        fail(key, "the key data is damaged (its base64 blob does not match its type)", fix)


# --- Configuration: read once, checked before anything is declared -------------------

gcp_config = pulumi.Config("gcp")
config = pulumi.Config(PROJECT)

gcp_project = gcp_config.get("project")
zone = gcp_config.get("zone")
instance_name = config.get("instanceName") or "tpu-rl-v6e-8"
machine_type = config.get("machineType") or "ct6e-standard-8t"
image = config.get("image") or IMAGE
boot_disk_gb = config.get_int("bootDiskSizeGb") or 200
provisioning_model = (config.get("provisioningModel") or "RESERVATION_BOUND").upper()
reservation = config.get("reservation")
max_run_duration_s = config.get_int("maxRunDurationSeconds")
ssh_user = config.get("sshUser") or "tpu-rl"
ssh_public_key = (config.get("sshPublicKey") or "").strip()
os_login = config.get_bool("osLogin") or False
ssh_source_ranges = config.get_object("sshSourceRanges") or ["0.0.0.0/0"]
network = config.get("network") or "default"
results_bucket = config.get("resultsBucket")
service_account_email = config.get("serviceAccountEmail")
v6e_zones = config.get_object("v6eZones") or V6E_ZONES

if not gcp_project:
    fail("gcp:project", "missing", "Set it: pulumi config set gcp:project YOUR_PROJECT_ID")
if not zone:
    fail("gcp:zone", "missing", f"Set it to a zone with v6e, e.g. pulumi config set gcp:zone {V6E_ZONES[0]}")
if zone not in v6e_zones:
    fail(
        "gcp:zone",
        f"{zone!r} has no TPU v6e",
        f"Use one of {', '.join(v6e_zones)} (or list new ones in tpu-rl:v6eZones)",
    )
if not re.fullmatch(r"ct6e-standard-(1|4|8)t", machine_type):
    fail("tpu-rl:machineType", f"{machine_type!r} is not a v6e machine type", "Use ct6e-standard-8t (or -4t, -1t)")
if boot_disk_gb < MIN_BOOT_DISK_GB:
    fail(
        "tpu-rl:bootDiskSizeGb",
        f"{boot_disk_gb} GB is too small for the model download and the MaxText environment",
        f"Use at least {MIN_BOOT_DISK_GB} (the reference uses 200)",
    )
if provisioning_model not in PROVISIONING_MODELS:
    fail(
        "tpu-rl:provisioningModel",
        f"unknown model {provisioning_model!r}",
        f"Use one of {', '.join(PROVISIONING_MODELS)}",
    )
if provisioning_model == "RESERVATION_BOUND" and not reservation:
    fail(
        "tpu-rl:reservation",
        "missing; a RESERVATION_BOUND VM must name its reservation",
        "Set it: pulumi config set tpu-rl:reservation YOUR_RESERVATION (or choose another tpu-rl:provisioningModel)",
    )
if reservation and provisioning_model in ("SPOT", "FLEX_START"):
    fail(
        "tpu-rl:reservation",
        f"a {provisioning_model} VM cannot consume a reservation",
        "Remove it: pulumi config rm tpu-rl:reservation",
    )
if provisioning_model == "FLEX_START" and not max_run_duration_s:
    fail(
        "tpu-rl:maxRunDurationSeconds",
        "missing; FLEX_START VMs need a maximum run time",
        "Set it, e.g. pulumi config set tpu-rl:maxRunDurationSeconds 14400",
    )
if os_login and ssh_public_key:
    fail("tpu-rl:sshPublicKey", "set together with tpu-rl:osLogin", "Use one: OS Login manages keys itself")
if not os_login:
    if not ssh_public_key:
        fail(
            "tpu-rl:sshPublicKey",
            "missing; Fabric needs SSH access",
            'Set it: pulumi config set tpu-rl:sshPublicKey "$(cat ~/.ssh/id_ed25519.pub)"',
        )
    check_public_key("tpu-rl:sshPublicKey", ssh_public_key)
if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", ssh_user):
    fail("tpu-rl:sshUser", f"{ssh_user!r} is not a valid Linux user name", "Use lower-case letters, digits, - and _")
if "0.0.0.0/0" in ssh_source_ranges:
    pulumi.log.warn('tpu-rl:sshSourceRanges allows SSH from anywhere; set it to your IP range, e.g. ["203.0.113.7/32"]')

labels = {"app": PROJECT, "stack": pulumi.get_stack(), "instance": instance_name}
network_tag = f"{PROJECT}-{instance_name}"

# --- Scheduling: what each provisioning model requires ---------------------------------

SCHEDULING = {
    # The reference: gcloud --provisioning-model=RESERVATION_BOUND --maintenance-policy=TERMINATE
    # --instance-termination-action=DELETE
    "RESERVATION_BOUND": dict(on_host_maintenance="TERMINATE", instance_termination_action="DELETE"),
    "STANDARD": dict(on_host_maintenance="TERMINATE", automatic_restart=True),
    "SPOT": dict(
        on_host_maintenance="TERMINATE", instance_termination_action="DELETE", automatic_restart=False, preemptible=True
    ),
    "FLEX_START": dict(
        on_host_maintenance="TERMINATE",
        instance_termination_action="DELETE",
        automatic_restart=False,
        max_run_duration=gcp.compute.InstanceSchedulingMaxRunDurationArgs(seconds=max_run_duration_s or 0),
    ),
}
scheduling = gcp.compute.InstanceSchedulingArgs(provisioning_model=provisioning_model, **SCHEDULING[provisioning_model])

reservation_affinity = None
if reservation:
    reservation_affinity = gcp.compute.InstanceReservationAffinityArgs(
        type="SPECIFIC_RESERVATION",
        specific_reservation=gcp.compute.InstanceReservationAffinitySpecificReservationArgs(
            key="compute.googleapis.com/reservation-name", values=[reservation]
        ),
    )

# --- Identity and durable storage --------------------------------------------------------

bucket = None
if results_bucket:
    # The VM's /dev/shm is wiped on every restart: exports are copied here.
    bucket = gcp.storage.Bucket(
        "results",
        name=results_bucket,
        location=zone.rsplit("-", 1)[0].upper(),
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        labels=labels,
    )

if service_account_email:
    vm_identity = pulumi.Output.from_input(service_account_email)
else:
    # A dedicated identity with no project roles: it can write to the results bucket
    # (granted below) and nothing else, whatever the cloud-platform scope allows.
    account = gcp.serviceaccount.Account(
        "vm", account_id=f"{PROJECT}-{instance_name}"[:30].rstrip("-"), display_name=f"{PROJECT} TPU VM {instance_name}"
    )
    vm_identity = account.email
if bucket is not None:
    gcp.storage.BucketIAMMember(
        "vm-writes-results",
        bucket=bucket.name,
        role="roles/storage.objectAdmin",
        member=vm_identity.apply(lambda e: f"serviceAccount:{e}"),
    )

# --- Network access for Fabric -------------------------------------------------------------

gcp.compute.Firewall(
    "ssh",
    network=network,
    direction="INGRESS",
    allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
    source_ranges=ssh_source_ranges,
    target_tags=[network_tag],
    description=f"SSH to the {PROJECT} VM {instance_name} (managed by Pulumi)",
)

# `metadata` owns all instance metadata: ssh-keys must live here or the next `pulumi up` drops it.
metadata = {"startup-script": (Path(__file__).parent / "bootstrap" / "startup.sh").read_text(encoding="utf-8")}
if os_login:
    metadata["enable-oslogin"] = "TRUE"
else:
    metadata["ssh-keys"] = f"{ssh_user}:{ssh_public_key}"

# --- The TPU VM ------------------------------------------------------------------------------

instance = gcp.compute.Instance(
    "tpu-vm",
    name=instance_name,
    zone=zone,
    machine_type=machine_type,
    boot_disk=gcp.compute.InstanceBootDiskArgs(
        initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
            image=image, size=boot_disk_gb, labels=labels
        ),
    ),
    network_interfaces=[
        gcp.compute.InstanceNetworkInterfaceArgs(
            network=network, access_configs=[gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()]
        )
    ],
    scheduling=scheduling,
    reservation_affinity=reservation_affinity,
    service_account=gcp.compute.InstanceServiceAccountArgs(email=vm_identity, scopes=["cloud-platform"]),
    metadata=metadata,
    tags=[network_tag],
    labels=labels,
)

external_ip = instance.network_interfaces[0].access_configs[0].nat_ip

pulumi.export("instance_name", instance.name)
pulumi.export("zone", zone)
pulumi.export("project", gcp_project)
pulumi.export("external_ip", external_ip)
pulumi.export("hosts", external_ip.apply(lambda ip: [ip]))
pulumi.export("ssh_user", ssh_user)
pulumi.export("bucket", bucket.name if bucket is not None else None)
pulumi.export("ssh_command", external_ip.apply(lambda ip: f"ssh {ssh_user}@{ip}"))
