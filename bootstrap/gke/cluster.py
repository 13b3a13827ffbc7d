"""The gke backend's cluster, as gke/driving.py drives it: JobSets instead of runner folders.

`Cluster` answers calls like `vm.machine.Vm`'s (install, prepare, states, launch, follow,
tail), through the Kubernetes API with the official client, so that the VM driver's own
graph (driver.Graph) skips, re-attaches and retries. A job's key is its JobSet's
name. A job is done only when its JobSet completed and every declared output exists in
Cloud Storage, and, for a job that names inputs (the Hub upload: the export's SHA256SUMS),
only while they are what they were when it was created; the finished JobSet of a failed
or stale attempt is deleted before the next one is created. Logs come from the job's
head pod, streamed in chunks (bounded memory); a stream that ends while the JobSet runs
(a restarted pod, a dropped watch) is followed again by the pipeline. The Hugging Face
token goes into the Secret the JobSets name.
`fab download` and `fab metrics` read the bucket from this machine (results/transfer.py).
"""

from __future__ import annotations

import calendar
import copy
import fnmatch
import hashlib
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from google.api_core.exceptions import GoogleAPIError, NotFound
from google.auth.exceptions import DefaultCredentialsError, RefreshError
from google.cloud import storage
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from ..errors import UserError
from ..jobs.plan import PlannedJob
from ..paths import REPO
from ..remote.jobrunner import JobState
from ..results import runs, transfer
from ..vm.machine import JobStatus
from ..vm.output import Cleaner, lines
from .jobsets import (
    INPUT_DIGESTS_ANNOTATION,
    INPUTS_ANNOTATION,
    NAMESPACE,
    OUTPUTS_ANNOTATION,
    SECRET,
    TOOLS,
    TOOLS_CONFIG_MAP,
    in_bucket,
)

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
HEAD_JOBS = ("pathways-head", "main")  # the replicated job whose pod runs the MaxText module
LATEST_STEP = re.compile(r"\$\{latest_step:(gs://[^{}]+)\}")
POLL_SECONDS = 5
CHUNK = 64 * 1024


