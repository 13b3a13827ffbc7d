"""The gke pipeline's driver, run in the cluster: brings the plan's JobSets to done with no laptop watching.

Standard library only: the MaxText image's python3 runs it, with the tools from the
ConfigMap beside it (jobsets.driver_jobset). fab hands it the plan it rendered and checked
in TPU_RL_PLAN (each job's JobSet, its needs, whether to start it), never code to render
again. It makes the VM driver's decisions (graph.Graph) by the rule fab uses for a
JobSet's state (jobset_state): through the Kubernetes API as the pod's service account,
which may only get, create and delete this namespace's JobSets (infra/gke.py), and Cloud
Storage through the pod's Workload Identity. Its log is its events, one JSON object a line.

    gke_driver.py SERVICE_ACCOUNT_DIR NAMESPACE

Exit 0: every job is done; 3: a job failed (the pipeline is over, as on the VM: the next
fab train retries it); anything else (the API gone for longer than retry.RETRY_SECONDS, a bug):
the driver itself failed, and its Job starts another pod, whose new pass adopts the
JobSets that run.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

try:
    from . import gcs, jobset_state, retry  # on this machine: bootstrap.remote.gke_driver
    from .graph import Graph, PipelineState
except ImportError:
    import gcs  # in the cluster: beside this file in the tools folder
    import jobset_state
    import retry
    from graph import Graph, PipelineState

POLL_SECONDS = float(os.environ.get("TPU_RL_GKE_POLL_SECONDS", "3"))  # the tests' cluster answers at once
TIMEOUT_SECONDS = 60
PIPELINE_FAILED, DRIVER_FAILED = 3, 2  # jobsets.driver_jobset's podFailurePolicy ends the Job on the first


class KubeApi:
    """This namespace's JobSets through the API server, as the pod's service account (jobset_state.Api)."""

    def __init__(self, account_dir: str, namespace: str):
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        host = f"[{host}]" if ":" in host else host
        self.base = f"https://{host}:{port}/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"
        self.token_file = os.path.join(account_dir, "token")
        self.tls = ssl.create_default_context(cafile=os.path.join(account_dir, "ca.crt"))

    def get(self, name: str) -> dict | None:
        return self._call("GET", f"/{name}", missing_ok=True)

    def create(self, jobset: dict) -> None:
        self._call("POST", "", jobset, exists_ok=True)

    def delete(self, name: str, uid: str) -> None:
        body = {"propagationPolicy": "Foreground", "preconditions": {"uid": uid}}
        self._call("DELETE", f"/{name}", body, missing_ok=True, exists_ok=True)  # 409: replaced meanwhile

    def _call(self, method: str, path: str, body: dict | None = None, missing_ok=False, exists_ok=False):
        """One request with a fresh token (the kubelet rotates it), through `retrying`."""

        def once():
            with open(self.token_file) as f:
                token = f.read().strip()
            headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
            data = None if body is None else json.dumps(body).encode()
            if data is not None:
                headers["Content-Type"] = "application/json"
            request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, context=self.tls, timeout=TIMEOUT_SECONDS) as answer:
                    return json.load(answer)
            except urllib.error.HTTPError as err:
                if err.code == 404 and missing_ok or err.code == 409 and exists_ok:
                    return None
                if err.code != 429 and err.code < 500:
                    raise Refused(f"{method} {path or 'jobsets'}: {err.code} {err.reason}") from None
                raise

        return retrying(once)


def retrying(call):
    """`call()` under retry.py's policy (what may pass is tried again for 15 minutes); Refused is final."""
    return retry.retrying(call, lambda err: not isinstance(err, Refused) and retry.may_pass(err))


class Refused(Exception):
    """The API refused a request for good (a 4xx: a webhook's or a schema's verdict, or RBAC)."""


class CloudStorage:
    """The bucket as the pod's Workload Identity reads it (jobset_state.Bucket)."""

    def names(self, prefix: str) -> list[str]:
        return gcs.names(prefix)  # gcs.py tries again what may pass, under the same policy

    def read_text(self, url: str) -> str | None:
        data = gcs.read(url)
        return None if data is None else data.decode("utf-8", "replace")


def emit(event: dict) -> None:
    print(json.dumps({"t": time.time(), **event}), flush=True)


def drive(plan: dict, api: jobset_state.Api, bucket: jobset_state.Bucket) -> PipelineState:
    """One pass over the plan: every job to done, or the first failure and what did not need it."""

    def state_of(job: dict) -> dict:
        return jobset_state.state(api.get(job["manifest"]["metadata"]["name"]), bucket)

    def launch(job: dict) -> str | None:
        try:
            jobset_state.launch(job["manifest"], api, bucket)
        except (jobset_state.NoCheckpoint, jobset_state.NotDeleted, Refused) as err:
            return str(err)  # this job fails; what does not need it runs on
        return None

    graph = Graph(plan["jobs"], state_of, launch, lambda tpu: [], emit)
    emit({"event": "pass", "run": plan["run"], "digest": plan["digest"]})
    while graph.step():
        time.sleep(POLL_SECONDS)
    emit({"event": "finished", "state": graph.outcome.value, "failed": graph.failed})
    return graph.outcome


def exit_code(plan: dict, api: jobset_state.Api, bucket: jobset_state.Bucket) -> int:
    """The pass's outcome as the driver's Job reads it (its podFailurePolicy): done, failed, or crashed."""
    try:
        outcome = drive(plan, api, bucket)
    except Exception as err:  # the API or the bucket away for too long, or a bug: this pod, not the pipeline
        emit({"event": "note", "job": "driver", "message": f"stopped ({type(err).__name__}: {err}); restarting"})
        return DRIVER_FAILED
    return 0 if outcome is PipelineState.DONE else PIPELINE_FAILED


def main(argv: list[str]) -> int:
    account_dir, namespace = argv
    return exit_code(json.loads(os.environ["TPU_RL_PLAN"]), KubeApi(account_dir, namespace), CloudStorage())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
