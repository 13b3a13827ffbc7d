"""Writes the arithmetic task's rows (what is shipped beside it; the same seed gives the same files):

python jobs/tasks/arithmetic/make_data.py
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rows(count: int, seed: int) -> list[dict]:
    rng, made = random.Random(seed), []
    for _ in range(count):
        op = rng.choice("+-x")
        a, b = (rng.randint(2, 99), rng.randint(2, 99)) if op == "x" else (rng.randint(10, 999), rng.randint(10, 999))
        value = a * b if op == "x" else a + b if op == "+" else a - b
        made.append({"question": f"What is {a} {op} {b}?", "answer": str(value)})
    return made


if __name__ == "__main__":
    for split, count, seed in (("train", 2000, 1), ("test", 256, 2)):
        lines = [json.dumps(row) for row in rows(count, seed)]
        (HERE / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
