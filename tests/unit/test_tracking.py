"""results.wandb and results.mlflow: what the plan gives train, the W&B key's way to it, and a real MLflow server
receiving a run as fab metrics reads it. (The W&B run itself, offline, is on the CPU tier: with a key in
test_real_pipeline, with none in test_real_loss.)"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bootstrap.jobs import before, load, plan, tracking
from bootstrap.paths import REPO
from bootstrap.remote import jobrunner, wandb_run
from bootstrap.results import mlflow_log
from tests import mlflowserver

KEY = "wandb-key-" + "7" * 30


def jobs_with(tmp_path: Path, **results) -> Path:
    """The shipped jobs/ with these results.* settings."""
    jobs = tmp_path / "jobs"
    shutil.copytree(REPO / "jobs", jobs)
    data = yaml.safe_load((jobs / "pipeline.yaml").read_text())
    data["results"].update(results)
    (jobs / "pipeline.yaml").write_text(yaml.safe_dump(data))
    return jobs


def planned(jobs: Path, run: str = "run-7") -> plan.Plan:
    return plan.build(load.read(jobs), [], run)


def test_wandb_on_gives_train_the_project_this_runs_name_and_its_key_and_the_environment_wandb(tmp_path):
    built = planned(jobs_with(tmp_path, wandb="grpo-llama"))
    train = built.job("train").runner_spec
    assert {k: v for k, v in train["env"].items() if "WANDB" in k} == {
        wandb_run.PROJECT_ENV: "grpo-llama",
        wandb_run.RUN_ENV: "run-7",
        "WANDB_DIR": "~/tpu-rl/runs/run-7/wandb",  # the run's folder on the VM: an offline run is kept there
        "WANDB_CONSOLE": "off",  # train's console would reach W&B unredacted
    }
    assert train["optional_secrets"] == [tracking.KEY] and tracking.KEY not in train["secrets"]
    assert built.spec.environment.packages == ["maxtext[tpu-post-train]==0.2.3", tracking.WANDB_PACKAGE]
    for job in built.jobs:  # no other job gets W&B
        if job.name != "train":
            assert not any("WANDB" in k for k in job.runner_spec["env"]) and "optional_secrets" not in job.runner_spec


def test_wandb_off_disables_it_in_train_and_changes_nothing_else(tmp_path):
    """tunix logs to W&B whenever wandb imports: off unless asked, nothing leaves the VM for W&B."""
    built = planned(jobs_with(tmp_path))
    assert built.job("train").runner_spec["env"]["WANDB_MODE"] == "disabled"
    assert "optional_secrets" not in built.job("train").runner_spec
    assert not any("wandb" in package for package in built.spec.environment.packages)


def test_a_wandb_the_user_pins_is_kept_and_not_added_twice(tmp_path):
    jobs = jobs_with(tmp_path, wandb="p")
    data = yaml.safe_load((jobs / "pipeline.yaml").read_text())
    data["environment"]["packages"].append("WandB==0.30.0")
    (jobs / "pipeline.yaml").write_text(yaml.safe_dump(data))
    assert planned(jobs).spec.environment.packages[1:] == ["WandB==0.30.0"]


def test_the_key_goes_to_the_vm_only_when_set_and_wandb_is_on(tmp_path, monkeypatch):
    on = planned(jobs_with(tmp_path, wandb="p")).spec.results
    monkeypatch.delenv(tracking.KEY, raising=False)
    assert tracking.secret_values(on) == {tracking.KEY: ""}  # replaces a key stored before: offline, as said
    monkeypatch.setenv(tracking.KEY, KEY)
    assert tracking.secret_values(on) == {tracking.KEY: KEY}
    assert tracking.secret_values(on.model_copy(update={"wandb": ""})) == {}


def test_train_gets_an_optional_secret_only_where_the_vm_holds_it(tmp_path):
    """(An empty one, stored when the key is not set here, replaces a key stored before: train gets "", offline.)"""
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "HF_TOKEN").write_text("hf_x\n")
    spec = {"secrets_dir": str(folder), "secrets": ["HF_TOKEN"], "optional_secrets": [tracking.KEY]}
    assert jobrunner._secret_env(spec) == {"HF_TOKEN": "hf_x"}
    (folder / tracking.KEY).write_text(KEY)
    assert jobrunner._secret_env(spec) == {"HF_TOKEN": "hf_x", tracking.KEY: KEY}
    (folder / "HF_TOKEN").unlink()
    with pytest.raises(FileNotFoundError):  # a required one missing still stops the job
        jobrunner._secret_env(spec)


def test_fab_plan_says_where_the_run_is_tracked_and_how(tmp_path):
    built = planned(jobs_with(tmp_path, wandb="grpo", mlflow="http://mlflow.example:5000"))
    with_key = before.notes(built, "tpu-rl", None, {"HF_TOKEN", tracking.KEY})
    without = before.notes(built, "tpu-rl", None, {"HF_TOKEN"})
    assert "W&B:      train logs live to project grpo, run run-7 (its key set here)" in with_key
    assert (
        f"W&B:      train logs live to project grpo, run run-7 (no {tracking.KEY} here: logged offline on the VM)"
        in without
    )
    assert "MLflow:   fab logs the run to http://mlflow.example:5000 at its end and with fab metrics" in without


def test_wandb_is_said_unreachable_when_no_connection_opens_and_reachable_when_one_does():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused
        assert wandb_run.unreachable(f"http://127.0.0.1:{port}", timeout=5).startswith(f"127.0.0.1:{port} cannot")
        closed.listen()
        assert wandb_run.unreachable(f"http://127.0.0.1:{port}", timeout=5) is None


SERIES = {"rewards/train/score/mean": {1: 0.25, 2: 0.5}, "actor/train/kl": {1: 0.01, 2: 0.02}}
EVALS = [
    {"phase": "pre", "step": None, "accuracy": 10.0, "format_accuracy": 50.0, "mean_reward": 0.1},
    {"phase": "eval", "step": 2, "accuracy": 20.0, "format_accuracy": 60.0, "mean_reward": 0.2},
]


def test_mlflow_receives_the_run_once_and_later_steps_only_once(mlflow_server, monkeypatch):
    """What fab metrics logs mid-run, then again at the end: each (metric, step) once, the parameters once, the
    run FINISHED only when every job is done, the result as numbers and as its line."""
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "mlflow-token-123")  # a server without auth ignores it
    running = {"jobs": {"train": {"state": "running"}}, "evals": EVALS, "result": None, "time_split": None}
    diverged = {**SERIES, "actor/train/loss": {1: float("nan"), 2: 0.3}}  # JSON has no NaN: left out, nothing else
    page = mlflow_log.log_run(
        mlflow_server, "run-a", "id-a", {"run": "run-a", "train.learning_rate": "3e-4"}, diverged, running
    )
    assert page.startswith(f"{mlflow_server}/#/experiments/")
    first = mlflowserver.logged(mlflow_server, "id-a")
    assert first["run"]["info"]["status"] == "RUNNING"
    assert first["history"]["rewards/train/score/mean"] == {1: 0.25, 2: 0.5}
    assert first["history"]["eval/accuracy"] == {0: 10.0, 2: 20.0}
    assert first["history"]["actor/train/loss"] == {2: 0.3}

    series = {tag: {**values, 3: values[2] * 2} for tag, values in SERIES.items()}
    evals = [*EVALS, {"phase": "post", "step": None, "accuracy": 40.0, "format_accuracy": 90.0, "mean_reward": 0.4}]
    result = {"before": 10.0, "after": 40.0, "change": 30.0, "interval": 12.5, "line": "GSM8K accuracy 10% -> 40%"}
    done = {"jobs": {"train": {"state": "done"}}, "evals": evals, "result": result, "time_split": {"step_s": 1.5}}
    mlflow_log.log_run(mlflow_server, "run-a", "id-a", {"run": "run-a", "train.learning_rate": "3e-4"}, series, done)
    final = mlflowserver.logged(mlflow_server, "id-a")  # asserts no (metric, step) twice
    assert final["run"]["info"]["status"] == "FINISHED"
    assert final["history"]["rewards/train/score/mean"] == {1: 0.25, 2: 0.5, 3: 1.0}
    assert final["history"]["eval/accuracy"] == {0: 10.0, 2: 20.0, 3: 40.0}
    assert final["history"]["result/change"] == {3: 30.0} and final["history"]["time/step_s"] == {3: 1.5}
    data = final["run"]["data"]
    assert {p["key"]: p["value"] for p in data["params"]} == {"run": "run-a", "train.learning_rate": "3e-4"}
    assert {t["key"]: t["value"] for t in data["tags"]}["tpu-rl.result"] == result["line"]


def test_a_failed_run_is_failed_in_mlflow(mlflow_server):
    failed = {"jobs": {"train": {"state": "failed"}, "convert": {"state": "done"}}, "evals": []}
    mlflow_log.log_run(mlflow_server, "run-f", "id-f", {"run": "run-f"}, SERIES, failed)
    assert mlflowserver.logged(mlflow_server, "id-f")["run"]["info"]["status"] == "FAILED"


def test_an_mlflow_server_out_of_reach_is_one_line_without_its_credentials(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "mlflow-token-456")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        with pytest.raises(mlflow_log.MlflowError) as raised:
            mlflow_log.log_run(url, "run-b", "id-b", {}, SERIES, {"jobs": {}})
    said = str(raised.value)
    assert said.startswith(f"{url} cannot be reached") and "\n" not in said and "mlflow-token" not in said


REFUSED_RUN = """
import sys
from bootstrap.remote import wandb_run
assert wandb_run.prepare(run_id="0123456789abcdef")
import wandb
run = wandb.init(project="tunix", name="2026-12-04_12-00-00", anonymous="allow")  # as tunix's metrax backend calls it
for step in range(3):
    wandb.log({"rewards/train/score/mean": step / 2}, step=step)
