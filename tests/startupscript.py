"""bootstrap/startup.sh run for real in a throwaway root of a test's own, with a stand-in apt-get on PATH
(tests/standin/startup): its paths and bounds are set from the environment, as the script allows."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bootstrap.paths import REPO
from tests.loopback import wait_for

SCRIPT = REPO / "bootstrap" / "startup.sh"
STANDINS = REPO / "tests" / "standin" / "startup"


@dataclass
class StartupRoot:
    """Where one run of the script writes: the marker, its failure record and log, and uv, in `root`."""

    root: Path

    @property
    def marker(self) -> Path:
        return self.root / "startup.done"

    @property
    def failed(self) -> Path:
        return self.root / "startup.failed"

    @property
    def log(self) -> Path:
        return self.root / "startup.log"

    @property
    def calls(self) -> list[str]:
        """Each apt-get call the stand-in saw, its arguments on one line."""
        path = self.root / "apt-calls"
        return path.read_text().splitlines() if path.exists() else []

    def with_uv(self, version: str) -> None:
        """A uv of that version already where the script installs it (the install step then keeps it)."""
        uv = self.root / "bin" / "uv"
        uv.parent.mkdir(parents=True, exist_ok=True)
        uv.write_text(f"#!/bin/sh\necho 'uv {version} (stand-in)'\n")
        uv.chmod(0o755)

    def run(self, timeout: float = 300, **knobs: str) -> subprocess.CompletedProcess:
        """The script to its end, then its log to its last line (tee writes it a moment after)."""
        env = {
            **os.environ,
            "PATH": f"{STANDINS}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "TPU_RL_STARTUP_LOG": str(self.log),
            "TPU_RL_STARTUP_MARKER": str(self.marker),
            "TPU_RL_UV_DIR": str(self.root / "bin"),
            "TPU_RL_APT_RETRY_SECONDS": "0",
            "STANDIN_CALLS": str(self.root / "apt-calls"),
            **knobs,
        }
        (self.root / "bin").mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=timeout)
        last = ("done: ", "FAILED at step", "nothing to do")
        wait_for(lambda: self.log.exists() and any(w in self.log.read_text() for w in last), 30, "the startup log")
        return result
