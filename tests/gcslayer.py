"""What Cloud Storage does and gcp-storage-emulator does not, as a thin layer in front of it (tests only).

tensorstore's OCDBT (orbax's checkpoints in MaxText) relies on three things the emulator lacks:
the `x-goog-generation` headers on reads, generation preconditions (`ifGenerationMatch`,
`ifGenerationNotMatch`, `ifMetagenerationMatch`, answered with 412 or, for a read that matches,
304), and `startOffset`/`endOffset` on listings (without them
`delete_existing` deletes the whole bucket). This layer adds those, from the emulator's own object
metadata, and passes everything else through unchanged. A lock per object makes each check and the
request it guards one step, as the service's preconditions are atomic (a resumable upload is checked
when it begins, not again when it ends). Objects keep one generation (no versioning): a request for
another generation is 404, as for a deleted one. Bodies sent in chunks (no Content-Length) are not
read: no client here sends them.

For the fault campaign (tests/unit/test_fault_campaign.py) it also fails requests on purpose and keeps a
journal, each per prefix of object names (so that cases side by side do not mix): `POST /_faults` with
{"prefix", "at": {N: kind}, "rate", "seed", "kinds"} fails the Nth request below the prefix (counted from
1), or each with probability `rate` (seeded), with a kind of FAULTS; `GET /_journal?prefix=` answers every
write and delete the emulator made below it (time, name, generation, md5), in order, and the faults made.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

OBJECT_PATHS = ("/storage/v1/b/", "/download/storage/v1/b/", "/upload/storage/v1/b/")
GENERATION_HEADERS = {"generation": "x-goog-generation", "metageneration": "x-goog-metageneration"}
# What a request may meet: the service busy (503), a rate limit (429), the connection dropped before the
# request reached the service or after it was done (its answer lost), an answer slower than the client waits.
FAULTS = ("503", "429", "drop", "drop-after", "slow")
SLOW_SECONDS = 2.0  # longer than the clients' timeout in the campaign (TPU_RL_GCS_TIMEOUT_SECONDS)


class _Campaign:
    """The faults to make and the journal to keep, per prefix of object names."""

    def __init__(self):
        self.lock = threading.Lock()
        self.plans: dict[str, dict] = {}  # prefix -> its plan, its request count and its random source
        self.journal: dict[str, list[dict]] = {}

    def arm(self, plan: dict) -> None:
        with self.lock:
            state = {**plan, "count": 0, "random": random.Random(plan.get("seed", 0))}
            self.plans[plan["prefix"]] = state
            self.journal.setdefault(plan["prefix"], [])

    def fault(self, name: str) -> str | None:
        """The fault this request meets, if any (counted below each armed prefix that holds `name`)."""
        with self.lock:
            for prefix, plan in self.plans.items():
                if name.startswith(prefix):
                    plan["count"] += 1
                    kind = (plan.get("at") or {}).get(str(plan["count"]))
                    if kind is None and plan.get("rate") and plan["random"].random() < plan["rate"]:
                        kind = plan["random"].choice(plan.get("kinds") or FAULTS)
                    if kind:
                        self.journal[prefix].append({"t": time.time(), "fault": kind, "name": name})
                        return kind
        return None

    def note(self, entry: dict) -> None:
        with self.lock:
            for prefix, entries in self.journal.items():
                if entry["name"].startswith(prefix):
                    entries.append(entry)

    def read(self, prefix: str) -> list[dict]:
        with self.lock:
            return list(self.journal.get(prefix, []))


class _Locks:
    """One lock per object: a check and the request it guards are one step, other objects go on beside."""

    def __init__(self):
        self._guard, self._held = threading.Lock(), {}

    def hold(self, name: str) -> threading.Lock:
        with self._guard:
            return self._held.setdefault(name, threading.Lock())


class _Layer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int]
    locks: _Locks
    campaign: _Campaign

    def log_message(self, *args) -> None:  # the emulator's own log is enough
        pass

    def handle(self) -> None:
        """gcsfs sends an object read and a listing at once and drops the one it does not need."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path in ("/_faults", "/_journal"):
            return self._control(url.path, query, body)
        bucket, name = _object_of(url.path, query, body, self.headers.get("Content-Type", ""))
        fault = self.campaign.fault(name or query.get("prefix", "")) if name or "prefix" in query else None
        if fault in ("503", "429"):
            return self._reply(int(fault), {}, b'{"error": {"message": "injected"}}')
        if fault in ("drop", "slow"):
            if fault == "slow":
                time.sleep(SLOW_SECONDS)
            self.close_connection = True
            return None
        with self.locks.hold(f"{bucket}/{name}") if name else contextlib.nullcontext():
            current = self._metadata(bucket, name) if name else None
            refused = _precondition_failed(self.command, query, current)
            if refused:
                return self._reply(refused, {}, b"")
            if current and query.get("generation", current["generation"]) != current["generation"]:
                return self._reply(404, {}, b"")  # a generation that is no more (no versioning here)
            status, headers, data = self._forward(self.path, body)
            if self.command in ("POST", "PUT", "DELETE") and name and 200 <= status < 300:
                self._journal(name, data)
        if fault == "drop-after":  # done, and its answer lost
            self.close_connection = True
            return None
        if self.command == "GET" and url.path.endswith("/o") and status == 200:
            data = _listing_within(data, query.get("startOffset", ""), query.get("endOffset"))
        if self.command == "GET" and current and status in (200, 206):
            headers.update({header: current[key] for key, header in GENERATION_HEADERS.items()})
            headers["x-goog-stored-content-length"] = current["size"]
            headers["x-goog-stored-content-encoding"] = "identity"
        self._reply(status, headers, data)

    def _control(self, path: str, query: dict, body: bytes) -> None:
        if path == "/_faults":
            self.campaign.arm(json.loads(body))
            return self._reply(200, {}, b"{}")
        return self._reply(200, {}, json.dumps(self.campaign.read(query.get("prefix", ""))).encode())

    def _journal(self, name: str, answer: bytes) -> None:
        """A write (the object as the emulator stored it) or a delete, in the journal."""
        entry = {"t": time.time(), "name": name, "op": "delete" if self.command == "DELETE" else "write"}
        if self.command != "DELETE":
            with contextlib.suppress(ValueError):
                stored = json.loads(answer)
                entry.update(generation=stored.get("generation"), md5=stored.get("md5Hash"))
        self.campaign.note(entry)

    def _metadata(self, bucket: str, name: str) -> dict | None:
        status, _, data = self._forward(f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}", b"", "GET")
        return json.loads(data) if status == 200 else None

    def _forward(self, path: str, body: bytes, method: str | None = None) -> tuple[int, dict[str, str], bytes]:
        """The emulator's answer to this request, or (with `method`) to a plain one of the layer's own."""
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            skip = {"content-length", "connection", "transfer-encoding"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip} if method is None else {}
            headers.setdefault("Host", self.headers.get("Host", ""))
            sent = body if method is None and "Content-Length" in self.headers else None  # an empty upload too
            connection.request(method or self.command, path, body=sent, headers=headers)
            response = connection.getresponse()
            data = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in skip}
            return response.status, kept, data
        finally:
            connection.close()

    def _reply(self, status: int, headers: dict[str, str], data: bytes) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _object_of(path: str, query: dict, body: bytes, content_type: str) -> tuple[str, str]:
    """The bucket and object a request reads or writes ("" for a bucket-level request)."""
    prefix = next((p for p in OBJECT_PATHS if path.startswith(p)), None)
    if prefix is None:
        return "", ""
    bucket, _, rest = path[len(prefix) :].partition("/")
    if rest.startswith("o/"):
        return bucket, urllib.parse.unquote(rest[2:])
    if rest == "o" and prefix.startswith("/upload"):
        if "name" in query:
            return bucket, query["name"]
        if content_type.startswith("application/json") and body:  # a resumable upload begins: its metadata
            return bucket, json.loads(body).get("name", "")
        if content_type.startswith("multipart/related") and b"{" in body:
            start = body.index(b"{")
            metadata, _ = json.JSONDecoder().raw_decode(body[start:].decode("utf-8", "replace"))
            return bucket, metadata.get("name", "")
    return bucket, ""


