"""A real Cloud Storage emulator we did not write (`gcp-storage-emulator`, PyPI), on 127.0.0.1, in memory.

What points at it: client_env, read by google-cloud-storage (the stand-in jobs, MaxText's
gcs_utils), gcsfs (epath), tensorstore (orbax's array data) and tpu-rl's own
bootstrap/remote/gcs.py (the VM's runner). Emulated: objects, listings, uploads and downloads;
generations, preconditions and list offsets come from the layer in front of it (gcslayer.py).
Not emulated, so unverified here: IAM (the VM's service account's roles),
hierarchical-namespace buckets, object versioning, speed.
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


def client_env(url: str) -> dict[str, str]:
    """What points every client library at the emulator at `url`: each reads its own variable."""
    return {
        "STORAGE_EMULATOR_HOST": url,
        "FSSPEC_GCS_TOKEN": "anon",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # else each gcsfs call waits 60 s on a gRPC lookup
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
        "NO_GCE_CHECK": "true",
    }


def client(url: str):
    """google-cloud-storage's client for the emulator at `url`, as the tests' own side uses it."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="tpu-rl-test", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
    )


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
