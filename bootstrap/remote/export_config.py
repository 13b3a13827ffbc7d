"""Make an export servable: the base model's generation config and token ids, from the Hub.

    python export_config.py EXPORT_DIR HF_REPO

Runs with the MaxText venv's Python after to_huggingface. MaxText writes config.json from
its own table (eos_token_id 128001, the base model's) and no generation_config.json, so
`generate` on the exported Instruct model would not stop at its end-of-turn token. This
copies the base repository's generation_config.json and aligns config.json's token ids
with the base repository's config.json (through huggingface_hub: HF_TOKEN and HF_HOME
from the environment, so a cached or offline copy serves as well).
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import faults  # beside this script in the VM's tools folder
from huggingface_hub import hf_hub_download

TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 64
    folder, repo = argv
    with open(hf_hub_download(repo, "config.json")) as f:
        base = json.load(f)
    shutil.copyfile(hf_hub_download(repo, "generation_config.json"), os.path.join(folder, "generation_config.json"))
    faults.point("export-config.copied-generation-config")
    print(f"[tpu-rl] generation_config.json from {repo}", flush=True)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    for key in TOKEN_KEYS:
        if key in base and config.get(key) != base[key]:
            print(f"[tpu-rl] config.json {key}: {config.get(key)} -> {base[key]} (as {repo})", flush=True)
            config[key] = base[key]
    with open(path + ".tmp", "w") as f:
        json.dump(config, f, indent=2)
    os.replace(path + ".tmp", path)
    faults.point("export-config.wrote-config")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
