"""The TPU VM with what it needs: SSH firewall, its own identity, an optional results bucket.

One component, `tpu-rl:index:TpuVm`, declares the Compute Engine instance of the reference
workload (`gcloud compute instances create --machine-type=ct6e-standard-8t ...`). Its
children keep the names they had when the program declared them at the top level, and
each carries an alias to that old place, so an existing stack is updated, never replaced.
"""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from .settings import PROJECT, Settings, label_value
from .storage import BUCKET_ROLES, results_bucket

STARTUP_SCRIPT = Path(__file__).resolve().parents[1] / "bootstrap" / "startup.sh"
# On a preemption (Spot), each pipeline records it and tells its receivers before the VM is deleted.
SHUTDOWN_SCRIPT = STARTUP_SCRIPT.with_name("shutdown.sh")
BOOT_DISK_TYPE = "hyperdisk-balanced"  # v6e machines take Hyperdisk Balanced or Hyperdisk ML only
# Metadata Compute Engine may write on a TPU VM itself: never removed by the next `pulumi up`.
GCE_METADATA = ("tpu-env", "accelerator-type", "agent-worker-number", "worker-network-endpoints")
# What the instance cannot change in place (the provider would refuse without allow_stopping_for_update, which
# stops the VM and keeps its name): a new machine type or identity is a new VM, made as a replacement.
REPLACED_ON = ("machineType", "serviceAccount")


def scheduling(settings: Settings) -> gcp.compute.InstanceSchedulingArgs:
    """What each provisioning model requires of the instance's scheduling."""
    by_model = {
        # The reference: --provisioning-model=RESERVATION_BOUND --maintenance-policy=TERMINATE
        # --instance-termination-action=DELETE
        "RESERVATION_BOUND": dict(on_host_maintenance="TERMINATE", instance_termination_action="DELETE"),
        "STANDARD": dict(on_host_maintenance="TERMINATE", automatic_restart=True),
        "SPOT": dict(
            on_host_maintenance="TERMINATE",
            instance_termination_action="DELETE",
            automatic_restart=False,
            preemptible=True,
        ),
        "FLEX_START": dict(
            on_host_maintenance="TERMINATE",
            instance_termination_action="DELETE",
            automatic_restart=False,
            max_run_duration=gcp.compute.InstanceSchedulingMaxRunDurationArgs(seconds=settings.max_run_duration_s or 0),
        ),
    }
    return gcp.compute.InstanceSchedulingArgs(
        provisioning_model=settings.provisioning_model, **by_model[settings.provisioning_model]
    )


def metadata(settings: Settings) -> dict[str, str]:
    """All instance metadata (ssh-keys must live here, or the next `pulumi up` drops it).

    Guest attributes let the VM publish its SSH host keys, which `fab` pins before its
    first connection. No secret is ever put here: metadata is readable from the VM.
    """
    entries = {
        "startup-script": STARTUP_SCRIPT.read_text(encoding="utf-8"),
        "shutdown-script": SHUTDOWN_SCRIPT.read_text(encoding="utf-8"),
        "enable-guest-attributes": "TRUE",
    }
    if settings.os_login:
        entries["enable-oslogin"] = "TRUE"
    else:  # said on the instance: a project with OS Login on would otherwise ignore ssh-keys, and fab could not log in
        entries["enable-oslogin"] = "FALSE"
        entries["ssh-keys"] = f"{settings.ssh_user}:{settings.ssh_public_key}"
    return entries


class TpuVm(pulumi.ComponentResource):
    """The VM, its SSH firewall rule, its service account and the optional results bucket."""

    def __init__(self, name: str, settings: Settings, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PROJECT}:index:TpuVm", name, None, opts)
        s = settings
        # Declared at the top level before this component existed: keep those URNs.
        child = pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)])
        labels = {"app": PROJECT, "stack": label_value(pulumi.get_stack()), "instance": s.instance_name}
        network_tag = f"{PROJECT}-{s.instance_name}"

        self.bucket = None
        if s.results_bucket:
            # The VM's /dev/shm is wiped on every restart: exports are copied here.
            self.bucket = results_bucket(s, labels, child)

        if s.service_account_email:
            identity = pulumi.Output.from_input(s.service_account_email)
        else:
            # A dedicated identity with no project roles: it can write to the results bucket
            # (granted below) and nothing else, whatever the cloud-platform scope allows.
            account = gcp.serviceaccount.Account(
                "vm",
                account_id=f"{PROJECT}-{s.instance_name}"[:30].rstrip("-"),
                display_name=f"{PROJECT} TPU VM {s.instance_name}",
                opts=child,
            )
            identity = account.email
        if self.bucket is not None:
            member = identity.apply(lambda email: f"serviceAccount:{email}")
            for name, role in zip(("vm-writes-results", "vm-reads-bucket"), BUCKET_ROLES, strict=True):
                gcp.storage.BucketIAMMember(name, bucket=self.bucket.name, role=role, member=member, opts=child)

        gcp.compute.Firewall(
            "ssh",
            network=s.network,
            direction="INGRESS",
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
            source_ranges=list(s.ssh_source_ranges),
            target_tags=[network_tag],
            description=f"SSH to the {PROJECT} VM {s.instance_name} (managed by Pulumi)",
            opts=child,
        )

        reservation_affinity = None
        if s.reservation:
            reservation_affinity = gcp.compute.InstanceReservationAffinityArgs(
                type="SPECIFIC_RESERVATION",
                specific_reservation=gcp.compute.InstanceReservationAffinitySpecificReservationArgs(
                    key="compute.googleapis.com/reservation-name", values=[s.reservation]
                ),
            )
        self.instance = gcp.compute.Instance(
            "tpu-vm",
            name=s.instance_name,
            zone=s.zone,
            machine_type=s.machine_type,
            boot_disk=gcp.compute.InstanceBootDiskArgs(
                initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                    image=s.image, size=s.boot_disk_gb, type=BOOT_DISK_TYPE, labels=labels
                ),
            ),
            network_interfaces=[
                gcp.compute.InstanceNetworkInterfaceArgs(
                    network=s.network, access_configs=[gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()]
                )
            ],
            scheduling=scheduling(s),
            reservation_affinity=reservation_affinity,
            service_account=gcp.compute.InstanceServiceAccountArgs(email=identity, scopes=["cloud-platform"]),
            metadata=metadata(s),
            tags=[network_tag],
            labels=labels,
            # The name is fixed, so a replacement (`fab train --recover` of a stopped VM, a new machine
            # type) must delete the old instance before it creates the new one.
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    delete_before_replace=True,
                    replace_on_changes=list(REPLACED_ON),
                    ignore_changes=[f'metadata["{key}"]' for key in GCE_METADATA],
                ),
            ),
        )
        self.external_ip = self.instance.network_interfaces[0].access_configs[0].nat_ip
        self.register_outputs({"instance_id": self.instance.instance_id, "external_ip": self.external_ip})
