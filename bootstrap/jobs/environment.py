"""The Python environment on the VM (the reference's section 2), built by the setup job.

The spec comes from jobs/pipeline.yaml. Its hash names the setup job, so the same spec
again is found done in seconds, and a changed spec builds a fresh venv. The venv also
carries the hash: a venv already built for this spec (the state folder was reset, or a
cached test environment) is kept instead of being built again.
"""

from __future__ import annotations

import hashlib
import shlex

from ..vm.startup import RERUN
from .spec import EnvironmentSpec

STAMP = ".tpu-rl-spec"
# The uv the project tests (requirements-dev.lock) and bootstrap/startup.sh installs: an older one may
# resolve MaxText's tree differently under --resolution=lowest.
UV_MIN = "0.13.9"


def digest(env: EnvironmentSpec) -> str:
    return hashlib.sha256(env.model_dump_json().encode()).hexdigest()[:12]


def setup_script(env: EnvironmentSpec, ready_file: str) -> str:
    """A bash script that builds the venv and touches `ready_file` only when all of it worked."""
    q = shlex.quote
    # The spec allows only plain path characters (spec.Folder); quoted all the same.
    venv = f'"$HOME"/{q(env.venv_path[2:])}' if env.venv_path.startswith("~/") else q(env.venv_path)
    stamp = f"{venv}/{STAMP}"
    install_env = " ".join(f"{q(k)}={q(v)}" for k, v in env.install_env.items())
    install = [
        "uv",
        "pip",
        "install",
        "--python",
        f"{venv}/bin/python",
        *map(q, env.packages),
        *map(q, env.install_options),
    ]
    lines = [
        "set -euo pipefail",
        'export PATH="$HOME/.local/bin:$PATH"',
        'step() { echo "==> $*"; }',
        f'if [ "$(cat {stamp} 2>/dev/null)" = {digest(env)} ] && {venv}/bin/python -c "" 2>/dev/null; then',
        f"  step environment already built for this spec {q(env.venv_path)}",
        "else",
        f"  step uv {UV_MIN} or newer",
        '  found=$(uv --version 2>/dev/null | cut -d" " -f2) || true',
        f'  if [ "$(printf "%s\\n" {UV_MIN} "$found" | sort -V | head -n 1)" != {UV_MIN} ] || [ -z "$found" ]; then',
        f'    echo "the VM has uv ${{found:-(none)}}; the jobs need uv {UV_MIN} or newer: re-run the startup script'
        f' ({RERUN}), which installs it, or (a VM given with -H) put such a uv on PATH" >&2',
        "    exit 1",
        "  fi",
        f"  step Python {q(env.python)}",
        f"  uv python find {q(env.python)} >/dev/null 2>&1 || uv python install {q(env.python)}",
        f"  step virtualenv {q(env.venv_path)}",
        # --seed: install_tpu_post_train_extra_deps runs `python -m pip install uv`.
        f"  uv venv --clear --seed --python {q(env.python)} {venv}",
        f"  step packages {q(' '.join(env.packages))}",
        f"  {'env ' + install_env + ' ' if install_env else ''}{' '.join(install)}",
    ]
    for command in env.post_install:
        lines += [f"  step {q(command)} '(silent for minutes)'", f"  (source {venv}/bin/activate && {command})"]
    lines += [f"  echo {digest(env)} > {stamp}", "fi", f"touch {q(ready_file)}", "step environment ready"]
    return "\n".join(lines) + "\n"
