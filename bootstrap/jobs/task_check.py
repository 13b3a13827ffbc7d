"""A task of your own, checked on this machine in seconds, before anything is started or paid for.

Its splits are read (each must have rows, each sampled row the fields its prompt needs), then its reward functions
(and its processor) are called on a few rows with sample completions in a process of their own (task_probe.py), with
no secret in its environment: one line for each fault, naming the file, the function and the row. A task that passed
is remembered by its digest (the runs folder's `.tasks-checked`): the next command checks it in no time. A split of a
Hugging Face dataset or of a bucket is read from there by `fab train` (it contacts them anyway), not by `fab plan`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..errors import Problem, UserError
from ..paths import runs_dir
from .task import Task, placeholders

SAMPLE = 4  # rows of each split the rewards are called on
PROBE = Path(__file__).with_name("task_probe.py")
PROBE_SECONDS = 60  # the user's code on a few rows: longer is a reward that hangs
MEMO = ".tasks-checked"
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TMPDIR")  # what the probe's process gets of this one's environment: no secret


def check(task: Task, remote: bool = False) -> dict[str, float]:
    """Check a task of your own (`remote`: its Hub or bucket splits too, which `fab plan` leaves to `fab train`);
    UserError with every fault, one line each. Returns each reward function's seconds a completion (the estimate's)."""
    if task.builtin:
        return {}
    memo = _remembered()
    if task.digest in memo:
        return memo[task.digest]
    where = f"jobs/tasks/{task.name}.yaml"
    rows, problems = {}, []
    for split in ("train", "test"):
        try:
            rows[split] = sample(task, split, remote)
        except UserError as err:
            problems += err.problems
    for split, found in rows.items():
        problems += [Problem(_source(task, split), "rows", why) for why in field_faults(task, found)]
    if problems:
        raise UserError(problems)
    picked = rows.get("test") or rows.get("train")
    if picked is None:  # a Hub or bucket split: fab train reads it
        return {}
    seconds = probe(task, picked, where)
    _remember(task.digest, seconds)
    return seconds


def sample(task: Task, split: str, remote: bool) -> list[dict] | None:
    """The first rows of a split (None: not read here); UserError naming the file when it cannot be read or is
    empty."""
    data = task.spec.data
    source = getattr(data, split)
    if data.hub or source.startswith("gs://"):
        return _remote_rows(task, split) if remote else None
    path = task.local(source)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    rows = []
    with path.open(errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                why = "is not JSON (a JSONL file: one object a line)"
                raise UserError(Problem(f"{path}:{number}", "rows", why)) from None
            if not isinstance(row, dict):
                raise UserError(Problem(f"{path}:{number}", "rows", "is not a JSON object (a row: {field: value})"))
            rows.append(row)
            if len(rows) >= SAMPLE:
                break
    if not rows:
        raise UserError(Problem(str(path), "rows", f"the {split} split has no rows"))
    return rows


def _parquet_rows(path: Path) -> list[dict] | None:
    """A Parquet file's first rows where pyarrow is installed here; its magic bytes at least where it is not."""
    data = path.read_bytes()
    if len(data) < 8 or data[:4] != b"PAR1" or data[-4:] != b"PAR1":
        raise UserError(Problem(str(path), "rows", "is not a Parquet file (no PAR1 at its start and end)"))
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None  # the VM's environment reads it; here only its form was checked
    table = pq.read_table(path)
    if table.num_rows == 0:
        raise UserError(Problem(str(path), "rows", "has no rows"))
    return table.slice(0, SAMPLE).to_pylist()


def _remote_rows(task: Task, split: str) -> list[dict]:
    """The first rows of a Hub dataset's split (the Hub's dataset viewer) or of a bucket's JSONL file."""
    data = task.spec.data
    source = getattr(data, split)
    try:
        if data.hub:
            from huggingface_hub import get_session  # the Hub's own session: its endpoint and headers

            from .. import secrets

            config = data.subset or "default"
            url = f"https://datasets-server.huggingface.co/first-rows?dataset={data.hub}&config={config}&split={source}"
            token = secrets.lookup("HF_TOKEN")
            answer = get_session().get(url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=30)
            answer.raise_for_status()
            rows = [item["row"] for item in answer.json().get("rows", [])][:SAMPLE]
        else:
            from ..remote import gcs

            if source.endswith(".parquet"):
                return []
            text = (gcs.read(source) or b"").decode(errors="replace")
            rows = [json.loads(line) for line in text.splitlines()[: SAMPLE * 4] if line.strip()][:SAMPLE]
    except Exception as err:  # noqa: BLE001 - any failure to read it is the answer: said in one line
        why = f"{source} cannot be read ({err})"
        raise UserError(Problem(f"jobs/tasks/{task.name}.yaml", f"data.{split}", why)) from None
    if not rows:
        raise UserError(Problem(f"jobs/tasks/{task.name}.yaml", f"data.{split}", f"{source}: the split has no rows"))
    return rows


CHAT_TOKENS = 30  # what Llama 3.1's chat template adds around one user message (its headers and dates)
SIZED_ROWS = 64  # rows of the train split whose prompts are counted


