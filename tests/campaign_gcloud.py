"""`gcloud storage` as gcs_upload.py calls it, against the Cloud Storage emulator (the fault campaign's).

    gcloud storage rsync --recursive --checksums-only FOLDER gs://BUCKET/PREFIX
    gcloud storage objects list gs://BUCKET/PREFIX/** --raw --format=json

Through bootstrap/remote/gcs.py, so through the layer and its faults: gcloud retries what may pass itself,
as gcs.py does. rsync sends each file whose MD5 differs from its object's (never deletes); the listing
prints the objects as `--raw` does (name, size, md5Hash), or gcloud's error when none matched.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bootstrap.remote import gcs  # noqa: E402
from tests import campaign_jobs  # noqa: E402


def listing(url: str) -> list[dict]:
    bucket, prefix = gcs.split(url)
    found, page = [], None
    while True:
        query = {"prefix": prefix, **({"pageToken": page} if page else {})}
        answer = gcs._call(f"{gcs._base()}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}", parse=json.loads)
        found += [{k: item.get(k) for k in ("name", "size", "md5Hash")} for item in answer.get("items", [])]
        if not (page := answer.get("nextPageToken")):
            return found


def rsync(folder: str, url: str) -> int:
    ledger = os.environ.get("CAMPAIGN_LEDGER")
    if ledger:  # a second live copy of the copy would show here
        live = open(os.path.join(ledger, "live-gcloud-rsync"), "a")  # noqa: SIM115 - held until the end
        try:
            fcntl.flock(live, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            campaign_jobs.append(ledger, campaign_jobs.VIOLATIONS, {"violation": "two live copies of the copy"})
        campaign_jobs.milestone(ledger, "copying", 0)
    bucket, prefix = gcs.split(url.rstrip("/"))
    there = {item["name"]: item["md5Hash"] for item in listing(f"{url.rstrip('/')}/")}
    for root, _, files in os.walk(folder):
        for file in sorted(files):
            path = os.path.join(root, file)
            name = f"{prefix}/{os.path.relpath(path, folder)}"
            with open(path, "rb") as f:
                data = f.read()
            if there.get(name) != base64.b64encode(hashlib.md5(data).digest()).decode():
                gcs.write(f"gs://{bucket}/{name}", data)
    return 0


def main(argv: list[str]) -> int:
    if argv[:2] == ["storage", "rsync"]:
        return rsync(argv[-2], argv[-1])
    if argv[:3] == ["storage", "objects", "list"]:
        items = listing(argv[3].removesuffix("**"))
        if not items:
            print("ERROR: (gcloud.storage.objects.list) One or more URLs matched no objects.", file=sys.stderr)
            return 1
        print(json.dumps(items))
        return 0
    print(f"the campaign's gcloud has no {' '.join(argv)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
