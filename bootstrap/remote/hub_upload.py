"""Upload an exported model folder to the Hugging Face Hub from the VM, resumably, then verify.

    python hub_upload.py FOLDER REPO_ID --card CARD.md --marker PUBLISHED.json [--private]
        [--evals-from EVALS_DIR --steps N --run RUN] [--publish-if improved|always|PERCENT]

Runs with the MaxText venv's Python (huggingface_hub comes with MaxText). The token
comes from HF_TOKEN in the environment and the Hub from HF_ENDPOINT. One commit per
file, the model card last, so the card never describes weights that are not there yet.
A file counts as on the Hub only when the Hub's own hash of it matches ours: the LFS
SHA-256 for large files (checked against the export's SHA256SUMS), the git blob id for
small ones. So a re-run carries on an interrupted 16 GB upload without sending finished
files again, and still replaces a file of the same size with other contents. The marker is
written only after every file verifies.

The run is judged from its durable eval records (eval_recorder.py: the base model's eval before the first
attempt trained, the final one after the last), never from one attempt's log, which a restart moves
aside and a lost VM loses. The card's eval table and result come from them, and the result goes into
the card's `model-index` metadata (the Hub's own convention, shown on the model's page). With
publish_if: improved, a model is uploaded only if it beats its base model beyond the noise, and beats
the model the repository holds already, as that repository's card says, beyond the noise of both evals.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys

import attempts  # beside this script in the VM's tools folder, as evals and manifest
import evals
import faults
import manifest
from huggingface_hub import EvalResult, HfApi, ModelCard
from huggingface_hub.errors import RepositoryNotFoundError
from huggingface_hub.hf_api import RepoFile

CARD_NAME = "README.md"
DATASET = "openai/gsm8k"
METRIC = "accuracy"
SOURCE = "tpu-rl run "  # the model-index's source name: which run's model the repository holds


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


def judged_by(result: dict) -> tuple[str, str]:
    """The dataset and metric a run's model-index entry names: GSM8K's accuracy, or a task's measure."""
    return (f"tpu-rl-task/{result['task']}", result["measure"]) if result.get("task") else (DATASET, METRIC)


def eval_result(result: dict, run: str, url: str) -> EvalResult:
    """The run's result as the model card's model-index states it: its measure after training on the held-out
    split (GSM8K's accuracy, or the task's measure), with the eval's size and the 95% interval of the change, and the
    run it came from."""
    dataset, metric = judged_by(result)
    return EvalResult(
        task_type="text-generation",
        dataset_type=dataset,
        dataset_name=result["task"] or "GSM8K",
        dataset_config="main" if not result.get("task") else None,
        dataset_split="test",
        metric_type=metric,
        metric_value=round(result["after"], 4 if result["measure"] == evals.MEAN_REWARD else 2),  # a % as the table
        metric_name=f"{evals.measure_name(result)} after training",
        metric_args={
            "problems": result["problems"],
            "before": round(result["before"], 2),
            "interval_95": result["interval"],
        },
        source_name=f"{SOURCE}{run}",
        source_url=url,
    )


def write_card(template: str, results: list[dict], repo: str = "", run: str = "", url: str = "") -> str:
    """The card beside its template, with the eval table's rows and the run's result in place, and the result
    in its model-index metadata (when the run has one)."""
    with open(template) as f:
        text = f.read().replace(evals.CARD_ROWS, evals.card_rows(results))
    card = ModelCard(text.replace(evals.CARD_RESULT, evals.card_result(results)))
    if (result := evals.outcome(results)) is not None and repo:
        card.data.model_name = repo
        card.data.eval_results = [eval_result(result, run, url)]
    path = os.path.join(os.path.dirname(template), CARD_NAME)
    with open(path, "w") as f:
        f.write(str(card))
    faults.point("hub-upload.wrote-card")
    return path


def held_by(api: HfApi, repo: str, judged: tuple[str, str] = (DATASET, METRIC)) -> dict | None:
    """What the repository's model scored by the same measure (`judged`: dataset and metric, GSM8K's accuracy by
    default), as its card's model-index states it ({accuracy, problems, run}); None for a repository that does not
    exist or states none that makes sense (a percentage out of 0-100, a mean reward that is not finite; a count of
    problems that is no positive integer counts as unknown)."""
    try:
        card = api.model_info(repo).card_data
    except (RepositoryNotFoundError, ValueError):  # none, or a card huggingface_hub cannot read: it states nothing
        return None
    sensible = _finite if judged[1] == evals.MEAN_REWARD else _percent
    for item in (card.eval_results if card is not None else None) or []:
        if (item.dataset_type, item.metric_type) == judged and sensible(item.metric_value):
            args = item.metric_args if isinstance(item.metric_args, dict) else {}
            count = args.get("problems")
            problems = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None
            run = (item.source_name or "").removeprefix(SOURCE) if (item.source_name or "").startswith(SOURCE) else ""
            return {"accuracy": float(item.metric_value), "problems": problems, "run": run}
    return None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _percent(value) -> bool:
    """An accuracy a card may state: a finite number from 0 to 100 (a card is anyone's to edit: -2, inf or nan
    state nothing, and hold nothing back)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 100


def not_better(result: dict, there: dict | None, run: str, repo: str) -> str | None:
    """Why this run's model must not replace the one `repo` holds (None: it is better beyond the noise of both
    evals, or the repository holds none, or holds this very run's, an upload carried on)."""
    if there is None or (there["run"] and there["run"] == run):
        return None
    theirs = dict(there, total=there["problems"] or result["problems"])
    if result.get("measure") == evals.MEAN_REWARD:  # its spread is this run's own: the interval of its change
        margin, unit = result["interval"], ""
    else:
        margin = evals.margin_of(result["after"], result["problems"], theirs["accuracy"], theirs["total"])
        unit = "%"
    if result["after"] - theirs["accuracy"] > margin:
        return None
    holder = f"run {there['run']}'s model" if there["run"] else "a model"
    return (
        f"publish_if: improved, and it is not better than what {repo} holds: {holder} scored "
        f"{there['accuracy']:.1f}{unit} on {theirs['total']:,} problems, this run {result['after']:.1f}{unit} on "
        f"{result['problems']:,} (+-{margin:.1f}{' points' if unit else ''})"
    )


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
    parser.add_argument("--evals-from", help="the folder of the run's eval records (eval_recorder.py)")
    parser.add_argument("--steps", type=int, help="the run's steps (an eval at the last one is the Post eval)")
    parser.add_argument("--run", default="", help="the run's name, which the card's model-index names")
    parser.add_argument("--publish-if", default="always", help='results.publish_if: "improved", "always" or a %%')
    args = parser.parse_args(argv)
    records = attempts.read_records(args.evals_from) if args.evals_from else []
    results = attempts.recorded_evals(records, args.steps)
    url = f"{os.environ.get('HF_ENDPOINT') or 'https://huggingface.co'}/{args.repo_id}"
    args.card = write_card(args.card, results, args.repo_id, args.run, url)
    api = HfApi()
    why = evals.held_back(results, args.publish_if)
    if why is None and args.publish_if == "improved":
        result = evals.outcome(results)
        why = not_better(result, held_by(api, args.repo_id, judged_by(result)), args.run, args.repo_id)
    if why:
        hold(args.marker, args.repo_id, why)
        print(f"[tpu-rl] not uploading to {args.repo_id}: {why}", flush=True)
        return 0

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
    todo = sorted(  # the card last: it states the result of weights that are all there
        (p for p, (source, digest) in wanted.items() if not matches(present.get(p), digest, source)),
        key=lambda p: (p == CARD_NAME, sizes[p]),
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
