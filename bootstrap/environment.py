"""The Python environment on the VM (the reference's section 2), built by a setup job.

The spec comes from jobs/pipeline.yaml. Its hash names the setup job, so the same
spec again is found done in seconds, and a changed spec builds a fresh venv.
"""

from __future__ import annotations

import hashlib
import shlex

from .spec import EnvironmentSpec


def digest(env: EnvironmentSpec) -> str:
    return hashlib.sha256(env.model_dump_json().encode()).hexdigest()[:12]


def setup_script(env: EnvironmentSpec, ready_file: str) -> str:
    """A bash script that builds the venv and touches `ready_file` only when all of it worked."""
    q = shlex.quote
    venv_python = f"{env.venv}/bin/python"
    install_env = " ".join(f"{k}={q(v)}" for k, v in env.install_env.items())
    lines = [
        "set -euo pipefail",
        'export PATH="$HOME/.local/bin:$PATH"',
        'step() { echo "==> $*"; }',
        "step uv",
        "command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh",
        f"step Python {q(env.python)}",
        f"uv python find {q(env.python)} >/dev/null 2>&1 || uv python install {q(env.python)}",
        f"step virtualenv {q(env.venv)}",
        # --seed: install_tpu_post_train_extra_deps runs `python -m pip install uv`.
        f"uv venv --clear --seed --python {q(env.python)} {q(env.venv)}",
        f"step packages {q(' '.join(env.packages))}",
        f"env {install_env} uv pip install --python {q(venv_python)} {shlex.join(env.packages)} {shlex.join(env.install_options)}".replace(
            "  ", " "
        ),
    ]
    for command in env.post_install:
        lines += [f"step {q(command)} '(silent for minutes)'", f"(source {q(env.venv)}/bin/activate && {command})"]
    lines += [f"touch {q(ready_file)}", "step environment ready"]
    return "\n".join(lines) + "\n"
