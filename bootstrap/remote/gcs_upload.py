"""Copy an exported model folder to Cloud Storage from the VM, then verify it by hash.

    python3 gcs_upload.py FOLDER gs://BUCKET/PREFIX [--by-export] --marker COPIED.json

Uses the VM's gcloud with the VM's service account (which may write the stack's
bucket). The folder is first checked against its SHA256SUMS, and a destination that holds
another export (another SHA256SUMS, or files this one does not have) is refused: a durable
copy is never overwritten. `gcloud storage rsync
--checksums-only` copies what differs by hash, so a re-run carries on and a same-size
object with other contents is replaced. Parallel composite uploads are off, so every
object has the MD5 that Cloud Storage computes on its side; the marker is written only
after each file's MD5 matches the one Cloud Storage reports. With --by-export the copy goes
below PREFIX into a folder named by the export's own hash (of its SHA256SUMS), so a run
exported again is copied beside its first copy, never over it; the marker names the folder.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys

import faults  # beside this script in the VM's tools folder
import manifest

ENV = {"CLOUDSDK_STORAGE_PARALLEL_COMPOSITE_UPLOAD_ENABLED": "False"}


def commands(folder: str, url: str) -> tuple[list[str], list[str]]:
    """The copy and the listing that verifies it."""
    return (
        ["gcloud", "storage", "rsync", "--recursive", "--checksums-only", folder, url],
        ["gcloud", "storage", "objects", "list", f"{url}/**", "--raw", "--format=json"],
    )


def listed_md5(listing: str, url: str) -> dict[str, str]:
    """Relative path -> MD5 (base64, as Cloud Storage reports it) from the raw JSON listing."""
    prefix = url.removeprefix("gs://").partition("/")[2].rstrip("/")
    found = {}
    for item in json.loads(listing or "[]"):
        name = item["name"].removeprefix(f"{prefix}/") if prefix else item["name"]
        found[name] = item.get("md5Hash", "")
    return found


def remote_md5(listing: list[str], url: str) -> dict[str, str]:
    """What is at `url` now, by relative path; nothing yet is an empty folder, not an error."""
    result = subprocess.run(listing, capture_output=True, text=True)
    if result.returncode != 0:
        if "matched no objects" in result.stderr:
            return {}
        raise subprocess.CalledProcessError(result.returncode, listing, result.stdout, result.stderr)
    return listed_md5(result.stdout, url)


def local_md5(path: str) -> str:
    return base64.b64encode(bytes.fromhex(manifest.file_digest(path, "md5"))).decode()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("url")
    parser.add_argument("--marker", required=True)
    parser.add_argument("--by-export", action="store_true", help="copy into PREFIX/<the export's hash>")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    try:
        names = [*manifest.read_verified(args.folder), manifest.NAME]
    except ValueError as err:
        print(f"[tpu-rl] not copying: {err}", flush=True)
        return 1
    if args.by_export:
        url = f"{url}/{manifest.file_digest(os.path.join(args.folder, manifest.NAME))[:12]}"
    copy, listing = commands(args.folder, url)
    ours = {name: local_md5(os.path.join(args.folder, name)) for name in names}
    there = remote_md5(listing, url)
    strangers = {name for name in there if name not in ours and not name.startswith(".") and "/." not in name}
    if there.get(manifest.NAME, ours[manifest.NAME]) != ours[manifest.NAME] or strangers:  # hidden: rsync's own
        print(
            f"[tpu-rl] not copying: {url} holds another export (its {manifest.NAME} or its files differ), and a "
            "durable copy is never overwritten; copy this one elsewhere (another results.gcs prefix or run name)",
            flush=True,
        )
        return 1
    print(f"[tpu-rl] copying {args.folder} to {url}", flush=True)
    subprocess.run(copy, check=True, env={**os.environ, **ENV})
    faults.point("gcs-upload.copied")
    remote = remote_md5(listing, url)
    wrong = [name for name in names if remote.get(name) != ours[name]]
    if wrong:
        print(f"[tpu-rl] verification failed: Cloud Storage's MD5 differs for {', '.join(sorted(wrong))}", flush=True)
        return 1
    total = sum(os.path.getsize(os.path.join(args.folder, name)) for name in names)
    with open(args.marker, "w") as f:
        json.dump({"url": url, "files": len(names), "bytes": total}, f)
    faults.point("gcs-upload.wrote-marker")
    print(f"[tpu-rl] verified {len(names)} files at {url} (MD5 reported by Cloud Storage)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