def _precondition_failed(method: str, query: dict, current: dict | None) -> int | None:
    """412 (or 304 for a read) when the request's generation conditions do not hold for the object now. A read
    or delete of no object is the emulator's 404, whatever its conditions, as on the service."""
    if current is None and method in ("GET", "DELETE"):
        return None
    generation = current["generation"] if current else "0"
    metageneration = current["metageneration"] if current else None
    unchanged = 304 if method == "GET" else 412
    if "ifGenerationMatch" in query and query["ifGenerationMatch"] != generation:
        return 412
    if "ifGenerationNotMatch" in query and query["ifGenerationNotMatch"] == generation:
        return unchanged
    if "ifMetagenerationMatch" in query and query["ifMetagenerationMatch"] != metageneration:
        return 412
    if "ifMetagenerationNotMatch" in query and query["ifMetagenerationNotMatch"] == metageneration:
        return unchanged
    return None


def _listing_within(data: bytes, start: str, end: str | None) -> bytes:
    """A listing cut to [startOffset, endOffset), as the service cuts it."""
    if not start and end is None:
        return data
    listing = json.loads(data)

    def within(name: str) -> bool:
        return name >= start and (end is None or name < end)

    listing["items"] = [item for item in listing.get("items", []) if within(item["name"])]
    listing["prefixes"] = [prefix for prefix in listing.get("prefixes", []) if within(prefix)]
    return json.dumps(listing).encode()


def serve(emulator_url: str) -> None:
    """Run the layer until killed; its URL is the first line it prints."""
    upstream = urllib.parse.urlsplit(emulator_url)
    handler = type(
        "Layer",
        (_Layer,),
        {"upstream": (upstream.hostname, upstream.port), "locks": _Locks(), "campaign": _Campaign()},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


@contextmanager
def layer(emulator_url: str) -> Iterator[str]:
    """The layer's URL while it runs in front of the emulator at `emulator_url`: its own process, as the
    emulator is, so that the checkpoints passing through it take no memory from the tests' process."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.gcslayer", emulator_url],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = process.stdout.readline().strip()  # its first line, once it listens (or "" if it died)
        if not url.startswith("http://"):
            raise RuntimeError(f"the Cloud Storage layer did not start (exit {process.wait(timeout=10)})")
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)


if __name__ == "__main__":
    serve(sys.argv[1])
