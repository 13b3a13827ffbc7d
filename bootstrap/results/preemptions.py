"""The run's last preemption, as the VM's shutdown script recorded it in the bucket (remote/preempted.py), read
from this machine once the VM is gone: what `fab status` and `fab train` say instead of only "no longer exists".

Read with Google's storage client and this machine's credentials; best effort: without a record, credentials or
a bucket, nothing more is said.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from .. import beside
from ..remote import gcs, notify


def last(folder: str | None) -> dict | None:
    """The latest preemption record in `folder` (a gs:// folder), or None."""
    if not folder or not gcs.is_gcs(folder):
        return None
    bucket, prefix = gcs.split(folder.rstrip("/") + "/")
    try:
        with beside.importing():
            from google.cloud import storage

        blobs = sorted(storage.Client().list_blobs(bucket, prefix=prefix, timeout=15), key=lambda b: b.name)
        return json.loads(blobs[-1].download_as_bytes(timeout=15)) if blobs else None
    except Exception:  # noqa: BLE001 - no credentials, no access, a damaged record: the plain message stands
        return None


def said(found: dict) -> str:
    """`preempted on 2026-12-04 at 14:02 UTC during train (last committed checkpoint: step 30)`: dated, as the
    latest record of the run may be an earlier VM's."""
    when = datetime.fromtimestamp(found["at"], UTC).strftime("on %Y-%m-%d at %H:%M UTC")
    return f"preempted {when} {notify.during(found)}"
