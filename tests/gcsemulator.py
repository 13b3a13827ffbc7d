"""A real Cloud Storage emulator we did not write (`gcp-storage-emulator`, PyPI), on 127.0.0.1, in memory.

What points at it: STORAGE_EMULATOR_HOST, read by google-cloud-storage (the stand-in jobs, as
MaxText's gcs_utils) and by tpu-rl's own bootstrap/remote/gcs.py (the VM's runner). Emulated:
objects, listings by prefix, uploads and downloads. Not emulated, so unverified here: IAM
(the VM's service account's roles), hierarchical-namespace buckets, preconditions and
generations (orbax's OCDBT relies on them; the stand-ins do not), speed.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUCKET = "tpu-rl-test"
START_SECONDS = 30


@contextmanager
def emulator(log: Path) -> Iterator[str]:
    """The emulator's URL while it runs, with the bucket BUCKET made."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [str(Path(sys.executable).with_name("gcp-storage-emulator")), "start", "--host=127.0.0.1"]
    command += [f"--port={port}", "--in-memory", f"--default-bucket={BUCKET}"]
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_SECONDS
    while "All services started" not in log.read_text():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"gcp-storage-emulator did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)
