"""Upload an exported model folder to the Hugging Face Hub from the VM, resumably, then verify.

    python hub_upload.py FOLDER REPO_ID --card CARD.md [--evals-from TRAIN_LOG --steps N] [--private]
        --marker PUBLISHED.json

Runs with the MaxText venv's Python (huggingface_hub comes with MaxText). The token
comes from HF_TOKEN in the environment and the Hub from HF_ENDPOINT. One commit per
file, largest last. A file counts as on the Hub only when the Hub's own hash of it
matches ours: the LFS SHA-256 for large files (checked against the export's
SHA256SUMS), the git blob id for small ones. So a re-run carries on an interrupted
16 GB upload without sending finished files again, and still replaces a file of the
same size with other contents. The marker is written only after every file verifies.
The card's eval table is filled here from the train job's log (evals.py), so the card
says what this export scored even when no laptop watched the run; without that log (on
gke, where train's log stays with its pod) the table says that no results were recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import evals  # beside this script in the VM's tools folder, as manifest
import faults
import manifest
from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoFile

CARD_NAME = "README.md"


def git_blob_id(path: str) -> str:
    """The id git (and the Hub) gives a file's contents: sha1 of `blob <size>\\0<bytes>`."""
    digest = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(manifest.CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def matches(remote: RepoFile | None, sha256: str, source: str) -> bool:
    """Whether the Hub holds exactly this file."""
    if remote is None:
        return False
    if remote.lfs is not None:
        return remote.lfs.sha256 == sha256
    return remote.blob_id == git_blob_id(source)


def remote_files(api: HfApi, repo_id: str) -> dict[str, RepoFile]:
    return {f.path: f for f in api.list_repo_tree(repo_id, recursive=True) if isinstance(f, RepoFile)}


def wanted_files(folder: str, card: str) -> dict[str, tuple[str, str]]:
    """Path in the repo -> (local file, SHA-256): the manifest's files (checked), itself and the model card."""
    wanted = {name: (os.path.join(folder, name), digest) for name, digest in manifest.read_verified(folder).items()}
    for name, source in ((manifest.NAME, os.path.join(folder, manifest.NAME)), (CARD_NAME, card)):
        wanted[name] = (source, manifest.file_digest(source))
    return wanted


def write_card(template: str, results: list[dict]) -> str:
    """The card beside its template, with the eval table's rows and the run's result in place."""
    with open(template) as f:
        text = f.read().replace(evals.CARD_ROWS, evals.card_rows(results))
    text = text.replace(evals.CARD_RESULT, evals.card_result(results))
    card = os.path.join(os.path.dirname(template), CARD_NAME)
    with open(card, "w") as f:
        f.write(text)
    faults.point("hub-upload.wrote-card")
    return card


def hold(marker: str, repo: str, why: str) -> None:
    """The job's marker for a model that results.publish_if keeps off the Hub: the job is done (it decided),
    fab says why and how to publish it anyway, and autostop keeps a VM that is the model's only copy."""
    os.makedirs(os.path.dirname(marker) or ".", exist_ok=True)
    with open(f"{marker}.tmp", "w") as f:
        json.dump({"repo": repo, "held": why}, f)
    os.replace(f"{marker}.tmp", marker)
    faults.point("hub-upload.held")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("repo_id")
    parser.add_argument("--card", required=True)
    parser.add_argument("--marker", required=True)
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--evals-from", help="the train job's log, for the card's eval table")
    parser.add_argument("--steps", type=int, help="the run's steps (an eval at the last one is the Post eval)")
    parser.add_argument("--publish-if", default="always", help='results.publish_if: "improved", "always" or a %%')
    args = parser.parse_args(argv)
    results = evals.from_log(args.evals_from, args.steps) if args.evals_from else []
    args.card = write_card(args.card, results)
    if why := evals.held_back(results, args.publish_if):
        hold(args.marker, args.repo_id, why)
        print(f"[tpu-rl] not uploading to {args.repo_id}: {why}", flush=True)
        return 0

    api = HfApi()
    url = api.create_repo(args.repo_id, private=args.private, exist_ok=True)
    private = api.repo_info(args.repo_id).private  # an existing repo keeps its own visibility
    print(f"[tpu-rl] repository {url} ({'private' if private else 'public'})", flush=True)
    if args.private and not private:
        print(
            f"[tpu-rl] not uploading: {args.repo_id} exists and is public, but results.hub_private is true; "
            "make it private on the Hub (its Settings), or set results.hub_private: false to publish it",
            flush=True,
        )
        return 1
    try:
        wanted = wanted_files(args.folder, args.card)
    except ValueError as err:
        print(f"[tpu-rl] not uploading: {err}", flush=True)
        return 1
    present = remote_files(api, args.repo_id)
    sizes = {name: os.path.getsize(source) for name, (source, _) in wanted.items()}
    todo = sorted(
        (p for p, (source, digest) in wanted.items() if not matches(present.get(p), digest, source)), key=sizes.get
    )
    print(f"[tpu-rl] {len(wanted) - len(todo)} of {len(wanted)} files already on the Hub (hashes match)", flush=True)
    for number, path in enumerate(todo, 1):
        api.upload_file(
            path_or_fileobj=wanted[path][0], path_in_repo=path, repo_id=args.repo_id, commit_message=f"Upload {path}"
        )
        faults.point("hub-upload.uploaded")
        print(f"[tpu-rl] uploaded {number}/{len(todo)} {path} ({sizes[path] / 2**20:.1f} MiB)", flush=True)
    present = remote_files(api, args.repo_id)
    wrong = [p for p, (source, digest) in wanted.items() if not matches(present.get(p), digest, source)]
    if wrong:
        print(f"[tpu-rl] verification failed: the Hub's hashes differ for {', '.join(wrong)}", flush=True)
        return 1
    total = sum(sizes.values())
    os.makedirs(os.path.dirname(args.marker) or ".", exist_ok=True)  # on gke a folder in the bucket, new
    with open(args.marker, "w") as f:
        json.dump({"repo": args.repo_id, "url": str(url), "files": len(wanted), "bytes": total}, f)
    faults.point("hub-upload.wrote-marker")
    print(f"[tpu-rl] verified {len(wanted)} files ({total / 2**30:.2f} GiB, SHA-256) at {url}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
