"""Upload an exported model folder to the Hugging Face Hub from the VM, resumably, then verify.

    python hub_upload.py FOLDER REPO_ID --card CARD.md [--private] --marker PUBLISHED.json

Runs with the MaxText venv's Python (huggingface_hub comes with MaxText). The token
comes from HF_TOKEN in the environment and the Hub from HF_ENDPOINT. One commit per
file, largest last: a re-run skips every file the repo already holds at the same
size, so an interrupted 16 GB upload carries on instead of starting over. The marker
is written only after the repo's file list and sizes match the folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoFile

CARD_NAME = "README.md"


def local_files(folder: str) -> dict[str, int]:
    files = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, folder)] = os.path.getsize(path)
    return files


def remote_files(api: HfApi, repo_id: str) -> dict[str, int]:
    return {f.path: f.size for f in api.list_repo_tree(repo_id, recursive=True) if isinstance(f, RepoFile)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("repo_id")
    parser.add_argument("--card", required=True)
    parser.add_argument("--marker", required=True)
    parser.add_argument("--private", action="store_true")
    args = parser.parse_args(argv)

    api = HfApi()
    url = api.create_repo(args.repo_id, private=args.private, exist_ok=True)
    print(f"[tpu-rl] repository {url} ({'private' if args.private else 'public'})", flush=True)
    wanted = {**local_files(args.folder), CARD_NAME: os.path.getsize(args.card)}
    present = remote_files(api, args.repo_id)
    todo = sorted((p for p in wanted if present.get(p) != wanted[p]), key=wanted.get)
    print(f"[tpu-rl] {len(wanted) - len(todo)} of {len(wanted)} files already on the Hub", flush=True)
    for number, path in enumerate(todo, 1):
        source = args.card if path == CARD_NAME else os.path.join(args.folder, path)
        api.upload_file(
            path_or_fileobj=source, path_in_repo=path, repo_id=args.repo_id, commit_message=f"Upload {path}"
        )
        print(f"[tpu-rl] uploaded {number}/{len(todo)} {path} ({wanted[path] / 2**20:.1f} MiB)", flush=True)
    present = remote_files(api, args.repo_id)
    wrong = [p for p, size in wanted.items() if present.get(p) != size]
    if wrong:
        print(f"[tpu-rl] verification failed: the Hub has other sizes for {', '.join(wrong)}", flush=True)
        return 1
    with open(args.marker, "w") as f:
        json.dump({"repo": args.repo_id, "url": str(url), "files": len(wanted), "bytes": sum(wanted.values())}, f)
    print(f"[tpu-rl] verified {len(wanted)} files ({sum(wanted.values()) / 2**30:.2f} GiB) at {url}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
