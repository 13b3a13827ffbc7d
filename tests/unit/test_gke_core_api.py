"""core_api.CoreV1 sends each of its calls exactly as the official client's CoreV1Api sends it (tests/gke runs them
against the cluster stand-in)."""

from __future__ import annotations

import pytest
from kubernetes import client

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


@pytest.mark.parametrize("name", CALLS)
def test_each_call_is_the_request_corev1api_sends(name):
    api = client.ApiClient(client.Configuration(host="https://cluster.example", api_key={"authorization": "t0k"}))
    api.configuration.api_key_prefix["authorization"] = "Bearer"
    args, kwargs = CALLS[name]
    method = name.strip()
    ours = sent(api, lambda: getattr(CoreV1(api), method)(*args, **kwargs))
    theirs = sent(api, lambda: getattr(client.CoreV1Api(api), method)(*args, **kwargs))
    assert ours == theirs
    assert ours[2]["authorization"] == "Bearer t0k"
