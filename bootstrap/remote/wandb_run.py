"""Train's W&B run named after this run, and never a reason for train to stop or hang.

tunix (MaxText's RL trainer) logs every scalar to W&B whenever `wandb` imports: metrax's WandbBackend calls
wandb.init with the project "tunix" and a timestamp as the run's name, arguments that beat W&B's own environment
variables. With results.wandb on, fab sets the two variables below and the launcher (maxtext_run.py) calls
`prepare`: wandb.init then takes this project, this run's name, and the run's identity as its id (a later start
of the same run, on this VM or a new one, carries on the same W&B run; another run of the same name, another
stack's or user's, never does), and falls back to offline mode, said once, when no key was given, W&B cannot be
reached, or it refuses the run. Offline runs stay in WANDB_DIR (`wandb sync` sends them).
Stdlib only.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Callable, MutableMapping
from urllib.parse import urlsplit

PROJECT_ENV = "TPU_RL_WANDB_PROJECT"
RUN_ENV = "TPU_RL_WANDB_RUN"
DEFAULT_BASE_URL = "https://api.wandb.ai"
REACH_SECONDS = 10  # a TCP connection to W&B's host: longer, and train's start waits on a network that is not there
INIT_SECONDS = 60  # how long wandb.init may wait for W&B's answer before train goes on offline


def _say(line: str) -> None:
    print(f"[tpu-rl] W&B: {line}", file=sys.stderr, flush=True)


def unreachable(base_url: str, timeout: float = REACH_SECONDS) -> str | None:
    """Why W&B's server at `base_url` cannot be reached from here, or None when a connection opens."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
    except OSError as err:
        return f"{parts.hostname}:{port} cannot be reached ({err.strerror or err})"
    return None


def prepare(
    environ: MutableMapping[str, str] = os.environ, say: Callable[[str], None] = _say, run_id: str | None = None
) -> bool:
    """Name train's W&B run after this run, its id the run's identity (`run_id`: attempts.run_identity, which no
    other run of the same name has), and make it fall back to offline mode; False when W&B is off or not installed
    (tunix then logs nowhere but TensorBoard)."""
    project, run = environ.get(PROJECT_ENV), environ.get(RUN_ENV)
    if not project or not run:
        return False
    if run_id is None:
        run_id = uuid.uuid4().hex[:16]
        say("no record of this run's first start: this start is logged as a W&B run of its own")
    try:
        import wandb
    except ImportError:
        say("the environment has no wandb: this run logs to TensorBoard only")
        return False
    folder = f"{environ.get('WANDB_DIR', '.')}/wandb"

    def offline(why: str) -> None:
        environ["WANDB_MODE"] = "offline"
        say(f"{why}: logging offline in {folder} (send it later: wandb sync {folder}/offline-run-*)")

    if not environ.get("WANDB_API_KEY"):
        offline("no WANDB_API_KEY was set where fab ran")
    elif why := unreachable(environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL):
        offline(why)
    init = wandb.init

    def named_init(*args, **kwargs):
        kwargs.update(project=project, name=run, id=run_id, resume="allow")
        kwargs.pop("anonymous", None)  # tunix's "allow": logged in, or offline, it means nothing
        kwargs["settings"] = wandb.Settings(init_timeout=INIT_SECONDS)
        try:
            return init(*args, **kwargs)
        except Exception as err:  # noqa: BLE001  any refusal: train carries on, its scalars kept here
            if environ.get("WANDB_MODE") != "offline":
                offline(f"W&B refused the run or did not answer ({type(err).__name__})")
        try:
            wandb.teardown()  # the refused run is still registered in wandb's service: offline, start afresh
            return init(*args, **{**kwargs, "mode": "offline"})
        except Exception as err:  # noqa: BLE001  not even offline: no W&B run, train goes on
            say(f"cannot log even offline ({type(err).__name__}): this run logs to TensorBoard only")
            wandb.teardown()
            return init(*args, **{**kwargs, "mode": "disabled"})

    wandb.init = named_init
    if environ.get("WANDB_MODE") != "offline":
        say(f"logging to project {project}, run {run}")
    return True