print("found:", run.id, run.name, run.project, run.settings.mode)
wandb.finish()
"""


class Refusing:
    """A W&B server that refuses every key (401), as W&B answers a revoked one."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def refuse(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b'{"errors": [{"message": "user is not logged in"}]}'
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = refuse

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


def test_a_key_w_and_b_refuses_never_stops_train_it_logs_offline_under_the_runs_name(tmp_path):
    """wandb.init raises on a refused key, and tunix calls it unguarded: train would die. It goes on offline."""
    refusing = Refusing()
    env = {
        **os.environ,
        wandb_run.PROJECT_ENV: "grpo",
        wandb_run.RUN_ENV: "run-7",
        "WANDB_DIR": str(tmp_path),
        tracking.KEY: "0123456789abcdef" * 2 + "01234567",  # a key of W&B's shape, refused
        "WANDB_BASE_URL": refusing.url,
    }
    done = subprocess.run(
        [sys.executable, "-c", REFUSED_RUN], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    refusing.server.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("found:")]
    assert found == ["0123456789abcdef", "run-7", "grpo", "offline"]  # the run's identity, its name
    assert "[tpu-rl] W&B: W&B refused the run or did not answer" in done.stderr
    assert list(tmp_path.glob("wandb/offline-run-*-0123456789abcdef/run-0123456789abcdef.wandb"))
    assert env[tracking.KEY] not in done.stdout + done.stderr


