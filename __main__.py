"""A Cloud TPU v6e for GRPO post-training with MaxText: one VM, or a multi-host slice on GKE.

Reads the stack's settings once and checks all of them before anything is declared
(infra/settings.py), so a mistake costs seconds on the laptop instead of a failed
`pulumi up`; then declares the backend (infra/tpu_vm.py: the reservation-bound VM that
`fab` drives over SSH; infra/gke.py: the cluster that runs the same jobs as JobSets)
and exports what `fab` reads.
"""

from __future__ import annotations

import pulumi

from infra import settings as stack_settings

settings = stack_settings.from_pulumi()
if not settings.gke:
    stack_settings.check_jobs(settings)  # the machine type holds the job files' run: refused before anything is made
pulumi.export("backend", "gke" if settings.gke else "vm")
pulumi.export("zone", settings.zone)
pulumi.export("project", settings.gcp_project)
pulumi.export("provisioning_model", settings.provisioning_model)  # autostop's default; on gke, whether train is Spot

if settings.gke:
    from infra.gke import LOCAL_QUEUE, NAMESPACE, GkeSlice

    gke = GkeSlice("tpu-rl", settings)
    pulumi.export("cluster_name", gke.cluster.name)
    pulumi.export("topology", settings.gke.topology)
    pulumi.export("namespace", NAMESPACE)
    pulumi.export("queue", LOCAL_QUEUE)
    pulumi.export("bucket", gke.bucket.name)
else:
    from infra.tpu_vm import TpuVm

    if settings.provisioning_model == "FLEX_START" and settings.zone not in stack_settings.FLEX_START_ZONES:
        pulumi.log.warn(
            f"gcp:zone {settings.zone} is not one of Google's v6e flex-start zones "
            f"({', '.join(stack_settings.FLEX_START_ZONES)}): the VM may wait in PENDING for capacity that never comes"
        )
    if settings.ssh_open_to_all:
        pulumi.log.warn(
            "tpu-rl:sshSourceRanges allows SSH from every address; set it to your own range, "
            'e.g. pulumi config set --path "tpu-rl:sshSourceRanges[0]" 203.0.113.7/32'
        )
    vm = TpuVm("tpu-rl", settings)
    pulumi.export("instance_name", vm.instance.name)
    pulumi.export("instance_id", vm.instance.instance_id)  # fab pins the VM's host keys under this id
    pulumi.export("instance_urn", vm.instance.urn)  # what `fab train --recover` replaces when the VM is stopped
    pulumi.export("external_ip", vm.external_ip)
    pulumi.export("hosts", vm.external_ip.apply(lambda ip: [ip]))
    pulumi.export("ssh_user", settings.ssh_user)
    pulumi.export("machine_type", settings.machine_type)  # fab's vm.accelerator auto: the chips and their slice
    pulumi.export("bucket", vm.bucket.name if vm.bucket is not None else None)
    pulumi.export("ssh_command", vm.external_ip.apply(lambda ip: f"ssh {settings.ssh_user}@{ip}"))
