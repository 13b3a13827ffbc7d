"""A task's rows as MaxText's GRPO takes them (its `dataset_processor_path`): the task's prompt template filled with a
row's fields, wrapped by the model's own chat template, and the row's answer for the rewards.

Loaded by MaxText 0.2.5 in train's process, which calls `process_data` on each row; the task's spec is task.json in
the folder TPU_RL_TASK names (jobs/task.py writes it). Standard library only.
"""

from __future__ import annotations

import functools
import json
import os

TASK_ENV = "TPU_RL_TASK"


@functools.cache
def spec() -> dict:
    with open(os.path.join(os.environ[TASK_ENV], "task.json")) as f:
        return json.load(f)


def process_data(dataset_name, model_tokenizer, template_config, tmvp_config, x) -> dict:
    """One row: `prompts` (what the model continues), `question` (the filled template), `answer` (a JSON list, as
    MaxText's eval reads it: json.loads of it, each entry an acceptable answer)."""
    task = spec()
    question = task["prompt"].format(**x)
    prompts = model_tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return {"prompts": prompts, "question": question, "answer": json.dumps([str(x[task["answer"]])])}