def prompt_tokens(task: Task, base_model: str | None) -> tuple[list[int], str]:
    """The tokens of the first rows' prompts as train sees them (the template filled, the chat template around it),
    counted with the base model's own tokenizer where this machine's Hugging Face cache has it (fab token fetches
    it), else a quarter of their characters; and which of the two. Empty for GSM8K and rows not read here."""
    if task.builtin or not task.spec.prompt or task.spec.data.hub or task.spec.data.train.startswith("gs://"):
        return [], ""
    path, texts = task.local(task.spec.data.train), []
    if path.suffix != ".parquet":
        with path.open(errors="replace") as f:
            for line in f:
                try:
                    texts.append(task.spec.prompt.format(**json.loads(line)))
                except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                    continue
                if len(texts) >= SIZED_ROWS:
                    break
    tokenizer = _tokenizer(base_model) if texts else None
    if tokenizer is None:
        return [len(text) // 4 + CHAT_TOKENS for text in texts], "a quarter of their characters (no tokenizer here)"
    return [len(tokenizer.encode(text).ids) + CHAT_TOKENS for text in texts], f"{base_model}'s tokenizer"


def size_notes(plan) -> list[str]:
    """fab plan's lines on the task's prompts: their tokens, and how many MaxText would drop as too long (it leaves
    out every prompt above max_prefill_predict_length, and the run has that many fewer rows)."""
    counts, how = prompt_tokens(plan.task, plan.base_model)
    if not counts:
        return []
    argv = next(job.argv for job in plan.rendered if job.progress)
    limit = int(next((a.split("=", 1)[1] for a in argv if a.startswith("max_prefill_predict_length=")), "256"))
    longer = sum(count > limit for count in counts)
    line = f"prompts:  {min(counts)}-{max(counts)} tokens ({how}, {len(counts)} rows of {plan.task.spec.data.train})"
    if longer:
        line += f"; {longer} longer than max_prefill_predict_length {limit}: MaxText drops those rows (raise it)"
    return [line]


def _tokenizer(base_model: str | None):
    """The base model's tokenizer from this machine's Hugging Face cache (never fetched here: fab plan is offline)."""
    if not base_model:
        return None
    from huggingface_hub import try_to_load_from_cache
    from tokenizers import Tokenizer

    path = try_to_load_from_cache(base_model, "tokenizer.json")
    return Tokenizer.from_file(path) if isinstance(path, str) else None


def field_faults(task: Task, rows: list[dict] | None) -> list[str]:
    """Each sampled row that lacks a field the prompt template or the rewards read."""
    faults = []
    needed = [*placeholders(task.spec.prompt or ""), task.spec.answer] if task.spec.prompt else []
    for number, row in enumerate(rows or [], 1):
        if missing := [name for name in dict.fromkeys(needed) if name not in row]:
            faults.append(f"row {number} has no field {', '.join(map(repr, missing))} (it has {', '.join(row)})")
            continue
        if task.spec.prompt:
            try:
                task.spec.prompt.format(**row)
            except (KeyError, IndexError, ValueError) as err:
                faults.append(f"row {number}: the prompt template cannot be filled ({type(err).__name__}: {err})")
    return faults


def probe(task: Task, rows: list[dict], where: str) -> dict[str, float]:
    """The rewards (and processor) called on `rows` in a process of their own; UserError naming each fault."""
    spec = task.spec
    request = {
        "rewards": str(task.local(spec.rewards.file)),
        "functions": list(spec.rewards.functions),
        "processor": str(task.local(spec.processor)) if spec.processor else None,
        "rows": [
            {
                "prompt": spec.prompt.format(**row) if spec.prompt else json.dumps(row, default=str),
                "answer": str(row.get(spec.answer, "")),
                "row": row,
            }
            for row in rows
        ],  # fmt: skip
    }
    env = {name: os.environ[name] for name in KEPT_ENV if name in os.environ}
    try:
        done = subprocess.run(
            [sys.executable, "-I", str(PROBE), json.dumps(request, default=str)],
            capture_output=True, text=True, timeout=PROBE_SECONDS, env=env, cwd=task.folder, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UserError(
            Problem(
                str(task.local(spec.rewards.file)),
                "rewards",
                f"did not end within {PROBE_SECONDS} s on {len(rows)} rows",
            )
        ) from None
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UserError(Problem(where, "rewards", f"could not be checked: {done.stderr.strip()[-300:]}")) from None
    rewards = str(task.local(spec.rewards.file))
    if (imported := found["import"]) is not None:
        if imported.get("missing"):  # a package the VM's environment holds: its functions are called there
            print(
                f"note: {rewards} imports {imported['missing']}, not installed here: checked on the VM", file=sys.stderr
            )
            return {}
        raise UserError(Problem(rewards, "rewards", f"cannot be imported: {imported['error']}"))
    problems = [
        Problem(rewards, name, result["fault"]) for name, result in found["functions"].items() if result["fault"]
    ]
    if found["processor"]:
        problems.append(Problem(str(task.local(spec.processor)), "processor", found["processor"]))
    if problems:
        raise UserError(problems)
    return {name: result["seconds"] for name, result in found["functions"].items()}


def _source(task: Task, split: str) -> str:
    source = getattr(task.spec.data, split)
    return source if task.spec.data.hub or source.startswith("gs://") else str(task.local(source))


def remembered(task: Task) -> dict[str, float]:
    """Each reward function's seconds a completion, as the task's last check here measured them (none unchecked)."""
    return {} if task.builtin else _remembered().get(task.digest, {})


def _remembered() -> dict[str, dict[str, float]]:
    try:
        found = json.loads((runs_dir() / MEMO).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _remember(digest: str, seconds: dict[str, float]) -> None:
    """Best effort: a memo that cannot be written only checks again next time."""
    memo = {**_remembered(), digest: seconds}
    try:
        runs_dir().mkdir(parents=True, exist_ok=True)
        (runs_dir() / MEMO).write_text(json.dumps(dict(list(memo.items())[-32:])))
    except OSError:
        pass
