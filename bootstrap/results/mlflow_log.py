"""A run logged to an MLflow tracking server (results.mlflow): its parameters, scalars, evals and result.

fab logs from this machine, after `fab metrics` has read the run's numbers, so MLflow holds exactly what
metrics.csv, evals.csv and summary.json hold, and its credentials never reach the VM. It speaks MLflow's REST API
(five calls) rather than importing mlflow, a large package for so little. Logging again adds only the steps the
server lacks: `fab metrics` during the run, then at its end, leaves one series with each step once.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..remote import retry

if TYPE_CHECKING:  # metrics imports matplotlib and TensorBoard: only its type here
    from .metrics import Series

EXPERIMENT = "tpu-rl"  # unless MLFLOW_EXPERIMENT_NAME says another, as MLflow's own client reads it
TIMEOUT_SECONDS = 30
BATCH = 1000  # MLflow's most metrics in one log-batch
PARAMS_BATCH = 100  # and its most parameters
PARAM_CHARS = 500  # the longest parameter value every MLflow server keeps
NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"


RUN_TAG = "tpu-rl.run-id"  # the run's identity (attempts.run_identity): fab finds its MLflow run by it, never by name


class MlflowError(Exception):
    """The server could not be reached or refused a call: said in one line, the run's own files unaffected."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is refused (an HTTP error): urllib would send the Authorization header on to wherever it points."""

    def redirect_request(self, *args, **kwargs):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class Server:
    """One MLflow tracking server, with the credentials MLflow's own client reads from the environment."""

    def __init__(self, uri: str, environ: dict[str, str] | None = None):
        environ = os.environ if environ is None else environ
        self.uri = uri.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if token := environ.get("MLFLOW_TRACKING_TOKEN"):
            self.headers["Authorization"] = f"Bearer {token}"
        elif (user := environ.get("MLFLOW_TRACKING_USERNAME")) and (
            password := environ.get("MLFLOW_TRACKING_PASSWORD")
        ):
            self.headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.experiment = environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT

    def call(self, method: str, path: str, body: dict | None = None, query: str = "") -> dict:
        request = urllib.request.Request(
            f"{self.uri}/api/2.0/mlflow/{path}{query}",
            data=None if body is None else json.dumps(body).encode(),
            headers=self.headers,
            method=method,
        )
        try:
            answer = json.loads(retry.within(lambda: _read(request), TIMEOUT_SECONDS) or b"{}")  # however slow
        except urllib.error.HTTPError as err:
            answer = _json(err.read())
            raise MlflowError(
                f"{path}: HTTP {err.code} {answer.get('error_code', '')} {answer.get('message', '')[:200]}".rstrip()
            ) from None
        except (OSError, ValueError, http.client.HTTPException) as err:
            raise MlflowError(f"{self.uri} cannot be reached ({type(err).__name__})") from None
        if not isinstance(answer, dict):
            raise MlflowError(f"{path}: {self.uri} answered {type(answer).__name__}, not MLflow's JSON object")
        return answer

    def experiment_id(self) -> str:
        """The experiment's id, created the first time."""
        try:
            found = self.call("GET", "experiments/get-by-name", query=f"?experiment_name={_quoted(self.experiment)}")
            return _text(found, "experiment", "experiment_id")
        except MlflowError as err:
            if NOT_FOUND not in str(err):
                raise
        return _text(self.call("POST", "experiments/create", {"name": self.experiment}), "experiment_id")

    def find_run(self, experiment_id: str, identity: str) -> dict | None:
        """The run logged under this run's identity before, with its latest metrics; None the first time."""
        found = self.call(
            "POST",
            "runs/search",
            {"experiment_ids": [experiment_id], "filter": f"tags.`{RUN_TAG}` = '{identity}'", "max_results": 1},
        )
        runs = found.get("runs") or []
        if not isinstance(runs, list) or not all(isinstance(run, dict) for run in runs):
            raise MlflowError(f"runs/search: {self.uri} answered runs that are not MLflow's")
        return runs[0] if runs else None


