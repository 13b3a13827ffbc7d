"""The core/v1 calls the gke backend makes (its Secret, its ConfigMap, a JobSet's pods, a pod's log), sent
through the official Kubernetes client's ApiClient exactly as its CoreV1Api sends them.

CoreV1Api's module is 4.5 MB of generated code for its 206 endpoints: importing it costs 0.7-0.8 CPU-s,
on every gke fab command, for the six this backend calls. These methods keep CoreV1Api's names and
arguments, the same request (path, query, `Accept`, the bearer token) and the same answers: the
client's models, its ApiException for a refusal, and with `_preload_content=False` the raw stream.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

NAMESPACED = "/api/v1/namespaces/{namespace}"
# The statuses whose answer CoreV1Api reads as the call's type (another 2xx: no data; the rest: its ApiException)
CREATED, REPLACED, READ = ("200", "201", "202"), ("200", "201"), ("200",)


class CoreV1:
    """The calls of CoreV1Api that cluster.py makes, and no others."""

    def __init__(self, api: ApiClient):
        self.api = api

    def create_namespaced_secret(self, namespace: str, body) -> Any:
        return self._call("POST", "/secrets", {"namespace": namespace}, ("V1Secret", CREATED), body=body)

    def replace_namespaced_secret(self, name: str, namespace: str, body) -> Any:
        where = {"namespace": namespace, "name": name}
        return self._call("PUT", "/secrets/{name}", where, ("V1Secret", REPLACED), body=body)

    def create_namespaced_config_map(self, namespace: str, body) -> Any:
        return self._call("POST", "/configmaps", {"namespace": namespace}, ("V1ConfigMap", CREATED), body=body)

    def replace_namespaced_config_map(self, name: str, namespace: str, body) -> Any:
        where = {"namespace": namespace, "name": name}
        return self._call("PUT", "/configmaps/{name}", where, ("V1ConfigMap", REPLACED), body=body)

    def list_namespaced_pod(self, namespace: str, label_selector: str | None = None) -> Any:
        query = [("labelSelector", label_selector)]
        return self._call("GET", "/pods", {"namespace": namespace}, ("V1PodList", READ), query=query)

    def read_namespaced_pod_log(
        self,
        name: str,
        namespace: str,
        container: str | None = None,
        follow: bool | None = None,
        tail_lines: int | None = None,
        _preload_content: bool = True,
    ) -> Any:
        where = {"namespace": namespace, "name": name}
        query = [("container", container), ("follow", follow), ("tailLines", tail_lines)]
        return self._call("GET", "/pods/{name}/log", where, ("str", READ), query=query, preload=_preload_content)

    def _call(
        self,
        method: str,
        path: str,
        where: dict[str, str],
        answer: tuple[str, tuple[str, ...]],
        query: list[tuple[str, Any]] = (),
        body: Any = None,
        preload: bool = True,
    ) -> Any:
        """One request; its answer as `answer` says (a model's name, or "str", and the statuses read as it), or the
        stream unread if not `preload`."""
        request = self.api.param_serialize(
            method=method,
            resource_path=NAMESPACED + path,
            path_params=where,
            query_params=[(key, value) for key, value in query if value is not None],
            header_params={"Accept": "application/json"},
            body=body,
            post_params=[],
            files={},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request)
        if not preload:
            if not 200 <= response.status <= 299:
                response.read()
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            return response.response
        response.read()
        kind, statuses = answer
        return self.api.response_deserialize(response, dict.fromkeys(statuses, kind)).data
