"""Stand-in for maxtext.checkpoint_conversion.to_huggingface: the Hugging Face file layout."""

import json
import os

from maxtext import _standin

SHARDS = 2


def main() -> None:
    args = _standin.args()
    _standin.require_token()
    source = args["load_parameters_path"]
    if not os.path.isdir(source):
        _standin.log(f"checkpoint not found: {source}")
        raise SystemExit(2)
    _standin.pause()
    _standin.maybe_fail("to_huggingface")
    out = args["base_output_directory"]
    os.makedirs(out, exist_ok=True)
    weight_map = {}
    for index in range(1, SHARDS + 1):
        name = f"model-{index:05d}-of-{SHARDS:05d}.safetensors"
        with open(os.path.join(out, name), "wb") as f:
            f.write(os.urandom(4096))
        weight_map[f"layer.{index}"] = name
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "exported_from": source}, f)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump({"model": args["model_name"]}, f)
    _standin.log(f"✅ MaxText model successfully saved in HuggingFace format at {out}")


if __name__ == "__main__":
    main()
