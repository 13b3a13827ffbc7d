"""The task GRPO learns: its data, how a row becomes a prompt, its rewards, and the measure that judges the run.

jobs/pipeline.yaml names one (`task: NAME`, the file jobs/tasks/NAME.yaml; its own files beside it, in
jobs/tasks/). GSM8K, with MaxText's own data, prompt, rewards and accuracy, is `builtin: gsm8k`, the default. A task
of your own goes to MaxText 0.2.5 through its hooks: the rows through tpu-rl's processor (remote/task_processor.py:
your template, or your own processor file), your reward functions through tpu-rl's wrapper
(remote/task_rewards.py), which also keeps the measure of each eval. Its files travel with the run into a folder
named by their digest: another reward is another folder, and the run says so (tasks/sessions.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from ..remote.jobrunner import Layout
from .spec import Strict

TASKS = "tasks"  # jobs/tasks/NAME.yaml, and the VM's state folder's tasks/NAME-DIGEST/
TASK_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
MEAN_REWARD = "mean_reward"  # the measure: the mean of the rewards' sum over the held-out completions
DATA_FORMATS = (".jsonl", ".json", ".parquet")
TASK_ENV = "TPU_RL_TASK"  # train's: the task's folder on the VM (task.json in it)
SPEC_FILE = "task.json"  # what the VM's processor and reward wrapper read
TOOLS = ("task_processor.py", "task_rewards.py")
LEAST_MAXTEXT = (0, 2, 5)  # reward_functions_path: MaxText's first release that takes rewards of your own

GSM8K_NAME = "gsm8k"  # the default task: MaxText's own data, prompt, rewards and accuracy
TaskName = Annotated[str, StringConstraints(pattern=TASK_NAME)]
Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER)]


class DataSpec(Strict):
    """Where the rows come from: two files of this folder (JSONL or Parquet) or of a bucket (gs://), or two splits of
    a Hugging Face dataset (`hub`, with its `subset`)."""

    train: str = Field(min_length=1)
    test: str = Field(min_length=1)
    hub: str = ""
    subset: str = ""


class RewardsSpec(Strict):
    """A Python file of this folder and the functions of it that score each completion (summed, as MaxText does)."""

    file: str = Field(min_length=1)
    functions: list[Identifier] = Field(min_length=1)


class TaskSpec(Strict):
    description: str = ""
    builtin: Literal["gsm8k"] | None = None
    data: DataSpec | None = None
    prompt: str | None = None  # a row's fields in {braces}: the user's message, as the chat template wraps it
    processor: str | None = None  # or a file of this folder with MaxText's process_data(...)
    answer: str = "answer"  # the row's field the rewards get as `answer`
    rewards: RewardsSpec | None = None
    measure: str = MEAN_REWARD  # a reward function (a completion is right when it gives 1 or more), or mean_reward

    @model_validator(mode="after")
    def _whole(self) -> TaskSpec:
        if self.builtin:
            if self.data or self.rewards or self.prompt or self.processor:
                raise ValueError("a builtin task takes no data, prompt, processor or rewards of its own")
            return self
        if self.data is None or self.rewards is None:
            raise ValueError("a task needs data (train, test) and rewards (file, functions), or builtin: gsm8k")
        if (self.prompt is None) == (self.processor is None):
            raise ValueError("give one of prompt (a template of a row's fields) or processor (a file)")
        if self.measure != MEAN_REWARD and self.measure not in self.rewards.functions:
            raise ValueError(f"measure {self.measure!r} is neither mean_reward nor one of rewards.functions")
        return self


@dataclass(frozen=True)
class Task:
    """A task as this command uses it: its spec, its files on this machine, and their digests."""

    name: str
    spec: TaskSpec
    folder: Path  # jobs/tasks/
    digests: dict[str, str]  # each file of the task (the task's own YAML included): its SHA-256

    @property
    def builtin(self) -> bool:
        return self.spec.builtin is not None

    @property
    def digest(self) -> str:
        """The task as one hash: its YAML and every file it names."""
        return hashlib.sha256(json.dumps(sorted(self.digests.items())).encode()).hexdigest()

    @property
    def measure_name(self) -> str:
        return "GSM8K accuracy" if self.builtin else f"{self.name} {self.spec.measure.replace('_', ' ')}"

    def local(self, name: str) -> Path:
        return self.folder / name

    def data_files(self) -> dict[str, str]:
        """split -> its file here or in a bucket; empty for a Hugging Face dataset."""
        data = self.spec.data
        return {} if data is None or data.hub else {"train": data.train, "test": data.test}

    def uploads(self) -> dict[str, Path]:
        """What travels to the VM's task folder: name there -> file here (a bucket's data is fetched there)."""
        found = {Path(self.spec.rewards.file).name: self.local(self.spec.rewards.file)}
        if self.spec.processor:
            found[Path(self.spec.processor).name] = self.local(self.spec.processor)
        for split, where in self.data_files().items():
            if not where.startswith("gs://"):
                found[f"data/{split}{Path(where).suffix}"] = self.local(where)
        return found

    def vm_folder(self, layout: Layout) -> str:
        """The task's folder on the VM (relative: in the SSH user's home, train's working folder)."""
        return f"{layout.root}/{TASKS}/{self.name}-{self.digest[:12]}"

    def vm_spec(self, layout: Layout) -> dict:
        """task.json: what remote/task_processor.py and remote/task_rewards.py read on the VM."""
        folder = self.vm_folder(layout)
        fetch = {
            f"data/{split}{Path(where).suffix}": where
            for split, where in self.data_files().items()
            if where.startswith("gs://")
        }
        return {
            "name": self.name,
            "prompt": self.spec.prompt,
            "answer": self.spec.answer,
            "rewards": f"{folder}/{Path(self.spec.rewards.file).name}",
            "functions": list(self.spec.rewards.functions),
            "measure": self.spec.measure,
            "fetch": fetch,
        }

    def train_args(self, layout: Layout) -> dict[str, str]:
        """MaxText 0.2.5's arguments that make train learn this task (none for a builtin one)."""
        if self.builtin:
            return {}
        folder, data = self.vm_folder(layout), self.spec.data
        dataset = data.hub or f"{folder}/data"
        processor = f"{folder}/{Path(self.spec.processor).name}" if self.spec.processor else f"{layout.bin}/{TOOLS[0]}"
        return {
            "dataset_name": dataset,
            "eval_dataset_name": dataset,
            "hf_subset": (data.subset or "none") if data.hub else "none",
            "train_split": data.train if data.hub else "train",
            "eval_split": data.test if data.hub else "test",
            "dataset_processor_path": processor,
            "reward_functions_path": f"{layout.bin}/{TOOLS[1]}",
            "reward_functions": ",".join(self.spec.rewards.functions),
        }

    def train_env(self, layout: Layout) -> dict[str, str]:
        if self.builtin:
            return {}
        folder = self.vm_folder(layout)
        return {TASK_ENV: folder if folder.startswith("/") else f"~/{folder}"}

    def describe(self) -> list[str]:
        """fab plan's lines: where the rows come from, the prompt, the rewards and the measure, each file's digest."""
        if self.builtin:
            return [f"task {self.name}: {self.spec.description or 'MaxText built in'} (MaxText's own data and rewards)"]
        spec, lines = self.spec, [f"task {self.name}: {self.spec.description}".rstrip(": ")]
        data = spec.data
        where = f"Hugging Face dataset {data.hub}" + (f" ({data.subset})" if data.subset else "") if data.hub else ""
        for split in ("train", "test"):
            source = getattr(data, split)
            file = f"{source} (sha256 {self.digests[source][:12]})" if source in self.digests else source
            lines.append(f"  {split:<8} {where + ', split ' + source if where else file}")
        if spec.prompt:
            lines.append(f"  prompt   {spec.prompt!r} (its answer: the row's {spec.answer!r})")
        else:
            lines.append(f"  prompt   {spec.processor} (sha256 {self.digests[spec.processor][:12]})")
        rewards = spec.rewards
        lines.append(
            f"  rewards  {rewards.file} (sha256 {self.digests[rewards.file][:12]}): {', '.join(rewards.functions)}"
        )
        right = "the mean of the rewards' sum" if spec.measure == MEAN_REWARD else f"right when {spec.measure} >= 1"
        lines.append(f"  measure  {spec.measure}: {right}, on the test split's held-out rows")
        return lines


GSM8K = TaskSpec(description="grade-school math, MaxText's own data, prompt, rewards and accuracy", builtin="gsm8k")


def files_of(spec: TaskSpec) -> list[str]:
    """The files of the task's folder the spec names (a bucket's and the Hub's are not here)."""
    named = [] if spec.builtin else [spec.rewards.file, *([spec.processor] if spec.processor else [])]
    if spec.data and not spec.data.hub:
        named += [where for where in (spec.data.train, spec.data.test) if not where.startswith("gs://")]
    return named


def file_problem(folder: Path, name: str) -> str | None:
    """Why a file the task names cannot be one of its files (outside its folder, missing, of no known kind)."""
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()):
        return f"{name}: not in {folder} (the task's files travel with it from there)"
    if not path.is_file():
        return f"{name}: no such file in {folder}"
    return None


def digest_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def placeholders(template: str) -> list[str]:
    """The row's fields a prompt template reads: {question} -> question ({{ and }} are braces)."""
    return re.findall(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})", template)
