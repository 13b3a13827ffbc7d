"""Calls a task's reward functions (and its processor) on a few rows, in a process of its own: what task_check.py
runs before anything is started, so that a reward that cannot run fails on the laptop in seconds, not on the VM after
an hour of setup. Standard library only; run with `python -I` and no secrets in its environment:

    python -I task_probe.py REQUEST_JSON   # {"rewards": FILE, "functions": [...], "processor": FILE|null, "rows":
                                           #  [{"prompt": ..., "answer": ..., "row": {...}}]}

Prints one JSON object: for each function, the first fault (with its row) or None, and its seconds a completion.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import sys
import time
import traceback


def completions_for(answer: str) -> list[str]:
    """What a model might answer: right in the answer tags, nothing, and prose."""
    return [f"<reasoning>It is {answer}.</reasoning><answer>{answer}</answer>", "", "I do not know."]


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def last_line(err: BaseException) -> str:
    where = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    at = f" (line {where.lineno})" if where else ""
    return f"{type(err).__name__}: {str(err)[:200]}{at}"


def fault_of(fn, rows: list[dict]) -> tuple[str | None, float]:
    """The first row a reward function fails on, and why; and its seconds a completion."""
    try:
        inspect.signature(fn).bind(prompts=[], completions=[], answer=[], question=[], mode="train")
    except TypeError:
        return "takes no prompts=, completions=, answer= and **kwargs (def f(prompts, completions, **kwargs))", 0.0
    spent, calls = 0.0, 0
    for index, row in enumerate(rows, 1):
        completions = completions_for(row["answer"])
        count = len(completions)
        started = time.perf_counter()
        try:
            scores = fn(
                prompts=[row["prompt"]] * count,
                completions=completions,
                answer=[row["answer"]] * count,
                question=[row["prompt"]] * count,
                mode="train",
            )
        except Exception as err:  # noqa: BLE001 - the user's code: any fault is the answer
            return f"row {index}: raised {last_line(err)}", 0.0
        spent, calls = spent + time.perf_counter() - started, calls + count
        try:
            numbers = [float(score) for score in scores]
        except (TypeError, ValueError):
            return f"row {index}: returned {type(scores).__name__} {str(scores)[:60]}, not one number a completion", 0.0
        if len(numbers) != count:
            return f"row {index}: returned {len(numbers)} numbers for {count} completions", 0.0
        if not all(math.isfinite(n) for n in numbers):
            return f"row {index}: returned {numbers}: a reward must be a finite number", 0.0
    return None, spent / max(1, calls)


class Tokenizer:
    """What MaxText hands a processor: its chat template applied (here the messages' text, joined)."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "\n".join(message["content"] for message in messages)


def processor_fault(path: str, rows: list[dict]) -> str | None:
    module = load(path, "tpu_rl_task_processor")
    fn = getattr(module, "process_data", None)
    if not callable(fn):
        return "defines no function process_data(dataset_name, model_tokenizer, template_config, tmvp_config, x)"
    for index, row in enumerate(rows, 1):
        try:
            made = fn("task", Tokenizer(), {}, None, row["row"])
        except Exception as err:  # noqa: BLE001
            return f"process_data: row {index}: raised {last_line(err)}"
        if not isinstance(made, dict) or not all(isinstance(made.get(k), str) for k in ("prompts", "question")):
            return f"process_data: row {index}: returned no dict of strings prompts and question"
        try:
            answers = json.loads(made.get("answer", ""))
        except (TypeError, ValueError):
            answers = None
        if not isinstance(answers, list) or not answers:
            return f"process_data: row {index}: its answer is not a JSON list of answers (json.dumps([answer]))"
    return None


def main(request: dict) -> dict:
    found: dict = {"functions": {}, "processor": None, "import": None}
    try:
        module = load(request["rewards"], "tpu_rl_task_reward_file")
    except ModuleNotFoundError as err:  # a package the VM's environment has and this machine may not
        found["import"] = {"missing": err.name, "error": last_line(err)}
        return found
    except BaseException as err:  # noqa: BLE001 - a syntax error, an import that fails: the user's code
        found["import"] = {"error": last_line(err)}
        return found
    for name in request["functions"]:
        fn = getattr(module, name, None)
        if not callable(fn):
            found["functions"][name] = {"fault": "no such function in the file", "seconds": 0.0}
            continue
        fault, seconds = fault_of(fn, request["rows"])
        found["functions"][name] = {"fault": fault, "seconds": seconds}
    if request.get("processor"):
        try:
            found["processor"] = processor_fault(request["processor"], request["rows"])
        except BaseException as err:  # noqa: BLE001
            found["processor"] = f"cannot be imported: {last_line(err)}"
    return found


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
