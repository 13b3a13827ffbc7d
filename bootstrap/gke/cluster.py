"""The gke backend's cluster, as gke/driving.py uses it: JobSets instead of runner folders.

`Cluster` answers calls like `vm.machine.Vm`'s (install, prepare, states, follow, tail)
through the Kubernetes API with the official client, and starts the pipeline's driver in
the cluster (driving, hand_over), which creates the jobs' JobSets itself. A job's key is
its JobSet's name, and its state is jobset_state's rule, the driver's own: done only when
its JobSet completed, every declared output exists in Cloud Storage and its inputs (the
Hub upload's: the export's SHA256SUMS) are what they were when it was created. Logs come
from a JobSet's head pod, streamed in chunks; a stream that ends while the JobSet runs
(a dropped watch, then a restarted pod) is followed again by the watcher. The
Hugging Face token goes into the Secret the JobSets name.
`fab download` and `fab metrics` read the bucket from this machine (results/transfer.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from google.api_core.exceptions import GoogleAPIError, NotFound
from google.auth.exceptions import DefaultCredentialsError, RefreshError
from google.cloud import storage
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from ..errors import UserError
from ..paths import REPO
from ..remote import jobset_state
from ..results import runs, transfer
from ..vm.machine import JobStatus
from ..vm.output import Cleaner, lines
from .core_api import CoreV1
from .jobsets import (
    NAMESPACE,
    PLAN_DIGEST_ANNOTATION,
    SECRET,
    TOOLS,
    TOOLS_CONFIG_MAP,
    in_bucket,
)

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
HEAD_JOBS = ("pathways-head", "main")  # the replicated job whose pod runs the MaxText module
POLL_SECONDS = float(os.environ.get("TPU_RL_GKE_POLL_SECONDS", "5"))  # the tests' cluster answers at once
POD_ENDED = ("Succeeded", "Failed")
CHUNK = 64 * 1024


class Cluster:
    """One GKE cluster's JobSets in the tpu-rl namespace, and the bucket their outputs go to."""

    def __init__(self, context: str, project: str, bucket: str, cleaner: Cleaner | None = None):
        try:
            api = config.new_client_from_config(context=context)
        except (config.ConfigException, FileNotFoundError):
            raise UserError(
                f"no kubeconfig context {context}: run gcloud container clusters get-credentials (docs/gke.md)"
            ) from None
        self.name, self.bucket = context, bucket
        self.core = CoreV1(api)  # CoreV1Api's calls, without its 4.5 MB module (core_api.py)
        self.custom = client.CustomObjectsApi(api)
        self.storage = storage.Client(project=project)
        self.cleaner = cleaner or Cleaner()

    # --- What the tasks and the pipeline call ------------------------------------------------

    def install(self, *_, meanwhile: Callable[[], None] | None = None) -> str | None:
        """The current run: kept on this machine (the cluster keeps no run of its own). Nothing is asked: `meanwhile`
        runs at once."""
        if meanwhile is not None:
            meanwhile()
        return runs.current_run()

    def prepare(self, secrets: dict[str, str], startup_marker: str) -> tuple[list[str], bool]:
        """The token as the Secret the JobSets reference; tpu-rl's tools (jobsets.TOOLS) as a ConfigMap."""
        self._put(self.core.create_namespaced_secret, self.core.replace_namespaced_secret, SECRET,
                  client.V1Secret(metadata=client.V1ObjectMeta(name=SECRET), string_data=secrets))  # fmt: skip
        tools = {name: (REPO / "bootstrap" / "remote" / name).read_text() for name in TOOLS}
        self._put(self.core.create_namespaced_config_map, self.core.replace_namespaced_config_map, TOOLS_CONFIG_MAP,
                  client.V1ConfigMap(metadata=client.V1ObjectMeta(name=TOOLS_CONFIG_MAP), data=tools))  # fmt: skip
        return [f"stored {', '.join(secrets)} in the Secret {NAMESPACE}/{SECRET}"] if secrets else [], True

    def states(self, keys: list[str]) -> list[JobStatus]:
        return [self._state(key) for key in keys]

    def driving(self, driver: dict) -> bool:
        """Whether the run's driver in the cluster runs this same plan (the command then attaches to it); one
        that runs another plan of the run is refused, before anything is changed."""
        name = driver["metadata"]["name"]
        current = self.get(name)
        if current is None or jobset_state.verdict(current) is not None:
            return False
        self._same_plan(current, driver)
        return True

    def hand_over(self, driver: dict) -> None:
        """Start the pipeline's driver in the cluster (jobsets.driver_jobset), replacing the run's ended one;
        one that another fab created for another plan at the same moment is refused as `driving` does."""
        try:
            jobset_state.launch(driver, self, self)
        except jobset_state.NotDeleted as err:
            raise UserError(f"{self.name}: {err}") from None
        if (current := self.get(driver["metadata"]["name"])) is not None:
            self._same_plan(current, driver)

    def _same_plan(self, current: dict, driver: dict) -> None:
        name = driver["metadata"]["name"]
        if _digest(current) != _digest(driver):
            raise UserError(
                f"{self.name}: the driver {NAMESPACE}/{name} runs another plan of this run (other jobs or --arg); "
                f"wait for it (fab status), or stop it: kubectl -n {NAMESPACE} delete jobset {name} (the jobs it "
                "started run on)"
            )

    def follow(
        self, key: str, on_line: Callable[[str], None], on_idle: Callable[[], None] = lambda: None, read: str = ""
    ) -> str:
        """The head pod's log until its stream ends; while no pod runs yet (queued by Kueue), or only the pod
        `read` already was (its JobSet's verdict still to come, or its Job's next pod), a heartbeat. Returns
        the pod read to its end, if it had ended (else `read`: a dropped stream is read again)."""
        while (pod := self._head_pod(key)) is None or pod.metadata.name == read:
            jobset = self.get(key)
            if jobset is None or jobset_state.verdict(jobset) is not None:  # gone, or ended: nothing more to read
                return read
            on_idle()
            time.sleep(POLL_SECONDS)
        try:
            stream = self.core.read_namespaced_pod_log(
                pod.metadata.name, NAMESPACE, container=pod.spec.containers[0].name, follow=True, _preload_content=False
            )
            for line in lines(stream.stream(CHUNK)):
                on_line(self.cleaner(line))
        except (ApiException, HTTPError, OSError):
            return read  # a dropped watch: the caller asks the state and follows again
        now = self._head_pod(key)
        ended = now is not None and now.metadata.name == pod.metadata.name and now.status.phase in POD_ENDED
        return pod.metadata.name if ended else read

    def tail(self, key: str, count: int, _file: str | None = None) -> list[str]:
        pod = self._head_pod(key)
        if pod is None:
            return []
        name = pod.spec.containers[0].name
        text = self._call(
            self.core.read_namespaced_pod_log, pod.metadata.name, NAMESPACE, container=name, tail_lines=count
        )
        return [self.cleaner(line) for line in text.splitlines()]

    def download(
        self, directory: str, local: Path, on_file: transfer.OnFile = lambda p, s: None, required: bool = True
    ) -> dict[str, int]:
        """A folder of the bucket that grows (TensorBoard events): what is here at its size is kept."""
        return transfer.download(self, self.where(directory), local, on_file, required)

    def download_verified(
        self, directory: str, local: Path, on_file: transfer.OnFile = lambda p, s: None, made_by: str | None = None
    ) -> dict[str, int]:
        """The export from the bucket, every file verified against its SHA256SUMS (transfer.download_verified);
        `made_by` is the VM's alone: the bucket is the project's own, by IAM, with no other account in it."""
        return transfer.download_verified(self, self.where(directory), local, on_file)

    def list_files(self, directory: str) -> dict[str, int]:
        bucket, _, prefix = f"{directory.removeprefix('gs://').rstrip('/')}/".partition("/")
        try:
            blobs = self._storage(lambda: list(self.storage.list_blobs(bucket, prefix=prefix)), directory)
        except NotFound:
            raise UserError(f"{directory}: no bucket gs://{bucket} (is the stack up?)") from None
        return {blob.name[len(prefix) :]: blob.size for blob in blobs if not blob.name.endswith("/")}

    def read_text(self, path: str) -> str | None:
        blob = storage.Blob.from_string(path, client=self.storage)
        try:
            return self._storage(lambda: blob.download_as_bytes(), path).decode("utf-8", "replace")
        except NotFound:
            return None

    def read_json(self, path: str) -> dict:
        """A small JSON object in the bucket (a job's marker); {} if it is missing or unreadable."""
        try:
            return json.loads(self.read_text(path) or "{}")
        except json.JSONDecodeError:
            return {}

    def fetch(self, path: str, target: Path) -> None:
        blob = storage.Blob.from_string(path, client=self.storage)
        try:
            self._storage(lambda: blob.download_to_filename(str(target)), path)
        except NotFound:
            raise UserError(f"{path}: not in the bucket") from None

    # --- Inside -----------------------------------------------------------------------------

    def _state(self, key: str) -> JobStatus:
        return JobStatus.from_json(jobset_state.state(self.get(key), self))

    def where(self, path: str) -> str:
        """A pod's path under the bucket's mount (or a gs:// URL) as the gs:// URL this machine reads; a path
        outside the bucket (which this machine cannot read) is refused."""
        url = in_bucket(path, self.bucket)
        if not url.startswith(f"gs://{self.bucket}/"):
            raise UserError(f"{path}: not in the stack's bucket gs://{self.bucket}, so not readable from here")
        return url

    def _storage(self, call, what: str):
        """One Cloud Storage call from this machine; a failure other than a missing object is one line."""
        try:
            return call()
        except NotFound:
            raise
        except GoogleAPIError as err:
            raise UserError(f"{what}: Cloud Storage refused ({err.__class__.__name__}: {err})") from None
        except (RefreshError, DefaultCredentialsError) as err:
            raise UserError(
                f"{what}: no Google credentials here ({err}); run gcloud auth application-default login"
            ) from None

    def names(self, prefix: str) -> list[str]:
        bucket, _, path = prefix.removeprefix("gs://").partition("/")
        listed = self._storage(lambda: list(self.storage.list_blobs(bucket, prefix=path)), prefix)
        return [f"gs://{bucket}/{blob.name}" for blob in listed]

    def _head_pod(self, key: str):
        selector = f"jobset.sigs.k8s.io/jobset-name={key}"
        pods = self._call(self.core.list_namespaced_pod, NAMESPACE, label_selector=selector).items
        heads = [
            pod
            for pod in pods
            if (pod.metadata.labels or {}).get("jobset.sigs.k8s.io/replicatedjob-name") in HEAD_JOBS
            and pod.status.phase in ("Running", *POD_ENDED)
        ]
        return max(heads, key=lambda pod: pod.metadata.creation_timestamp, default=None)

    def get(self, name: str) -> dict | None:
        try:
            return self._call(self.custom.get_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL, name)
        except _NotFound:
            return None

    def create(self, jobset: dict) -> None:
        with contextlib.suppress(_Exists):
            self._call(self.custom.create_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL, jobset)

    def delete(self, name: str, uid: str) -> None:
        options = client.V1DeleteOptions(propagation_policy="Foreground", preconditions=client.V1Preconditions(uid=uid))
        with contextlib.suppress(_NotFound, _Exists):  # gone, or replaced meanwhile (409: another uid)
            self._call(
                self.custom.delete_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL, name, body=options
            )

    def _put(self, create, replace, name: str, body) -> None:
        try:
            self._call(create, NAMESPACE, body)
        except _Exists:
            self._call(replace, name, NAMESPACE, body)

    def _call(self, method, *args, **kwargs):
        """One API call; its failure is one line (404 and 409 are for the caller to handle)."""
        try:
            return method(*args, **kwargs)
        except ApiException as err:
            if err.status in (404, 409):
                raise (_NotFound if err.status == 404 else _Exists)() from None
            raise UserError(f"{self.name}: the Kubernetes API refused: {err.status} {err.reason}") from None
        except (HTTPError, OSError) as err:
            raise UserError(f"{self.name}: the Kubernetes API did not answer ({type(err).__name__})") from None


class _NotFound(UserError):
    def __init__(self):
        super().__init__("the Kubernetes API: not found")


class _Exists(UserError):
    def __init__(self):
        super().__init__("the Kubernetes API: already exists")


def _digest(jobset: dict) -> str | None:
    return (jobset["metadata"].get("annotations") or {}).get(PLAN_DIGEST_ANNOTATION)
