"""The arithmetic task's rewards: each takes the batch's prompts and completions (and the rows' answers), and gives
one number per completion."""

import re

ANSWER = re.compile(r"<answer>\s*(-?[\d,]+)\s*</answer>")


def correct(prompts: list[str], completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1 when the answer tag holds the exact number, else 0."""
    found = [ANSWER.search(completion) for completion in completions]
    return [float(bool(m) and m[1].replace(",", "") == str(a)) for m, a in zip(found, answer, strict=True)]


def formatted(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """0.25 for an answer tag with a number in it: a signal before the numbers are right."""
    return [0.25 if ANSWER.search(completion) else 0.0 for completion in completions]
