"""Where the project keeps things on the user's machine (overridable for tests and CI)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS_ENV, RUNS_ENV = "TPU_RL_JOBS", "TPU_RL_RUNS"


def jobs_dir() -> Path:
    """The pipeline and its jobs: TPU_RL_JOBS, or jobs/ of this repository."""
    return Path(os.environ.get(JOBS_ENV) or REPO / "jobs")


def runs_dir() -> Path:
    """Local records of runs (rendered jobs, durations, metrics): TPU_RL_RUNS, or runs/."""
    return Path(os.environ.get(RUNS_ENV) or REPO / "runs")


def pinned_host_keys() -> Path:
    """The stack VM's SSH host keys as pinned from the Compute Engine API: TPU_RL_KNOWN_HOSTS, or .tpu-rl/known_hosts."""
    return Path(os.environ.get("TPU_RL_KNOWN_HOSTS") or REPO / ".tpu-rl" / "known_hosts")
