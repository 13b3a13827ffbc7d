"""The Python environment on the VM (the reference's section 2), built by the setup job.

The spec comes from jobs/pipeline.yaml. Its hash names the setup job, so the same spec
again is found done in seconds, and a changed spec builds a fresh venv. The venv also
carries the hash: a venv already built for this spec (the state folder was reset, or a
cached test environment) is kept instead of being built again. With a bucket, a new VM
restores the venv kept there for its key instead of building it, and a build is kept there
for the next one (remote/envcache.py).
"""

from __future__ import annotations

import hashlib
import shlex

from ..remote import gcs
from ..vm.startup import RERUN
from .spec import EnvironmentSpec

STAMP = ".tpu-rl-spec"
# The uv the project tests (requirements-dev.lock) and bootstrap/startup.sh installs: an older one may
# resolve MaxText's tree differently under --resolution=lowest.
UV_MIN = "0.13.9"


# What the validate job checks, not what setup builds: a change there must not rebuild the venv.
CHECKED_ONLY = {"check_packages", "accepted_conflicts"}


def digest(env: EnvironmentSpec) -> str:
    return hashlib.sha256(env.model_dump_json(exclude=CHECKED_ONLY).encode()).hexdigest()[:12]


def cache_url(durable_dir: str) -> str | None:
    """Where environments are kept: the bucket of the converted model and the checkpoints (None: no bucket)."""
    if not gcs.is_gcs(durable_dir):
        return None
    bucket, _ = gcs.split(durable_dir)
    return f"gs://{bucket}/tpu-rl/environments"


def setup_script(env: EnvironmentSpec, ready_file: str, cache: tuple[str, str] | None = None) -> str:
    """A bash script that builds the venv and touches `ready_file` only when all of it worked; with `cache`
    (envcache.py's path on the VM, the bucket's folder), a venv kept there is restored instead, and a
    venv built here is kept there."""
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
    kept = f"python3 {q(cache[0])} {{}} {digest(env)} {venv} {q(cache[1])}" if cache else ""
    lines = [
        "set -euo pipefail",
        'export PATH="$HOME/.local/bin:$PATH"',
        'step() { echo "==> $*"; }',
        f'if [ "$(cat {stamp} 2>/dev/null)" = {digest(env)} ] && {venv}/bin/python -c "" 2>/dev/null; then',
        f"  step environment already built for this spec {q(env.venv_path)}",
        *(
            [f'elif restored=$({kept.format("restore")}) && {venv}/bin/python -c ""; then', '  step "$restored"']
            if cache
            else []
        ),  # fmt: skip
        "else",
        *(['  step "$restored"'] if cache else []),  # why it is built: none kept, or what was wrong with it
        f"  step uv {UV_MIN} or newer",
        '  found=$(uv --version 2>/dev/null | cut -d" " -f2) || true',
        f'  if [ "$(printf "%s\\n" {UV_MIN} "$found" | sort -V | head -n 1)" != {UV_MIN} ] || [ -z "$found" ]; then',
        f'    echo "the VM has uv ${{found:-(none)}}; the jobs need uv {UV_MIN} or newer: re-run the startup script'
        f' ({RERUN}), which installs it, or (a VM given with -H) put such a uv on PATH" >&2',
        "    exit 1",
        "  fi",
        f"  step Python {q(env.python)}",
        f"  if ! uv python find {q(env.python)} >/dev/null; then",  # uv's own reason stays in the log
        f"    step no Python {q(env.python)} uv can use here '(its reason above)': uv installs one",
        f"    uv python install {q(env.python)}",
        "  fi",
        f"  step virtualenv {q(env.venv_path)}",
        # --seed: install_tpu_post_train_extra_deps runs `python -m pip install uv`.
        f"  uv venv --clear --seed --python {q(env.python)} {venv}",
        f"  step packages {q(' '.join(env.packages))}",
        f"  {'env ' + install_env + ' ' if install_env else ''}{' '.join(install)}",
    ]
    for command in env.post_install:
        lines += [f"  step {q(command)} '(silent for minutes)'", f"  (source {venv}/bin/activate && {command})"]
    lines += [f"  echo {digest(env)} > {stamp}"]
    if cache:
        lines += [
            "  step keeping the environment in the bucket for the next new VM",
            f'  step "$({kept.format("store")})"',
        ]
    lines += ["fi", f"touch {q(ready_file)}", "step environment ready"]
    return "\n".join(lines) + "\n"
