"""A small Hugging Face Hub on 127.0.0.1: the endpoints fab and hub_upload.py use, nothing more.

The real huggingface_hub client talks to it through HF_ENDPOINT. It knows tokens
(with a role and the gated repos they may read), stores committed files in memory,
and can be told to fail commits of given paths, to test resumed uploads.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from tests import stubserver

GATED = {"meta-llama/Llama-3.1-8B-Instruct"}


@dataclass
class Token:
    role: str = "write"
    gated_access: bool = True


@dataclass
class Hub:
    tokens: dict[str, Token] = field(default_factory=dict)
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    private: dict[str, bool] = field(default_factory=dict)
    fail_commits_of: set[str] = field(default_factory=set)
    garble_commits_of: set[str] = field(default_factory=set)  # paths stored with a byte changed: the Hub lost one
    commits: dict[str, list[str]] = field(default_factory=dict)  # repo -> paths, in commit order
    requests: list[str] = field(default_factory=list)  # "METHOD path" of every request, in order
    url: str = ""


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_entry(path: str, data: bytes) -> dict:
    """A file as the Hub's tree API lists it: weights are LFS files (their SHA-256), the rest git blobs."""
    entry = {"type": "file", "path": path, "size": len(data), "oid": git_blob_id(data)}
    if path.endswith(".safetensors"):
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
        entry["oid"] = git_blob_id(pointer.encode())
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": len(pointer)}
    return entry


def card_data(readme: bytes | None) -> dict | None:
    """A model card's YAML metadata (between its first two `---` lines), as the Hub returns it in cardData."""
    text = (readme or b"").decode(errors="replace")
    if not text.startswith("---\n") or "\n---" not in text[4:]:
        return None
    found = yaml.safe_load(text[4 : text.index("\n---", 4)])
    return found if isinstance(found, dict) else None


def _handler(hub: Hub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _send(self, status: int, body, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _token(self) -> Token | None:
            auth = self.headers.get("Authorization", "")
            return hub.tokens.get(auth.removeprefix("Bearer ").strip())

        def _body(self) -> bytes:
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            return gzip.decompress(data) if self.headers.get("Content-Encoding") == "gzip" else data

        def do_GET(self):
            hub.requests.append(f"GET {self.path}")
            token = self._token()
            path = self.path.split("?")[0]
            if path == "/api/whoami-v2":
                if token is None:
                    return self._send(401, {"error": "Invalid credentials in Authorization header"})
                return self._send(
                    200,
                    {
                        "type": "user",
                        "name": "tester",
                        "orgs": [],
                        "auth": {"type": "access_token", "accessToken": {"displayName": "t", "role": token.role}},
                    },
                )
            if m := re.fullmatch(r"/api/models/(.+?)/auth-check(/write)?", path):
                repo, write = m[1], bool(m[2])
                if token is None:
                    return self._send(401, {"error": "Invalid credentials"}, {"X-Error-Code": "RepoNotFound"})
                if repo in GATED and not token.gated_access:
                    return self._send(
                        403, {"error": f"Access to model {repo} is restricted"}, {"X-Error-Code": "GatedRepo"}
                    )
                if write and repo not in hub.repos:
                    return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                if write and token.role == "read":
                    return self._send(403, {"error": "You don't have the rights to write to this repository"})
                return self._send(200, {})
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(/revision/[^/]+)?", path):  # repo_info
                if m[1] not in hub.repos:
                    return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                info = {"id": m[1], "private": hub.private.get(m[1], False), "sha": "0" * 40}
                if card := card_data(hub.repos[m[1]].get("README.md")):  # the Hub parses the card's metadata
                    info["cardData"] = card
                return self._send(200, info)
            if m := re.fullmatch(r"/api/models/(.+?)/tree/[^/]+(/.*)?", path):
                files = hub.repos.get(m[1])
                if files is None:
                    return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                return self._send(200, [tree_entry(p, d) for p, d in sorted(files.items())])
            return self._send(404, {"error": f"stub has no GET {path}"})

        def do_POST(self):
            hub.requests.append(f"POST {self.path}")
            token = self._token()
            if token is None:
                return self._send(401, {"error": "Invalid credentials"})
            path = self.path.split("?")[0]
            body = self._body()
            if path == "/api/repos/create":
                spec = json.loads(body)
                repo = f"{spec.get('organization') or 'tester'}/{spec['name']}"
                if repo in hub.repos:
                    return self._send(409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo}"})
                hub.repos[repo], hub.private[repo] = (
                    {},
                    spec.get("visibility") == "private" or bool(spec.get("private")),
                )
                return self._send(200, {"url": f"{hub.url}/{repo}", "name": repo})
            if path == "/api/validate-yaml":  # the model card's metadata
                return self._send(200, {"errors": [], "warnings": []})
            if m := re.fullmatch(r"/api/models/(.+?)/preupload/[^/]+", path):
                files = json.loads(body)["files"]
                return self._send(
                    200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
                )
            if m := re.fullmatch(r"/api/models/(.+?)/commit/[^/]+", path):
                if token.role == "read":
                    return self._send(403, {"error": "read-only token"})
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                added = {
                    item["value"]["path"]: base64.b64decode(item["value"]["content"])
                    for item in lines
                    if item["key"] == "file"
                }
                if set(added) & hub.fail_commits_of:
                    return self._send(400, {"error": "simulated failure half-way through the upload"})
                added = {
                    p: (d[:-1] + bytes([d[-1] ^ 1]) if p in hub.garble_commits_of and d else d)
                    for p, d in added.items()
                }
                hub.repos.setdefault(m[1], {}).update(added)
                hub.commits.setdefault(m[1], []).extend(added)
                oid = hashlib.sha1(json.dumps(sorted(added)).encode()).hexdigest()
                return self._send(
                    200, {"commitUrl": f"{hub.url}/{m[1]}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
                )
            return self._send(404, {"error": f"stub has no POST {path}"})

    return Handler


def serve() -> tuple[Hub, ThreadingHTTPServer]:
    hub = Hub()
    return hub, stubserver.start(hub, _handler)


def model_card(run: str, value: str, problems: str, url: str = "", body: str = "a model") -> bytes:
    """A model card whose model-index states `run`'s GSM8K accuracy `value` on `problems` problems, as hub_upload.py
    writes it (the values as YAML text: a test may state anything a card's editor could)."""
    source = f"      name: tpu-rl run {run}\n" + (f"      url: {url}\n" if url else "")
    return (
        f"---\nmodel-index:\n- name: {run}\n  results:\n  - task:\n      type: text-generation\n    dataset:\n"
        f"      name: GSM8K\n      type: openai/gsm8k\n    metrics:\n    - type: accuracy\n      value: {value}\n"
        f"      args:\n        problems: {problems}\n    source:\n{source}---\n{body}\n"
    ).encode()
