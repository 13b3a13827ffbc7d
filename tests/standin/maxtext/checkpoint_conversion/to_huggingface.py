"""Stand-in for maxtext.checkpoint_conversion.to_huggingface: the Hugging Face file layout.

As the real one: config.json from MaxText's own table (eos_token_id 128001), no
generation_config.json, one model.safetensors below 3 GB.
"""

import json
import os

from maxtext import _standin


def main() -> None:
    args = _standin.args()
    _standin.require_token()
    source = args["load_parameters_path"]
    if not _standin.isdir(source):
        _standin.log(f"checkpoint not found: {source}", "E", "to_huggingface.py:1")
        raise SystemExit(2)
    _standin.pause()
    _standin.maybe_fail("to_huggingface")
    out = args["base_output_directory"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(os.urandom(8192))
    config = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({**config, "exported_from": source}, f)
    for name, text in (("tokenizer.json", "{}"), ("tokenizer_config.json", "{}"), ("chat_template.jinja", "")):
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    _standin.log(f"   Saved config.json to {out}/config.json", where="utils.py:394")
    _standin.log(f"   Saved model.safetensors to {out}/model.safetensors", where="utils.py:496")
    _standin.log(f"✅ MaxText model successfully saved in HuggingFace format at {out}", where="to_huggingface.py:356")
    _standin.log("Overall Elapse: 0.01 min", where="to_huggingface.py:460")


if __name__ == "__main__":
    main()
