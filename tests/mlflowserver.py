"""A real MLflow tracking server on 127.0.0.1 (MLflow's own `mlflow server`, SQLite behind it): what results.mlflow
logs to in the tests, read back through MLflow's REST API."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bootstrap.results import mlflow_log
from tests.loopback import _free_port, wait_for

START_SECONDS = 180  # its database migrations and workers, on a busy machine


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def server(folder: Path) -> Iterator[str]:
    """Start the server with its store in `folder`; yield its URL; stop it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    mlflow = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--default-artifact-root", str(folder)]
    # Without MLflow's own job runner (a huey consumer for its server-side jobs, which results.mlflow never asks
    # for): it polled all along, a tenth of the quick tier's CPU.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with (folder / "server.log").open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True, env=env
        )
    try:
        wait_for(lambda: _healthy(url) or process.poll() is not None, START_SECONDS, "the MLflow server")
        assert process.poll() is None, (folder / "server.log").read_text()[-3000:]
        yield url
    finally:
        subprocess.run(["pkill", "-TERM", "-s", str(process.pid)], check=False)
        process.wait(timeout=60)


def logged(url: str, identity: str) -> dict:
    """The run of this identity as the server holds it: {"run": its info and data, "history": key -> step -> value}."""
    tracking = mlflow_log.Server(url, {})
    run = tracking.find_run(tracking.experiment_id(), identity)
    assert run is not None, f"no run {identity} on {url}"
    history = {}
    for metric in run["data"].get("metrics", []):
        query = f"?run_id={run['info']['run_id']}&metric_key={urllib.request.quote(metric['key'], safe='')}"
        points = tracking.call("GET", "metrics/get-history", query=query)["metrics"]
        steps = [point["step"] for point in points]
        assert len(steps) == len(set(steps)), f"{metric['key']} logged twice at a step: {sorted(steps)}"
        history[metric["key"]] = {point["step"]: point["value"] for point in points}
    return {"run": run, "history": history}