def log_run(uri: str, name: str, identity: str, params: dict[str, str], series: Series, summary: dict) -> str:
    """Log the run `name` to the server at `uri`, found again by its `identity` (attempts.run_identity), never by its
    name, which another run may share: parameters once, then every (metric, step) it lacks; the run FINISHED once
    every job is done, FAILED once one failed. Returns the run's page; raises MlflowError."""
    server = Server(uri)
    experiment_id = server.experiment_id()
    run = server.find_run(experiment_id, identity)
    if run is None:
        created = server.call(
            "POST",
            "runs/create",
            {
                "experiment_id": experiment_id,
                "run_name": name,
                "start_time": _now(),
                "tags": [_tag(RUN_TAG, identity), _tag("tpu-rl.run", name)],
            },
        )
        run = created.get("run")
    run_id = _text(run, "info", "run_id")
    data = run.get("data") if isinstance(run.get("data"), dict) else {}
    try:
        latest = {m["key"]: int(m.get("step", 0)) for m in data.get("metrics") or []}
    except (AttributeError, KeyError, TypeError, ValueError):
        raise MlflowError("runs/search answered metrics that are not MLflow's") from None
    if not data.get("params"):  # once: a parameter never changes (an earlier try may have failed)
        items = [{"key": _key(k), "value": str(v)[:PARAM_CHARS]} for k, v in params.items()]
        for start in range(0, len(items), PARAMS_BATCH):
            server.call("POST", "runs/log-batch", {"run_id": run_id, "params": items[start : start + PARAMS_BATCH]})
    points = [p for p in metric_points(series, summary) if p["step"] > latest.get(p["key"], -1)]
    for start in range(0, len(points), BATCH):
        server.call("POST", "runs/log-batch", {"run_id": run_id, "metrics": points[start : start + BATCH]})
    if summary.get("result") and (line := summary["result"].get("line")):
        server.call("POST", "runs/set-tag", {"run_id": run_id, "key": "tpu-rl.result", "value": line[:PARAM_CHARS]})
    states = {job.get("state") for job in summary.get("jobs", {}).values()}
    if ended := "FAILED" if "failed" in states else "FINISHED" if states == {"done"} else None:
        server.call("POST", "runs/update", {"run_id": run_id, "status": ended, "end_time": _now()})
    return f"{server.uri}/#/experiments/{experiment_id}/runs/{run_id}"


def _text(found, *keys: str) -> str:
    """found[keys[0]][keys[1]]...: an id MLflow answers with; MlflowError when the answer is not MLflow's."""
    for key in keys:
        found = found.get(key) if isinstance(found, dict) else None
    if not isinstance(found, str) or not found:
        raise MlflowError(f"answered without {'.'.join(keys)}: not an MLflow tracking server?")
    return found


def _read(request: urllib.request.Request) -> bytes:
    with _OPENER.open(request, timeout=TIMEOUT_SECONDS) as response:
        return response.read()


def metric_points(series: Series, summary: dict) -> list[dict]:
    """Every number fab metrics wrote, as MLflow metrics: the training scalars by step (metrics.csv), each eval
    at its step (evals.csv: before at 0, after at the last step), the result, where train's time went and the
    run's goodput with each cause's seconds at the last step (summary.json)."""
    now = _now()
    last = max((max(values) for values in series.values() if values), default=0)
    points = [_point(tag, value, step, now) for tag, values in series.items() for step, value in values.items()]
    for e in summary.get("evals", []):
        step = {"pre": 0, "post": last}.get(e["phase"], e.get("step") or 0)
        for field in ("accuracy", "format_accuracy", "partial_accuracy", "mean_reward"):
            if isinstance(e.get(field), int | float):
                points.append(_point(f"eval/{field}", e[field], step, now))
        if measured := e.get("task"):  # the task's own measure of that eval: what judges the run
            points.append(_point(f"eval/task/{measured['measure']}", measured["value"], step, now))
    found = summary.get("goodput") or {}
    spent = {"share": found.get("share"), "paid_s": found.get("paid_s"), "productive_s": found.get("productive_s"),
             **{f"badput/{cause}_s": seconds for cause, seconds in (found.get("badput_s") or {}).items()}}  # fmt: skip
    for prefix, numbers in (
        ("result", summary.get("result") or {}), ("time", summary.get("time_split") or {}), ("goodput", spent)
    ):  # fmt: skip
        points += [_point(f"{prefix}/{k}", v, last, now) for k, v in _numbers(numbers)]
    return [p for p in points if math.isfinite(p["value"])]  # JSON has no NaN: MLflow would drop the batch's rest


def _numbers(found: dict) -> Iterator[tuple[str, float]]:
    return ((k, float(v)) for k, v in found.items() if isinstance(v, int | float))


def _point(key: str, value: float, step: int, timestamp: int) -> dict:
    return {"key": _key(key), "value": float(value), "step": int(step), "timestamp": timestamp}


def _key(name: str) -> str:
    """A name as MLflow accepts it: letters, digits, _ - . / and spaces."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)[:250]


def _tag(key: str, value: str) -> dict:
    return {"key": key, "value": value}


def _quoted(text: str) -> str:
    return urllib.request.quote(text, safe="")


def _now() -> int:
    return int(time.time() * 1000)


def _json(data: bytes) -> dict:
    try:
        found = json.loads(data)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
