"""Build (once) a Python 3.12 venv where one MaxText version's config validator runs on CPU.

    python scripts/maxtext_config_env.py [VERSION]    # prints the venv's python; VERSION defaults to 0.2.3

Used by `fab check --python ...`, by scripts/generate_maxtext_schema.py and by the
tests. `import maxtext` pulls in JAX and more, so the venv holds maxtext without
its extras plus exactly what its config modules import (pinned to the versions
this was verified with, the same for every supported version). Cached in
~/.cache/tpu-rl/maxtext-VERSION-config.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bootstrap
from bootstrap.demo import cpu  # noqa: E402

DEFAULT_VERSION = "0.2.3"
CONFIG_IMPORTS = [
    "jax==0.12.0.1",
    "jaxlib==0.12.0.1",
    "flax==0.12.12",
    "omegaconf==2.4.0",
    "pydantic==2.14.4",
    "jinja2==3.1.6",
    "pyyaml==6.0.4",
    "transformers==5.24.0",
    "pathwaysutils==0.1.13",
    "aqtp==0.9.0",
    "qwix==0.1.8",
    "tokamax==0.0.17",
    "grain==0.2.18",
    "pillow==13.0.0",
    "tiktoken==0.14.0",
    "sentencepiece==0.2.3",
    "sympy==1.14.0",
]
CACHE = Path.home() / ".cache" / "tpu-rl"


def python312() -> str:
    """A Python 3.12 that runs (bootstrap/demo/cpu.py says where it looks)."""
    found = cpu.real_python("3.12")
    if found is None:
        raise SystemExit("needs a Python 3.12: put python3.12 on PATH or run `pyenv install 3.12`")
    return found


def uv() -> str:
    return shutil.which("uv") or str(Path(sys.executable).with_name("uv"))


def ensure(version: str = DEFAULT_VERSION) -> Path:
    """The venv's python for maxtext `version`, built if missing or if its packages changed."""
    venv = CACHE / f"maxtext-{version}-config"
    packages = [f"maxtext=={version}", *CONFIG_IMPORTS]
    stamp = venv / "tpu-rl-packages.sha256"
    digest = hashlib.sha256("\n".join(packages).encode()).hexdigest()
    python = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{venv.name}.lock", "a") as lock:  # two processes (test workers) never build it at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text() == digest:
            return python
        print(f"building the MaxText {version} config venv in {venv} (once; uv caches the downloads)", file=sys.stderr)
        subprocess.run([uv(), "venv", "--clear", "--quiet", "--python", python312(), str(venv)], check=True)
        subprocess.run([uv(), "pip", "install", "--quiet", "--python", str(python), *packages], check=True)
        stamp.write_text(digest)
    return python


if __name__ == "__main__":
    print(ensure(*sys.argv[1:2]))
