"""core_api.CoreV1 sends each of its calls exactly as the official client's CoreV1Api sends it, and takes each answer
as CoreV1Api does: the same data, stream or exception (tests/gke runs them against the cluster stand-in)."""

from __future__ import annotations

import io

import pytest
import urllib3
from kubernetes import client
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException

from bootstrap.gke.core_api import CoreV1

CALLS = {  # a method: its arguments, as cluster.py passes them
    "create_namespaced_secret": (("tpu-rl", client.V1Secret(metadata=client.V1ObjectMeta(name="s"))), {}),
    "replace_namespaced_secret": (("s", "tpu-rl", client.V1Secret(string_data={"HF_TOKEN": "x"})), {}),
    "create_namespaced_config_map": (("tpu-rl", client.V1ConfigMap(data={"a.py": "print()"})), {}),
    "replace_namespaced_config_map": (("c", "tpu-rl", client.V1ConfigMap(data={"a.py": "print()"})), {}),
    "list_namespaced_pod": (("tpu-rl",), {"label_selector": "jobset.sigs.k8s.io/jobset-name=r1-train"}),
    "read_namespaced_pod_log": (("p-0", "tpu-rl"), {"container": "jax", "tail_lines": 20}),
    "read_namespaced_pod_log ": (("p-0", "tpu-rl"), {"container": "jax", "follow": True, "_preload_content": False}),
}


class Sent(Exception):
    """The request a call made, stopped before the network."""


def sent(api: client.ApiClient, call) -> tuple:
    def capture(method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        raise Sent(method, url, header_params, body, post_params)

    api.call_api = capture
    with pytest.raises(Sent) as request:
        call()
    return request.value.args


def new_api() -> client.ApiClient:
    api = client.ApiClient(client.Configuration(host="https://cluster.example", api_key={"authorization": "t0k"}))
    api.configuration.api_key_prefix["authorization"] = "Bearer"
    return api


def both(api: client.ApiClient, name: str) -> tuple:
    """The call `name` of CALLS, as CoreV1 makes it and as CoreV1Api does."""
    args, kwargs = CALLS[name]
    method = name.strip()
    return (
        lambda: getattr(CoreV1(api), method)(*args, **kwargs),
        lambda: getattr(client.CoreV1Api(api), method)(*args, **kwargs),
    )


@pytest.mark.parametrize("name", CALLS)
def test_each_call_is_the_request_corev1api_sends(name):
    api = new_api()
    ours, theirs = (sent(api, call) for call in both(api, name))
    assert ours == theirs
    assert ours[2]["authorization"] == "Bearer t0k"


ANSWERS = {  # a status, its content type and body: a model, a log's text, and the API's refusals
    "model": (201, "application/json", b'{"metadata": {"name": "n"}, "items": [{"metadata": {"name": "p-0"}}]}'),
    "text": (200, "text/plain", b"step 1\nstep 2\n"),
    "waiting": (400, "application/json", b'{"kind": "Status", "message": "container jax is waiting to start"}'),
    "gone": (404, "application/json", b'{"kind": "Status", "reason": "NotFound"}'),
    "exists": (409, "application/json", b'{"kind": "Status", "reason": "AlreadyExists"}'),
}


def outcome(api: client.ApiClient, call, answer: tuple[int, str, bytes]) -> tuple:
    """What the caller gets for `answer`: the data (as JSON), the stream's bytes, or the exception raised."""
    status, content_type, body = answer

    def reply(*_, **__):
        raw = urllib3.HTTPResponse(
            body=io.BytesIO(body), status=status, reason="R", headers={"content-type": content_type},
            preload_content=False,
        )  # fmt: skip
        return rest.RESTResponse(raw)

    api.call_api = reply
    try:
        got = call()
    except ApiException as err:
        return "raised", type(err).__name__, err.status, err.reason, err.body
    except ValueError as err:  # an answer not of the call's type (pydantic's ValidationError): the same error
        return "raised", type(err).__name__, str(err)
    if isinstance(got, urllib3.HTTPResponse):
        return "stream", got.read()
    return "data", api.sanitize_for_serialization(got)


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("name", CALLS)
def test_each_answer_comes_back_as_corev1api_gives_it(name, answer):
    api = new_api()
    ours, theirs = (outcome(api, call, ANSWERS[answer]) for call in both(api, name))
    assert ours == theirs
    if ANSWERS[answer][0] >= 400:  # each refusal is the client's ApiException, whatever the call
        assert ours[0] == "raised" and ours[2] == ANSWERS[answer][0]
