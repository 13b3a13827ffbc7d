"""A v6e slice's size from its topology: shared by the Pulumi program and fab (no Pulumi import here)."""

from __future__ import annotations

from dataclasses import dataclass

CHIPS_PER_HOST = 4  # ct6e-standard-4t, the host of every multi-host v6e slice


def chips(topology: str) -> int:
    """4x4 -> 16."""
    rows, columns = map(int, topology.split("x"))
    return rows * columns


def hosts(topology: str) -> int:
    """TPU hosts (node pool nodes, Pathways workers) in the slice: 4x4 -> 4."""
    return chips(topology) // CHIPS_PER_HOST


# One-host v6e VMs (the vm backend), as Compute Engine names them and as libtpu reads their slice
# (docs.cloud.google.com/tpu/docs/v6e: ct6e-standard-1t, -4t and -8t; TPU_ values as the guide sets them for -8t).
HBM_GB_PER_CHIP = 32  # v6e (Trillium): 32 GB of HBM a chip (Cloud TPU v6e documentation)
DEVICE_KIND = "TPU v6 lite"  # JAX's device_kind of a v6e chip, as MaxText's max_utils names it


@dataclass(frozen=True)
class Host:
    """One v6e VM: its accelerator type, its machine type and libtpu's view of its slice."""

    accelerator: str  # v6e-8
    machine_type: str  # ct6e-standard-8t
    topology: str  # 2x4
    chips_per_host_bounds: str  # 2,4,1

    @property
    def chips(self) -> int:
        return chips(self.topology)


HOSTS = {
    host.accelerator: host
    for host in (
        Host("v6e-1", "ct6e-standard-1t", "1x1", "1,1,1"),
        Host("v6e-4", "ct6e-standard-4t", "2x2", "2,2,1"),
        Host("v6e-8", "ct6e-standard-8t", "2x4", "2,4,1"),
    )
}


def of_machine_type(machine_type: str) -> Host | None:
    return next((host for host in HOSTS.values() if host.machine_type == machine_type), None)
