"""Tiny inputs on which MaxText's real GRPO measurably improves the model (about 2 s):

    PYTHON make_learnable_inputs.py OUT_DIR [TEXTS]   # PYTHON: the CPU venv (numpy, safetensors, tokenizers, ...)

TEXTS: a file of a task of your own's prompts, a line each (fab demo writes it): the tokenizer learns their words
too, so that they fit the demo's prompt length.

The layout and shape rules are make_inputs.py's (beside it: 32 layers, head_dim 128, width 64,
vocab 512, the format tags as single tokens, an offline Hub cache entry), which the CPU tier's model could not
learn from (near context free, its prior already at the reward's optimum).
Here the model is a hand-set bigram model in Llama's architecture:

- every layer adds nothing (v, o, up and down projections zero: a saddle whose gradients are exactly zero, so
  training moves only the embedding, lm_head and the final norm), so a position's logits depend on its token
  alone: lm_head @ RMSNorm(embed[token]);
- each token of the answer chain has its own embedding direction, so lm_head's column for it is that context's
  next-token logits: prompt end -> <reasoning> -> " think" -> </reasoning> -> {" think" (a loop) | <answer>},
  <answer> -> {"5" | "7"} -> </answer> -> <|eot_id|>; any other token -> <|eot_id|>;
- greedy decoding starts wrong at two transitions (it loops after </reasoning>, by LOOP_GAP logits, and says 5
  after <answer>, by WRONG_GAP): format and accuracy 0%; the sampler (temperature 0.9) leaves the loop and says 7
  about a quarter of the time each, so a group's completions earn different rewards;
- the data are word problems whose answer is always 7, so a model that ignores the question can be right;
- with TEXTS (a task of your own) greedy decoding leaves the loop (LOOP_GAP the other way): its answers end, in the
  task's format and wrong, as a healthy base model's do (the smoke rollout's check, remote/health.py), and only
  the answer is learned. On GSM8K the demo's smoke rollout is off: its answers loop, on purpose.

Measured on 2 CPU cores (60 steps, learning rate 3e-3, 4 prompts x 8 generations a step): MaxText's greedy eval
0% -> 100% (accuracy and format), its sampled eval 15.6% -> 60.9% accuracy; with learning rate 0, no change.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_inputs  # noqa: E402 - the tiny inputs: their tokenizer, config and Hub cache recipe
from make_inputs import HIDDEN, VOCAB  # noqa: E402

ANSWER, WRONG, THINK = "7", "5", " think"
ROWS = (512, 64)  # train, test
GENERATION_PROMPT = "<|start_header_id|>assistant<|end_header_id|>\n\n"  # how every prompt ends
# The prior, in logits before the sampler's temperature: the chain's transitions 0, every other token OFF_LOGIT
# (about 0.1% of a sampled step at 0.9); LOOP_GAP: " think" over <answer> after </reasoning>; WRONG_GAP: "5" over
# "7" after <answer>. EMBED_SCALE: the one-hot embedding's size, large enough that Adam's updates of the
# embedding itself (about the learning rate, per element) change nothing after the final norm.
OFF_LOGIT, LOOP_GAP, WRONG_GAP, EMBED_SCALE = -12.0, 1.0, 1.0, 100.0
NEXT = {  # each context's next tokens and their logits (the chain)
    "prompt_end": {"<reasoning>": 0.0},
    "<reasoning>": {"think": 0.0},
    "think": {"</reasoning>": 0.0},
    "</reasoning>": {"think": LOOP_GAP, "<answer>": 0.0},
    "<answer>": {"wrong": WRONG_GAP, "right": 0.0},
    "right": {"</answer>": 0.0},
    "wrong": {"</answer>": 0.0},
    "</answer>": {"eot": 0.0},
    "eot": {"eot": 0.0},
    "generic": {"eot": 0.0},  # any other token ends the completion
}
ENDING = {**NEXT, "</reasoning>": {"think": -LOOP_GAP, "<answer>": 0.0}}  # greedy leaves the loop: answers end


def rows(count: int, seed: int) -> list[dict]:
    """Word problems whose answer is always ANSWER."""
    rng = np.random.default_rng(seed)
    names, things = ["Tom", "Ann", "Bob", "Eve", "Sam", "Mia"], ["apples", "pens", "books", "coins", "cards", "shells"]
    out = []
    for _ in range(count):
        name, thing = names[rng.integers(len(names))], things[rng.integers(len(things))]
        given = int(rng.integers(2, 90))
        had = given + int(ANSWER)
        out.append(
            {
                "question": f"{name} has {had} {thing} and gives away {given}. How many {thing} does {name} have now?",
                "answer": f"{name} has {had} - {given} = <<{had}-{given}={ANSWER}>>{ANSWER} {thing}.\n#### {ANSWER}",
            }
        )
    return out


def single_token(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise SystemExit(f"{text!r} is not one token: {ids}")
    return ids[0]


def chain_tokens(tokenizer) -> dict[str, int]:
    found = {
        "prompt_end": tokenizer.encode(GENERATION_PROMPT, add_special_tokens=False)[-1],
        **{tag: single_token(tokenizer, tag) for tag in make_inputs.FORMAT_TAGS},
        "think": single_token(tokenizer, THINK),
        "right": single_token(tokenizer, ANSWER),
        "wrong": single_token(tokenizer, WRONG),
        "eot": tokenizer.convert_tokens_to_ids("<|eot_id|>"),
    }
    if len(set(found.values())) != len(found):
        raise SystemExit(f"two chain tokens share an id: {found}")
    return found


def write_model(folder: Path, config: dict, tokens: dict[str, int], chain: dict[str, dict[str, float]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    direction = {name: i for i, name in enumerate(NEXT)}  # the residual stream's direction for each context
    embed = np.zeros((VOCAB, HIDDEN), np.float32)
    embed[:, direction["generic"]] = EMBED_SCALE
    for name, token in tokens.items():
        embed[token] = 0.0
        embed[token, direction[name]] = EMBED_SCALE
    lm_head = np.zeros((VOCAB, HIDDEN), np.float32)
    for name, targets in chain.items():  # RMSNorm(EMBED_SCALE x one-hot) is sqrt(HIDDEN) x one-hot
        column = np.full(VOCAB, OFF_LOGIT, np.float32)
        for target, logit in targets.items():
            column[tokens[target]] = logit
        lm_head[:, direction[name]] = column / np.sqrt(HIDDEN)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    random = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.gate_proj.weight"}  # the rest: zero
    make_inputs.save_llama(
        folder, embed, lm_head, lambda name, shape: weight(*shape) if name in random else np.zeros(shape, np.float32)
    )
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def main(out: Path, task_texts: list[str]) -> None:
    texts = make_inputs.write_gsm8k(out / "gsm8k", rows, ROWS)
    # the prompt weighted high, so that the tokenizer keeps prompts near 104 tokens (max_prefill_predict_length 112)
    corpus = texts + [make_inputs.PROMPT_TEMPLATE + GENERATION_PROMPT] * 1000 + [THINK] * 500 + task_texts * 2
    tokenizer = make_inputs.write_tokenizer(out / "tokenizer", corpus)
    config = make_inputs.model_config(tokenizer)
    tokens = chain_tokens(tokenizer)
    write_model(out / "hf_model", config, tokens, ENDING if task_texts else NEXT)
    make_inputs.write_hub_cache(out / "hf_home", out / "tokenizer", out / "hf_model", config)
    (out / "chain.json").write_text(json.dumps(tokens, indent=1))
    print(out)


if __name__ == "__main__":
    extra = Path(sys.argv[2]).read_text().splitlines() if len(sys.argv) > 2 else []
    main(Path(sys.argv[1]), [line for line in extra if line.strip()])
