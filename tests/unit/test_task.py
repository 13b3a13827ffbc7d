"""A task of your own (jobs/task.py): rendered into MaxText 0.2.5's hooks, checked on the laptop before anything starts
(each bad reward file and dataset refused in one line, through the real fab), its rewards and rows as the VM's tools
hand them to MaxText, its measure of each eval judging the run, and a run that carries on only with its own task."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bootstrap.errors import UserError
from bootstrap.jobs import load, task_check
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from bootstrap.remote import attempts, evals
from bootstrap.results.runs import RunRecord
from bootstrap.tasks.sessions import same_task
from tests.unit.test_bad_inputs import contacted, fab_train, listener, one_clean_error  # noqa: F401  (a fixture)

RELEASE = "maxtext[tpu-post-train]==0.2.5"


def task_jobs(folder: Path, version: str = RELEASE) -> Path:
    """The shipped jobs with the example task on: what a user who picked it has."""
    jobs = folder / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    data = yaml.safe_load((jobs / "pipeline.yaml").read_text())
    data["task"], data["environment"]["packages"] = "arithmetic", [version]
    (jobs / "pipeline.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return jobs


def test_the_example_task_becomes_maxtext_0_2_5s_own_hooks(tmp_path):
    plan = build(load.read(task_jobs(tmp_path)), [], "r1")
    task, train = plan.task, plan.job("train").rendered
    folder = f"tpu-rl/tasks/arithmetic-{task.digest[:12]}"
    args = dict(word.partition("=")[::2] for word in train.argv[3:])
    assert args["dataset_name"] == args["eval_dataset_name"] == f"{folder}/data"
    assert (args["hf_subset"], args["train_split"], args["eval_split"]) == ("none", "train", "test")
    assert args["dataset_processor_path"] == "tpu-rl/bin/task_processor.py"
    assert args["reward_functions_path"] == "tpu-rl/bin/task_rewards.py"
    assert args["reward_functions"] == "correct,formatted" and train.env["TPU_RL_TASK"] == f"~/{folder}"
    assert sorted(task.uploads()) == ["data/test.jsonl", "data/train.jsonl", "reward.py"]
    assert set(task.digests) == {"arithmetic.yaml", "arithmetic/reward.py", "arithmetic/train.jsonl",
                                 "arithmetic/test.jsonl"}  # fmt: skip


def test_a_changed_reward_is_another_task_folder_and_digest(tmp_path):
    jobs = task_jobs(tmp_path)
    before = build(load.read(jobs), [], "r1").task
    reward = jobs / "tasks" / "arithmetic" / "reward.py"
    reward.write_text(reward.read_text() + "\n# tuned\n")
    after = build(load.read(jobs), [], "r1").task
    assert (
        after.digest != before.digest
        and after.digests["arithmetic/reward.py"] != before.digests["arithmetic/reward.py"]
    )


def test_maxtext_0_2_3_is_refused_in_one_line_naming_0_2_5(tmp_path):
    with pytest.raises(UserError, match=r"pipeline.yaml:\d+: task: a task of your own needs MaxText 0.2.5"):
        load.resolve(load.read(task_jobs(tmp_path, "maxtext[tpu-post-train]==0.2.3")))


def test_a_key_the_task_sets_in_train_yaml_is_refused_naming_its_line(tmp_path):
    jobs = task_jobs(tmp_path)
    train = yaml.safe_load((jobs / "train.yaml").read_text())
    train["args"]["dataset_name"] = "openai/gsm8k"
    (jobs / "train.yaml").write_text(yaml.safe_dump(train, sort_keys=False))
    with pytest.raises(UserError, match=r"train.yaml:\d+: args.dataset_name: set by the task arithmetic"):
        load.resolve(load.read(jobs))


def bad(file: str, change) -> tuple:
    return file, change


def rewrite(text: str):
    return lambda old: text


def append(text: str):
    return lambda old: old + text


BAD = {  # each refused on the laptop, before any job starts: the message names the file, function or row
    "missing function": ("reward.py", rewrite("def correct(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"), "formatted: no such function in the file"),
    "wrong signature": ("reward.py", append("\ndef formatted(completions):\n    return [0.0]\n"), "formatted: takes no prompts=, completions="),
    "one number for three": ("reward.py", append("\ndef correct(prompts, completions, **kw):\n    return [1.0]\n"), "correct: row 1: returned 1 numbers for 3 completions"),
    "not numbers": ("reward.py", append("\ndef correct(prompts, completions, **kw):\n    return None\n"), "correct: row 1: returned NoneType None, not one number a completion"),
    "NaN": ("reward.py", append("\ndef correct(prompts, completions, **kw):\n    return [float('nan')] * len(completions)\n"), "a reward must be a finite number"),
    "raises": ("reward.py", append("\ndef correct(prompts, completions, answer, **kw):\n    return [int(a) / 0 for a in answer]\n"), "correct: row 1: raised ZeroDivisionError: division by zero (line"),
    "does not import": ("reward.py", append("\ndef broken(:\n"), "reward.py: rewards: cannot be imported: SyntaxError"),
    "row without the field": ("test.jsonl", rewrite('{"query": "What is 1 + 1?", "answer": "2"}\n'), "test.jsonl: rows: row 1 has no field 'question'"),
    "empty split": ("train.jsonl", rewrite("\n"), "train.jsonl: rows: the train split has no rows"),
    "not readable": ("test.jsonl", rewrite('{"question": "What is 1 + 1?", "answer": "2"}\nnot json\n'), "test.jsonl:2: rows: is not JSON"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD), ids=str)
def test_each_bad_reward_and_dataset_is_refused_in_one_line_before_anything_is_contacted(case, tmp_path, listener):  # noqa: F811
    file, change, expect = BAD[case]
    jobs = task_jobs(tmp_path)
    path = jobs / "tasks" / "arithmetic" / file
    path.write_text(change(path.read_text()))

    class Case:  # test_bad_inputs' shape: jobs/ as made above, no further change
        file, args, task = "", (), "train"

        @staticmethod
        def change(b):
            return b

    returncode, stdout, stderr, _ = fab_train(tmp_path, listener, Case)
    one_clean_error(returncode, stdout, stderr, expect)
    assert not contacted(listener), "contacted the VM or the Hub before refusing"


def test_the_check_runs_the_reward_without_this_machines_secrets(tmp_path, monkeypatch):
    """A user's reward runs in a process of its own: the token is not in its environment."""
    monkeypatch.setenv("HF_TOKEN", "hf_" + "s" * 34)
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path / "runs"))
    jobs = task_jobs(tmp_path)
    reward = jobs / "tasks" / "arithmetic" / "reward.py"
    reward.write_text(reward.read_text() + "\nimport os\nassert 'HF_TOKEN' not in os.environ, 'the token reached me'\n")
    seconds = task_check.check(load.resolve(load.read(jobs)).task)
    assert set(seconds) == {"correct", "formatted"} and all(s >= 0 for s in seconds.values())


