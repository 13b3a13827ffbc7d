"""The cluster's pipeline driver (gke_driver.py) against a fake namespace and bucket: its exit code is what its
Job's podFailurePolicy reads, so a failed job must end the Job and a crash must not."""

from __future__ import annotations

import ssl
import urllib.error

import pytest

from bootstrap.gke import jobsets
from bootstrap.remote import gke_driver, jobset_state, retry

BUCKET = "gs://b"


class Namespace:
    """JobSets that complete as soon as they are created (writing their outputs), or fail if named in `failing`."""

    def __init__(self, failing: set[str] = frozenset(), broken: bool = False):
        self.jobsets: dict[str, dict] = {}
        self.created: list[str] = []
        self.objects: set[str] = set()
        self.failing, self.broken = failing, broken

    def get(self, name: str) -> dict | None:
        if self.broken:
            raise KeyError("a bug")
        return self.jobsets.get(name)

    def create(self, jobset: dict) -> None:
        name = jobset["metadata"]["name"]
        kind = "Failed" if name in self.failing else "Completed"
        done = {"type": kind, "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
        self.jobsets[name] = {
            **jobset,
            "metadata": {**jobset["metadata"], "uid": name},
            "status": {"conditions": [done]},
        }
        self.created.append(name)
        if kind == "Completed":
            self.objects |= set(jobset["metadata"]["annotations"][jobset_state.OUTPUTS_ANNOTATION].split())

    def delete(self, name: str, uid: str) -> None:
        if self.jobsets.get(name, {}).get("metadata", {}).get("uid") == uid:
            del self.jobsets[name]

    def names(self, prefix: str) -> list[str]:
        return sorted(url for url in self.objects if url.startswith(prefix))

    def read_text(self, url: str) -> str | None:
        return "" if url in self.objects else None


def jobset(name: str) -> dict:
    spec = {"template": {"spec": {"template": {"spec": {"containers": [{"command": ["true"]}]}}}}}
    return {
        "metadata": {"name": name, "annotations": {jobset_state.OUTPUTS_ANNOTATION: f"{BUCKET}/{name}/out"}},
        "spec": {"replicatedJobs": [spec]},
    }


def plan(*names: str) -> dict:
    jobs = [
        {"name": n, "needs": list(names[:i][-1:]), "start": True, "manifest": jobset(n)} for i, n in enumerate(names)
    ]
    return {"run": "r", "digest": "d", "jobs": jobs}


@pytest.fixture(autouse=True)
def no_wait(monkeypatch):
    monkeypatch.setattr(gke_driver, "POLL_SECONDS", 0)


def test_every_job_done_exits_0_in_order():
    namespace = Namespace()
    assert gke_driver.exit_code(plan("convert", "train", "export"), namespace, namespace) == 0
    assert namespace.created == ["convert", "train", "export"]


def test_a_failed_job_exits_with_the_code_its_jobs_failure_policy_ends_the_job_on(capsys):
    namespace = Namespace(failing={"train"})
    code = gke_driver.exit_code(plan("convert", "train", "export"), namespace, namespace)
    assert code == gke_driver.PIPELINE_FAILED and namespace.created == ["convert", "train"]
    rules = jobsets.driver_jobset(plan("convert"), jobsets.Slice("b", "4x4", "img"), "r")["spec"]["replicatedJobs"][0][
        "template"
    ]["spec"]["podFailurePolicy"]["rules"]
    assert [r["onExitCodes"]["values"] for r in rules if r["action"] == "FailJob"] == [[code]]
    assert '"event": "blocked", "job": "export", "needs": "train"' in capsys.readouterr().out


def test_a_crash_exits_with_a_code_the_job_retries_and_says_why(capsys):
    code = gke_driver.exit_code(plan("convert"), Namespace(broken=True), Namespace())
    assert code == gke_driver.DRIVER_FAILED and code != gke_driver.PIPELINE_FAILED and code != 0
    assert "stopped (KeyError: 'a bug'); restarting" in capsys.readouterr().out


def test_a_retry_replaces_only_the_failed_jobset_it_saw():
    """launch deletes the ended JobSet by its uid: a retry another driver made meanwhile is adopted, not deleted."""
    namespace = Namespace(failing={"train"})
    namespace.create(jobset("train"))

    class Racing(Namespace):
        def delete(self, name, uid):  # another driver's retry lands between our look and our delete
            namespace.jobsets[name] = {**namespace.jobsets[name], "metadata": {"name": name, "uid": "theirs"},
                                       "status": {}}  # fmt: skip
            namespace.delete(name, uid)

        def get(self, name):
            return namespace.get(name)

    jobset_state.launch(jobset("train"), Racing(), namespace, timeout=5)
    assert namespace.jobsets["train"]["metadata"]["uid"] == "theirs" and namespace.created == ["train"]


def test_what_may_pass_is_tried_again_and_a_refusal_is_not(monkeypatch):
    """A cut TLS stream, a proxy's HTML page or a 503 cost a retry, not the driver's pod; a 4xx is final."""
    monkeypatch.setattr(retry.time, "sleep", lambda seconds: None)
    failures = [ssl.SSLEOFError(), ValueError("not JSON"), urllib.error.HTTPError("u", 503, "busy", {}, None)]

    def flaky():
        if failures:
            raise failures.pop(0)
        return "answer"

    assert gke_driver.retrying(flaky) == "answer" and not failures
    calls = []

    def refused():
        calls.append(1)
        raise gke_driver.Refused("POST jobsets: 422 Unprocessable Entity")

    with pytest.raises(gke_driver.Refused):
        gke_driver.retrying(refused)
    assert calls == [1]
