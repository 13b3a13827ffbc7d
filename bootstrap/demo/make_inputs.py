"""Make the tiny local inputs the real MaxText jobs run on, on CPU (about 2 s).

    PYTHON make_inputs.py OUT_DIR [QUERY_HEADS KV_HEADS]  # PYTHON: safetensors, tokenizers, transformers, pyarrow

OUT_DIR/hf_model/   a random Llama 3.1 of the real architecture's shape rules (32 layers,
                    head_dim 128: the converter takes both from its hard-coded 8B table) but tiny widths,
                    with a prior for the RL format tags, so that GRPO has rewards to learn from
OUT_DIR/tokenizer/  a byte-level BPE with Llama 3 special tokens, the format tags as single tokens,
                    and a chat template
OUT_DIR/gsm8k/      GSM8K-format parquet (question, answer ending in `#### N`)
OUT_DIR/hf_home/    an offline Hugging Face cache entry for meta-llama/Llama-3.1-8B-Instruct, the id
                    to_huggingface hard-codes, with that model's own config and generation config shape
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

HF_ID = "meta-llama/Llama-3.1-8B-Instruct"
SNAPSHOT = "0e9e39f249a16976918f6564b8830bc894c89659"
HIDDEN, INTERMEDIATE, LAYERS, HEAD_DIM, VOCAB = 64, 128, 32, 128, 512
# 2 query heads share 1 key-value head (the 8B: 4 share each of 8): half the attention work of 4 and 2. The test
# that checks the export's layout asks for 4 and 2, so that both head axes' order shows.
HEADS = (2, 1)
SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
    "<|python_tag|>",
]
# rl.yml's reasoning_start_token, reasoning_end_token, solution_start_token, solution_end_token: what
# MaxText's format rewards count in a completion (utils_rl.match_format_approximately).
FORMAT_TAGS = ["<reasoning>", "</reasoning>", "<answer>", "</answer>"]
# The prior: embedding dimension 0 is CONSTANT_DIRECTION for every token, large enough to dominate the
# residual stream, so after the final RMSNorm it is close to sqrt(HIDDEN) = 8 in every context, and each tag's
# lm_head row turns it into a fixed logit bonus of about TAG_BIAS x 8 = 2.6. Measured with a numpy forward
# pass of this model (4 and 2 heads then) at the sampler's temperature 0.9: each tag is about 3% of the sampled
# tokens, so a 32-token completion holds a given tag exactly once about a third of the time, and the completions
# of one prompt earn different rewards; the bonus survives the first updates (a weak constant, 1.0, did not).
# A random model without it samples a tag (three BPE pieces before add_tokens) almost never.
CONSTANT_DIRECTION, TAG_BIAS = 8.0, 0.33
# train_rl wraps every question in this (rl.yml's chat_template_path, gsm8k_rl.json); a tokenizer that
# knows its words keeps prompts near 100 tokens, under max_prefill_predict_length=128.
PROMPT_TEMPLATE = (
    "<start_of_turn>user\nYou are given a problem. Think about the problem and provide your reasoning. Place it "
    "between <reasoning> and </reasoning>. Then, provide the final answer (i.e., just one numerical value) between "
    "<answer> and </answer>.\n\n<end_of_turn>\n<start_of_turn>model"
)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def rows(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        a, b = (int(x) for x in rng.integers(2, 50, size=2))
        out.append(
            {
                "question": f"Tom has {a} apples and buys {b} more. How many apples does Tom have now?",
                "answer": f"Tom has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
            }
        )
    return out


def write_gsm8k(folder: Path, rows=rows, counts: tuple[int, int] = (30, 10)) -> list[str]:
    """The train and test splits (`counts` rows of `rows`), as parquet; their texts, for the tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for split, count, seed in (("train", counts[0], 1), ("test", counts[1], 2)):
        data = rows(count, seed)
        pq.write_table(pa.Table.from_pylist(data), folder / f"{split}.parquet")
        texts += [r["question"] + " " + r["answer"] for r in data]
    return texts


def write_tokenizer(folder: Path, corpus: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on `corpus`, with Llama 3's special tokens, the format tags and a chat template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 30, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
    )
    tokenizer.add_tokens(FORMAT_TAGS)  # plain added tokens: decoded text keeps them, as the rewards need
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return tokenizer


def model_config(tokenizer: PreTrainedTokenizerFast, heads: tuple[int, int] = HEADS) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": heads[0],
        "num_key_value_heads": heads[1],
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": ids("<|begin_of_text|>"),
        "eos_token_id": [ids("<|end_of_text|>"), ids("<|eom_id|>"), ids("<|eot_id|>")],
        "torch_dtype": "bfloat16",
    }


def layer_shapes(heads: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """A Llama decoder layer's matrices, as Hugging Face names them, with `heads` (query, key-value)."""
    query, key_value = heads
    return {
        "self_attn.q_proj.weight": (query * HEAD_DIM, HIDDEN),
        "self_attn.k_proj.weight": (key_value * HEAD_DIM, HIDDEN),
        "self_attn.v_proj.weight": (key_value * HEAD_DIM, HIDDEN),
        "self_attn.o_proj.weight": (HIDDEN, query * HEAD_DIM),
        "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }


def save_llama(folder: Path, embed: np.ndarray, lm_head: np.ndarray, matrix, heads: tuple[int, int] = HEADS) -> None:
    """model.safetensors of LAYERS layers: `matrix(name, shape)` gives each layer matrix; the norms are ones."""
    tensors = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": np.ones(HIDDEN, np.float32),
        "lm_head.weight": lm_head,
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {p + name: matrix(name, shape) for name, shape in layer_shapes(heads).items()}
        tensors |= {p + "input_layernorm.weight": np.ones(HIDDEN, np.float32)}
        tensors |= {p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def write_model(folder: Path, config: dict, tag_ids: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    embed, lm_head = weight(VOCAB, HIDDEN), weight(VOCAB, HIDDEN)
    embed[:, 0] = CONSTANT_DIRECTION
    lm_head[:, 0] = 0.0
    lm_head[tag_ids, 0] = TAG_BIAS
    heads = (config["num_attention_heads"], config["num_key_value_heads"])
    save_llama(folder, embed, lm_head, lambda name, shape: weight(*shape), heads)
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def write_hub_cache(hf_home: Path, tokenizer_dir: Path, model_dir: Path, config: dict) -> None:
    """What the Hub would have put in HF_HOME for HF_ID, so that HF_HUB_OFFLINE=1 serves it."""
    repo = hf_home / "hub" / f"models--{HF_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    for path in tokenizer_dir.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    (snapshot / "config.json").write_text(json.dumps(config, indent=1))
    (snapshot / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes())
    generation = {
        "bos_token_id": config["bos_token_id"],
        "do_sample": True,
        "eos_token_id": config["eos_token_id"],
        "temperature": 0.6,
        "top_p": 0.9,
    }
    (snapshot / "generation_config.json").write_text(json.dumps(generation, indent=1))


def main(out: Path, heads: tuple[int, int] = HEADS) -> None:
    texts = write_gsm8k(out / "gsm8k")
    tokenizer = write_tokenizer(out / "tokenizer", texts * 4 + [PROMPT_TEMPLATE] * 20)
    config = model_config(tokenizer, heads)
    write_model(out / "hf_model", config, tokenizer.convert_tokens_to_ids(FORMAT_TAGS))
    write_hub_cache(out / "hf_home", out / "tokenizer", out / "hf_model", config)
    print(out)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    main(Path(sys.argv[1]), (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) == 4 else HEADS)