class Cluster:
    """One GKE cluster's JobSets in the tpu-rl namespace, and the bucket their outputs go to."""

    def __init__(self, context: str, project: str, bucket: str, cleaner: Cleaner | None = None):
        try:
            api = config.new_client_from_config(context=context)
        except (config.ConfigException, FileNotFoundError):
            raise UserError(
                f"no kubeconfig context {context}: run gcloud container clusters get-credentials "
                "(README.md, Bigger slices)"
            ) from None
        self.name, self.bucket = context, bucket
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.storage = storage.Client(project=project)
        self.cleaner = cleaner or Cleaner()

    # --- What the tasks and the pipeline call ------------------------------------------------

    def install(self, *_) -> str | None:
        """The current run: kept on this machine (the cluster keeps no run of its own)."""
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

    def launch(self, job: PlannedJob) -> JobStatus:
        """Create the job's JobSet; one that runs is left alone, one that ended is replaced (a retry)."""
        current = self._get(job.job_dir)
        if current is not None:
            if _verdict(current) is None:
                return self._state(job.job_dir)
            self._call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL, job.job_dir)
            self._wait_gone(job.job_dir)
        manifest = self._resolve(copy.deepcopy(dict(job.runner_spec)))
        annotations = manifest["metadata"]["annotations"]
        if INPUTS_ANNOTATION in annotations:
            annotations[INPUT_DIGESTS_ANNOTATION] = self._digests(annotations[INPUTS_ANNOTATION])
        self._call(self.custom.create_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL, manifest)
        return self._state(job.job_dir)

    def follow(self, key: str, on_line: Callable[[str], None], on_idle: Callable[[], None] = lambda: None) -> None:
        """The head pod's log until its stream ends; while no pod runs yet (queued by Kueue), a heartbeat."""
        while (pod := self._head_pod(key)) is None:
            jobset = self._get(key)
            if jobset is None or _verdict(jobset) is not None:  # gone, or ended without a pod to read
                return
            on_idle()
            time.sleep(POLL_SECONDS)
        try:
            stream = self.core.read_namespaced_pod_log(
                pod.metadata.name, NAMESPACE, container=pod.spec.containers[0].name, follow=True, _preload_content=False
            )
            for line in lines(stream.stream(CHUNK)):
                on_line(self.cleaner(line))
        except (ApiException, HTTPError, OSError):
            return  # a dropped watch: the pipeline asks the state and follows again

    def tail(self, key: str, count: int, _file: str | None = None) -> list[str]:
        pod = self._head_pod(key)
        if pod is None:
            return []
        name = pod.spec.containers[0].name
        text = self._call(
            self.core.read_namespaced_pod_log, pod.metadata.name, NAMESPACE, container=name, tail_lines=count
        )
        return [self.cleaner(line) for line in text.splitlines()]

    def download(self, directory: str, local: Path, on_file: transfer.OnFile = lambda p, s: None) -> dict[str, int]:
        """A folder of the bucket that grows (TensorBoard events): what is here at its size is kept."""
        return transfer.download(self, self.where(directory), local, on_file)

    def download_verified(
        self, directory: str, local: Path, on_file: transfer.OnFile = lambda p, s: None
    ) -> dict[str, int]:
        """The export from the bucket, every file verified against its SHA256SUMS (transfer.download_verified)."""
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

    def fetch(self, path: str, target: Path) -> None:
        blob = storage.Blob.from_string(path, client=self.storage)
        try:
            self._storage(lambda: blob.download_to_filename(str(target)), path)
        except NotFound:
            raise UserError(f"{path}: not in the bucket") from None

    # --- Inside -----------------------------------------------------------------------------

    def _state(self, key: str) -> JobStatus:
        jobset = self._get(key)
        if jobset is None:
            return JobStatus(JobState.PENDING)
        started = _time(jobset["metadata"].get("creationTimestamp"))
        verdict = _verdict(jobset)
        if verdict is None:
            return JobStatus(JobState.RUNNING, log=key, started=started)
        condition, finished = verdict
        if condition["type"] == "Failed":
            return JobStatus(
                JobState.FAILED, log=key, started=started, finished=finished, error=condition.get("message")
            )
        annotations = jobset["metadata"].get("annotations") or {}
        outputs = annotations.get(OUTPUTS_ANNOTATION, "").split()
        missing = [pattern for pattern in outputs if not self._exists(pattern)]
        state = JobState.FAILED if missing else JobState.DONE
        error = f"it completed without {', '.join(missing)}" if missing else None
        inputs = annotations.get(INPUTS_ANNOTATION)
        if state is JobState.DONE and inputs and self._digests(inputs) != annotations.get(INPUT_DIGESTS_ANNOTATION):
            state, error = JobState.STALE, f"{inputs} changed"
        return JobStatus(
            state, log=key, started=started, finished=finished, error=error, outputs=outputs, missing=missing
        )

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

    def _digests(self, inputs: str) -> str:
        """What the job was made from, as it is now: the SHA-256 of each input object (small: a SHA256SUMS)."""
        return " ".join(hashlib.sha256((self.read_text(url) or "").encode()).hexdigest()[:16] for url in inputs.split())

    def _names(self, url: str) -> tuple[str, list[str]]:
        """The bucket-relative folder of a gs:// path (up to its first glob character) and the names below it."""
        bucket, _, path = url.removeprefix("gs://").partition("/")
        prefix = re.split(r"[*?\[]", path, maxsplit=1)[0]
        return path, [blob.name for blob in self.storage.list_blobs(bucket, prefix=prefix)]

    def _exists(self, pattern: str) -> bool:
        """Whether some object matches a gs:// glob, or lies below a folder that does."""
        path, names = self._names(pattern)
        return any(fnmatch.fnmatch(name, path) or fnmatch.fnmatch(name, f"{path}/*") for name in names)

    def _resolve(self, manifest: dict) -> dict:
        """${latest_step:gs://...} in a command: the highest integer step folder there, as on the VM."""

        def latest(match: re.Match) -> str:
            folder, names = self._names(match[1].rstrip("/") + "/")
            steps = [int(part) for name in names if (part := name[len(folder) :].split("/")[0]).isdigit()]
            if not steps:
                raise UserError(f"no checkpoint steps in {match[1]}: is train done?")
            return str(max(steps))

        for job in manifest["spec"]["replicatedJobs"]:
            for container in job["template"]["spec"]["template"]["spec"]["containers"]:
                container["command"] = [LATEST_STEP.sub(latest, word) for word in container.get("command", [])]
        return manifest

    def _head_pod(self, key: str):
        selector = f"jobset.sigs.k8s.io/jobset-name={key}"
        pods = self._call(self.core.list_namespaced_pod, NAMESPACE, label_selector=selector).items
        heads = [
            pod
            for pod in pods
            if (pod.metadata.labels or {}).get("jobset.sigs.k8s.io/replicatedjob-name") in HEAD_JOBS
            and pod.status.phase in ("Running", "Succeeded", "Failed")
        ]
        return max(heads, key=lambda pod: pod.metadata.creation_timestamp, default=None)

    def _get(self, key: str) -> dict | None:
        try:
            return self._call(self.custom.get_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL, key)
        except _NotFound:
            return None

    def _put(self, create, replace, name: str, body) -> None:
        try:
            self._call(create, NAMESPACE, body)
        except _Exists:
            self._call(replace, name, NAMESPACE, body)

    def _wait_gone(self, key: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self._get(key) is not None:
            if time.monotonic() > deadline:
                raise UserError(f"{self.name}: the old JobSet {key} was not deleted within {timeout:.0f} s")
            time.sleep(1)

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


def _verdict(jobset: Mapping) -> tuple[dict, float | None] | None:
    """The JobSet's final condition (Completed or Failed) and when it came, or None while it runs."""
    for condition in (jobset.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Completed", "Failed") and condition.get("status") == "True":
            return condition, _time(condition.get("lastTransitionTime"))
    return None


def _time(stamp: str | None) -> float | None:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) if stamp else None