def vm_tools(tmp_path: Path, measure: str = "correct") -> tuple[Path, dict]:
    """The VM's task folder (task.json as fab writes it, the example's reward file) and train's environment."""
    folder = tmp_path / "task"
    folder.mkdir()
    shutil.copy(REPO / "jobs" / "tasks" / "arithmetic" / "reward.py", folder / "reward.py")
    spec = {"name": "arithmetic", "prompt": "{question} Answer in <answer> tags.", "answer": "answer",
            "rewards": str(folder / "reward.py"), "functions": ["correct", "formatted"], "measure": measure, "fetch": {}}  # fmt: skip
    (folder / "task.json").write_text(json.dumps(spec))
    return folder, {**os.environ, "TPU_RL_TASK": str(folder)}


CALLS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import task_processor, task_rewards, eval_recorder

class Tokenizer:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "<user>" + messages[0]["content"] + "<assistant>"

row = task_processor.process_data("d", Tokenizer(), {}, None, {"question": "What is 3 + 4?", "answer": 7})
# training: MaxText hands the answers over as its JSON lists, a group of completions at once
train = task_rewards.correct(prompts=[row["prompts"]] * 2, completions=["<answer>7</answer>", "<answer>5</answer>"],
                             answer=[row["answer"]] * 2, question=[row["question"]] * 2, mode="train")
