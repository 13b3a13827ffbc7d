"""A reservation-bound Cloud TPU v6e VM for GRPO post-training with MaxText.

Reads the stack's settings once and checks all of them before anything is declared
(infra/settings.py), so a mistake costs seconds on the laptop instead of a failed
`pulumi up`; then declares the VM with its SSH access, identity and optional results
bucket (infra/tpu_vm.py) and exports what `fab` reads.
"""

from __future__ import annotations

import pulumi

from infra import settings as stack_settings
from infra.tpu_vm import TpuVm

settings = stack_settings.from_pulumi()
if settings.ssh_open_to_all:
    pulumi.log.warn(
        "tpu-rl:sshSourceRanges allows SSH from every address; set it to your own range, "
        'e.g. pulumi config set --path "tpu-rl:sshSourceRanges[0]" 203.0.113.7/32'
    )

vm = TpuVm("tpu-rl", settings)

pulumi.export("instance_name", vm.instance.name)
pulumi.export("instance_id", vm.instance.instance_id)  # fab pins the VM's host keys under this id
pulumi.export("zone", settings.zone)
pulumi.export("project", settings.gcp_project)
pulumi.export("external_ip", vm.external_ip)
pulumi.export("hosts", vm.external_ip.apply(lambda ip: [ip]))
pulumi.export("ssh_user", settings.ssh_user)
pulumi.export("bucket", vm.bucket.name if vm.bucket is not None else None)
pulumi.export("ssh_command", vm.external_ip.apply(lambda ip: f"ssh {settings.ssh_user}@{ip}"))
