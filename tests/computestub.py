"""The two Compute Engine API calls fab makes, on 127.0.0.1: instances.getGuestAttributes and instances.get, at the
REST paths and in the JSON of the real API (as the google-cloud-compute client sends and reads them); fab's GETs
reach it through TPU_RL_COMPUTE_API. Each
instance publishes its host keys (or nothing yet: 404, as before the guest agent ran)
and has an id and a status (no record: 404, a deleted VM). A test's stand-in `pulumi up`,
another process, changes an instance with PUT or DELETE on /stub/instances/NAME.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests import stubserver

PATH = re.compile(
    r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/getGuestAttributes\?queryPath=hostkeys%2F$"
)
GET = re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/?]+)$")
CONTROL = re.compile(r"/stub/instances/([^/]+)$")


@dataclass
class Compute:
    host_keys: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # instance -> (type, base64)
    not_yet: dict[str, int] = field(default_factory=dict)  # instance -> answers to give as "not published"
    instances: dict[str, dict] = field(default_factory=dict)  # instance -> {"id": ..., "status": ...}
    requests: list[str] = field(default_factory=list)
    refuse: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # instance -> the next answers: errors
    url: str = ""


def _handler(compute: Compute):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def not_found(self, instance: str) -> None:
            message = f"The resource 'projects/p/zones/z/instances/{instance}' was not found"
            self.answer(404, {"error": {"code": 404, "message": message}})

        def do_PUT(self):
            name = CONTROL.match(self.path).group(1)
            compute.instances[name] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.answer(200, compute.instances[name])

        def do_POST(self):  # an OAuth token server that refuses every refresh token
            self.answer(400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."})

        def do_DELETE(self):
            compute.instances.pop(CONTROL.match(self.path).group(1), None)
            self.answer(200, {})

        def do_GET(self):
            named = GET.match(self.path) or PATH.match(self.path)
            if named and compute.refuse.get(named.group(3)):
                status, reason = compute.refuse[named.group(3)].pop(0)
                return self.answer(status, {"error": {"code": status, "message": reason}})
            if got := GET.match(self.path):
                instance = got.group(3)
                if instance not in compute.instances:
                    return self.not_found(instance)
                return self.answer(200, {"name": instance, **compute.instances[instance]})
            match = PATH.match(self.path)
            if not match:
                return self.answer(400, {"error": {"code": 400, "message": f"unexpected {self.path}"}})
            instance = match.group(3)
            compute.requests.append(instance)
            if compute.not_yet.get(instance, 0) > 0 or instance not in compute.host_keys:
                compute.not_yet[instance] = compute.not_yet.get(instance, 0) - 1
                return self.not_found(instance)
            items = [
                {"namespace": "hostkeys", "key": kind, "value": data} for kind, data in compute.host_keys[instance]
            ]
            self.answer(200, {"queryPath": "hostkeys/", "queryValue": {"items": items}})

    return Handler


def serve() -> tuple[Compute, ThreadingHTTPServer]:
    compute = Compute()
    return compute, stubserver.start(compute, _handler)