class Answering:
    """An HTTP server that answers every request with one fixed reply, and keeps what it was sent."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[dict] = []
        kept = self.requests

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self):
                size = int(self.headers.get("Content-Length") or 0)
                kept.append({"path": self.path, "headers": dict(self.headers), "body": self.rfile.read(size)})
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("body", [b"{}", b"[]", b"null", b'"ok"', b"<html>a proxy's page</html>", b'{"experiment": 3}'])
def test_an_answer_that_is_not_mlflows_is_one_line_never_a_traceback(body):
    other = Answering(200, body)
    try:
        with pytest.raises(mlflow_log.MlflowError) as raised:
            mlflow_log.log_run(other.url, "run-s", "id-s", {}, SERIES, {"jobs": {}})
    finally:
        other.close()
    assert "\n" not in str(raised.value) and str(raised.value)


def test_a_redirect_is_refused_and_the_token_never_follows_it(monkeypatch):
    """urllib would send the Authorization header on to wherever a redirect points."""
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "mlflow-token-789")
    elsewhere = Answering(200, b"{}")
    redirecting = Answering(302, b"", {"Location": f"{elsewhere.url}/api/2.0/mlflow/experiments/get-by-name"})
    try:
        with pytest.raises(mlflow_log.MlflowError, match="HTTP 302"):
            mlflow_log.log_run(redirecting.url, "run-r", "id-r", {}, SERIES, {"jobs": {}})
    finally:
        redirecting.close(), elsewhere.close()
    assert elsewhere.requests == []
    (asked,) = redirecting.requests
    assert asked["headers"]["Authorization"] == "Bearer mlflow-token-789"  # sent to the server itself, as set


def test_basic_credentials_are_sent_when_no_token_is_set(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "me")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw-123")
    refusing = Answering(401, b'{"error_code": "UNAUTHENTICATED", "message": "no"}')
    try:
        with pytest.raises(mlflow_log.MlflowError, match="HTTP 401 UNAUTHENTICATED"):
            mlflow_log.log_run(refusing.url, "run-c", "id-c", {}, SERIES, {"jobs": {}})
    finally:
        refusing.close()
    assert refusing.requests[0]["headers"]["Authorization"] == "Basic bWU6cHctMTIz"  # me:pw-123


def test_two_runs_of_one_name_are_two_mlflow_runs_and_each_is_logged_once_again(mlflow_server, monkeypatch):
    """Another stack's or user's run named like this one is another MLflow run, with its own parameters and losses;
    logging one run again adds nothing twice and sends its parameters once."""
    running = {"jobs": {"train": {"state": "done"}, "export": {"state": "running"}}, "evals": []}
    mlflow_log.log_run(mlflow_server, "same-name", "id-one", {"lr": "1e-3"}, {"loss": {1: 1.0}}, running)
    mlflow_log.log_run(mlflow_server, "same-name", "id-two", {"lr": "3e-4"}, {"loss": {1: 2.0}}, running)
    one, two = mlflowserver.logged(mlflow_server, "id-one"), mlflowserver.logged(mlflow_server, "id-two")
    assert one["run"]["info"]["run_id"] != two["run"]["info"]["run_id"]
    assert one["run"]["info"]["run_name"] == two["run"]["info"]["run_name"] == "same-name"
    assert {p["value"] for p in one["run"]["data"]["params"]} == {"1e-3"} and one["history"]["loss"] == {1: 1.0}
    assert {p["value"] for p in two["run"]["data"]["params"]} == {"3e-4"} and two["history"]["loss"] == {1: 2.0}
    assert one["run"]["info"]["status"] == "RUNNING"  # export still runs: not FINISHED
    calls = []
    real = mlflow_log.Server.call
    monkeypatch.setattr(mlflow_log.Server, "call", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    mlflow_log.log_run(mlflow_server, "same-name", "id-one", {"lr": "1e-3"}, {"loss": {1: 1.0, 2: 0.5}}, running)
    assert not [a for a in calls if a[1] == "runs/log-batch" and "params" in a[2]]  # the parameters once
    assert mlflowserver.logged(mlflow_server, "id-one")["history"]["loss"] == {1: 1.0, 2: 0.5}


def test_no_wandb_key_here_is_no_missing_secret_on_the_vm(tmp_path):
    """results.wandb on and no WANDB_API_KEY here (the README's offline path): the empty key fab stores replaces the
    VM's, and the VM's preflight checks only the secrets that have a value, so train starts and logs offline."""
    from types import SimpleNamespace

    from bootstrap.vm import pipeline

    built = planned(jobs_with(tmp_path, wandb="grpo"))
    session = SimpleNamespace(plan=built, secrets={"HF_TOKEN": "hf_" + "t" * 34, tracking.KEY: ""})
    checked = pipeline.preflight_request(session)["secrets"]
    assert sorted(checked) == ["HF_TOKEN"]


def test_the_runs_identity_is_its_first_starts_and_no_other_run_has_it(tmp_path):
    from bootstrap.remote import attempts

    first = attempts.record(str(tmp_path / "a"), {"started": 1.0})
    attempts.record(str(tmp_path / "a"), {"started": 2.0})  # a later start of the same run: the same identity
    other = attempts.record(str(tmp_path / "b"), {"started": 1.0})  # another run of the same name, elsewhere
    same = attempts.run_identity(attempts.record_names(str(tmp_path / "a")))
    assert same == attempts.run_identity([first.rsplit("/", 1)[1]]) and len(same) == 16
    assert attempts.run_identity([other.rsplit("/", 1)[1]]) != same
    assert attempts.run_identity([]) is None
