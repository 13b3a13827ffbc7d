"""A v6e slice's size from its topology: shared by the Pulumi program and fab (no Pulumi import here)."""

from __future__ import annotations

CHIPS_PER_HOST = 4  # ct6e-standard-4t, the host of every multi-host v6e slice


def chips(topology: str) -> int:
    """4x4 -> 16."""
    rows, columns = map(int, topology.split("x"))
    return rows * columns


def hosts(topology: str) -> int:
    """TPU hosts (node pool nodes, Pathways workers) in the slice: 4x4 -> 4."""
    return chips(topology) // CHIPS_PER_HOST