# an eval: one completion a call, each function in turn, the question a string, no mode
for completion in ["<answer>7</answer>", "no tag", "<answer>7</answer>", "<answer>8</answer>"]:
    for fn in (task_rewards.correct, task_rewards.formatted):
        fn(prompts=[row["prompts"]], completions=[completion], answer=[row["answer"]], question=row["question"])
recorder = eval_recorder.EvalRecorder(sys.argv[2])
recorder.read("W1205 train_rl.py:781] Post RL Training: corr=2, total=4, accuracy=50.0%, partial_accuracy=50.0%, format_accuracy=75.0%, mean_reward=0.6875")
print(json.dumps({"row": row, "train": train}))
"""


@pytest.mark.parametrize("measure", ["correct", "mean_reward"])
def test_the_vms_tools_give_maxtext_the_rows_and_rewards_and_record_each_evals_measure(tmp_path, measure):
    folder, env = vm_tools(tmp_path, measure)
    done = subprocess.run(
        [sys.executable, "-c", CALLS, str(REPO / "bootstrap" / "remote"), str(tmp_path / "evals")],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["row"] == {"prompts": "<user>What is 3 + 4? Answer in <answer> tags.<assistant>",
                            "question": "What is 3 + 4? Answer in <answer> tags.", "answer": '["7"]'}  # fmt: skip
    assert found["train"] == [1.0, 0.0]
    (said,) = [line for line in done.stderr.splitlines() if line.startswith("[tpu-rl] task")]
    (record,) = attempts.recorded_evals(attempts.read_records(str(tmp_path / "evals")), None)
    parsed = evals.parse(said)  # the line the laptop reads is the record's measure
    assert parsed["task"] == record["task"] and record["phase"] == "post"
    if measure == "correct":  # 2 of 4 held-out completions right
        assert said == "[tpu-rl] task arithmetic, Post RL Training: correct=50.00%, right=2, total=4"
    else:  # the rewards' sums: 1.25, 0, 1.25, 0.25
        assert record["task"]["value"] == pytest.approx(0.6875) and record["task"]["total"] == 4


def test_the_run_is_judged_by_the_tasks_measure_with_its_interval():
    pre = {"phase": "pre", "step": None, "corr": 0, "total": 64, "accuracy": 0.0, "partial_accuracy": 0.0,
           "format_accuracy": 0.0, "mean_reward": 0.0}  # fmt: skip
    post = {**pre, "phase": "post", "mean_reward": 1.25, "format_accuracy": 100.0}
    lines = ["[tpu-rl] task arithmetic, Pre RL Training: correct=3.12%, right=2, total=64",
             "[tpu-rl] task arithmetic, Post RL Training: correct=93.75%, right=60, total=64"]  # fmt: skip
    results = evals.collect(evals.collect([pre], evals.parse(lines[0])), post)
    results = evals.collect(results, evals.parse(lines[1]))
    result = evals.outcome(results)
    assert (result["before"], result["after"], result["problems"]) == (3.12, 93.75, 64) and result["judged"]
    line = evals.result_line(result)
    assert line.startswith("arithmetic correct 3.1% -> 93.8% (+90.6 points, 95% interval +-")
    assert evals.held_back(results, "improved") is None and "90" in evals.held_back(results, "95")
    assert "| after training | 93.75 (60/64) | 1.250 |" in evals.card_rows(results)


def test_a_run_carries_on_only_with_the_task_it_began_with(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_RL_RUNS", str(tmp_path / "runs"))
    jobs = task_jobs(tmp_path)
    task = load.resolve(load.read(jobs)).task
    record = RunRecord("r1", task={"name": task.name, "digest": task.digest, "files": task.digests})
    same_task(record, task)  # unchanged: carries on
    reward = jobs / "tasks" / "arithmetic" / "reward.py"
    reward.write_text(reward.read_text().replace("0.25", "0.5"))
    with pytest.raises(UserError, match=r"run r1 began with the task arithmetic as it was then; arithmetic/reward.py "
                       r"changed since \(jobs/tasks/\): --new-run trains it as a new run"):  # fmt: skip
        same_task(record, load.resolve(load.read(jobs)).task)
