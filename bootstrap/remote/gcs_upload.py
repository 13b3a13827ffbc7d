"""Copy an exported model folder to Cloud Storage from the VM, then verify it.

    python3 gcs_upload.py FOLDER gs://BUCKET/PREFIX --marker COPIED.json

Uses the VM's gcloud with the VM's service account (which may write the stack's
bucket). `gcloud storage rsync` skips what is already there, so a re-run carries
on; the marker is written only after every file is listed with its local size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

LISTING = re.compile(r"^\s*(\d+)\s+\S+\s+(gs://\S+)$")


def commands(folder: str, url: str) -> tuple[list[str], list[str]]:
    """The copy and the listing that verifies it."""
    return (
        ["gcloud", "storage", "rsync", "--recursive", folder, url],
        ["gcloud", "storage", "ls", "--long", "--recursive", f"{url}/**"],
    )


def listed_sizes(listing: str, url: str) -> dict[str, int]:
    """Relative path -> size from `gcloud storage ls --long` output."""
    sizes = {}
    for line in listing.splitlines():
        if m := LISTING.match(line):
            sizes[m[2].removeprefix(url.rstrip("/") + "/")] = int(m[1])
    return sizes


def local_sizes(folder: str) -> dict[str, int]:
    return {
        os.path.relpath(os.path.join(root, name), folder): os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(folder)
        for name in names
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("url")
    parser.add_argument("--marker", required=True)
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    copy, listing = commands(args.folder, url)
    print(f"[tpu-rl] copying {args.folder} to {url}", flush=True)
    subprocess.run(copy, check=True)
    remote = listed_sizes(subprocess.run(listing, check=True, capture_output=True, text=True).stdout, url)
    wanted = local_sizes(args.folder)
    wrong = [p for p, size in wanted.items() if remote.get(p) != size]
    if wrong:
        print(f"[tpu-rl] verification failed for {', '.join(sorted(wrong))}", flush=True)
        return 1
    with open(args.marker, "w") as f:
        json.dump({"url": url, "files": len(wanted), "bytes": sum(wanted.values())}, f)
    print(f"[tpu-rl] verified {len(wanted)} files at {url}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
