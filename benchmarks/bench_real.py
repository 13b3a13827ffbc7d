"""The real MaxText jobs on CPU: fab train against the same three jobs run by hand over plain ssh.

    .venv/bin/python benchmarks/bench_real.py [--fresh-venv]

On the loopback host of the CPU tier (tests/maxtext_cpu): `fab setup` (timed; --fresh-venv builds
the environment into a new folder, to time the install from PyPI), the tiny inputs, then
1. by hand: the argv and environment of convert, train and export from `fab plan --json`, each run
   with a plain `ssh host '...'`, back to back (no state, no checks, no progress);
2. `fab train` doing the same jobs (same overrides, its own output folders, a new run): token
   check, lock, MaxText's validator, detached jobs, followed logs, verified outputs.
Prints both wall times and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_fab import timed  # noqa: E402  (this folder is on sys.path when run as a script)

from bootstrap.demo import MAKE_INPUTS  # noqa: E402
from bootstrap.remote.jobrunner import DEFERRED  # noqa: E402
from tests import hubstub  # noqa: E402
from tests.loopback import Fab, edit_yaml, loopback_host, write_test_jobs  # noqa: E402
from tests.maxtext_cpu.conftest import HOST_ENV, VENV, environment, overrides  # noqa: E402


def by_hand(fab: Fab, args: list[str], steps: int) -> float:
    """The three jobs with a plain ssh each, as a user following the guide would run them."""
    plan = json.loads(fab("plan", "--json", *args).stdout)
    token_file = fab.tmp / "state" / "secrets" / "HF_TOKEN"
    host = fab.host
    ssh = ["ssh", "-q", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-i", str(host.key)]
    started = time.perf_counter()
    for job in plan["jobs"]:
        if job["module"] is None:
            continue  # prefetch: the cache is already there
        env = " ".join(f"{k}={word(v, steps)}" for k, v in job["env"].items() if k != "HF_TOKEN")
        secret = f"HF_TOKEN=$(cat {token_file})"
        command = f"cd && env {env} {secret} {' '.join(word(a, steps) for a in job['argv'])} >{fab.tmp}/{job['name']}.log 2>&1"
        for after in job["after"]:
            command += f" && env {env} {secret} " + " ".join(word(a, steps) for a in after)
        subprocess.run([*ssh, "-p", str(host.port), f"{host.user}@127.0.0.1", command], check=True)
    return time.perf_counter() - started


def word(text: str, steps: int) -> str:
    """One shell word, with what the runner would look up on the VM filled in by hand."""
    text = DEFERRED.sub(lambda m: socket.gethostname() if m[1] == "hostname" else str(steps), text)
    return "$HOME/" + shlex.quote(text[2:]) if text.startswith("~/") else shlex.quote(text)


@contextmanager
def cpu_fab(venv: Path = VENV) -> Iterator[Fab]:
    """fab against the CPU tier's loopback host and the Hub stand-in, the jobs' environment in `venv`."""
    with tempfile.TemporaryDirectory() as directory, loopback_host(Path(directory) / "sshd", HOST_ENV) as host:
        tmp = Path(directory)
        hub, server = hubstub.serve()
        token = "hf_bench" + uuid.uuid4().hex
        hub.tokens[token] = hubstub.Token()
        jobs = tmp / "jobs"
        write_test_jobs(jobs, tmp, [])
        env = {**environment(), "venv": str(venv)}
        edit_yaml(jobs / "pipeline.yaml", lambda data: data.update(environment=env))
        edit_yaml(jobs / "pipeline.yaml", lambda data: data["vm"].update(validate_args=True))
        try:
            yield Fab(host, tmp, token, jobs, hub)
        finally:
            server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh-venv", action="store_true", help="build the environment anew, to time the install")
    options = parser.parse_args()
    venv = Path(tempfile.mkdtemp()) / "venv" if options.fresh_venv else VENV
    with cpu_fab(venv) as fab:
        tmp = fab.tmp
        setup = timed(fab, "setup")
        inputs = tmp / "inputs"
        subprocess.run([venv / "bin" / "python", MAKE_INPUTS, inputs], check=True, capture_output=True)
        steps = 4
        base = [word for o in overrides(inputs, steps) for word in ("--arg", o)]
        timed(fab, "train", *base, "--arg", f"vars.work_dir={tmp}/warm", "--run-name", "warm")  # caches, prefetch
        manual = by_hand(fab, [*base, "--arg", f"vars.work_dir={tmp}/manual", "--run-name", "manual"], steps)
        with_fab = timed(fab, "train", *base, "--arg", f"vars.work_dir={tmp}/fab", "--run-name", "fab")
    print(f"fab setup ({'fresh venv: the install from PyPI' if options.fresh_venv else 'cached venv'})  {setup:7.1f} s")
    print(f"convert, train, export by hand over plain ssh                  {manual:7.1f} s")
    print(f"the same through fab train                                     {with_fab:7.1f} s")
    print(f"  ratio                                                        {with_fab / manual:7.2f}")


if __name__ == "__main__":
    main()
