"""The few Kubernetes endpoints the gke backend uses, on 127.0.0.1; its pods write to a real bucket.

The official `kubernetes` client reaches it through a kubeconfig. Each JobSet plays a
script: a list of pod runs, each a list of log lines and how it ends: `complete` (the
JobSet completes and its declared outputs appear in the bucket, the Cloud Storage emulator
of tests/gcsemulator.py: a file output as that file, an export's SHA256SUMS listing the
files beside it, a folder output as one file in it), `fail` (the JobSet fails), `restart`
(the pod ends, a new pod starts), `drop` (the log stream breaks off mid-way, as a lost
watch does) or `exec`: the pod's container command really runs here, with the ConfigMap's
tools and the Secret's values where the pod spec mounts and names them, and the bucket as
a folder (copied in before, and what the command wrote copied back after, as Cloud Storage
FUSE would); its output is the log and its exit code decides the JobSet's end.

Pods advance as their logs are followed (fab watching), or, for the jobs in `autoplay`
(the driver's, always), by themselves as soon as their JobSet is created (a cluster no
one watches), once their `hold` (if any) is released. A command run by itself streams its
output to its log's readers while it runs. Pods reach the
API as a cluster's pods do: over HTTPS at KUBERNETES_SERVICE_HOST/PORT, trusting the
service account's ca.crt, with its token; a token is honoured only for what the Role
bound to its service account in infra/gke.py grants (DRIVER_RULES), else 403.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from bootstrap.gke.jobsets import BUCKET_MOUNT, NAMESPACE, SERVICE_ACCOUNT_DIR, TOOLS_DIR
from bootstrap.remote import manifest
from infra.gke import DRIVER_RULES, DRIVER_SERVICE_ACCOUNT
from tests import stubserver

JOBSETS = re.compile(r"/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/([^/]+)/jobsets(?:/([^/]+))?$")
CORE = re.compile(r"/api/v1/namespaces/([^/]+)/(secrets|configmaps|pods)(?:/([^/]+))?(/log)?$")
STAMP = "2026-11-30T12:00:00Z"
CHUNK = 64 * 1024
EXEC_SECONDS = 300  # a pod's command (the driver's runs the whole pipeline)
POLL_SECONDS = "0.1"  # how often fab and the driver pod look again (TPU_RL_GKE_POLL_SECONDS): this cluster is quick
REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, values: dict[str, str]) -> str:
    """What the kubelet makes of a command word or an env value (Kubernetes' third_party/forked/golang/expansion):
    `$$` is `$`, `$(NAME)` the value of a variable defined before it (left as written if none is)."""
    return REFERENCE.sub(lambda m: "$" if m[0] == "$$" else values.get(m[1], m[0]), text)


@dataclass
class Run:
    lines: list[str]
    end: str  # complete | fail | restart | drop | exec


@dataclass
class Kube:
    scripts: dict[str, list[Run]] = field(default_factory=dict)  # job label (convert, train, ...) -> pod runs
    jobsets: dict[str, dict] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)  # JobSet names, in creation order
    deleted: list[str] = field(default_factory=list)
    secrets: dict[str, dict] = field(default_factory=dict)
    config_maps: dict[str, dict] = field(default_factory=dict)
    storage: object = None  # a google-cloud-storage Client for the emulator: where completed pods write
    runs: dict[str, list[Run]] = field(default_factory=dict)  # JobSet -> pod runs left
    pods: dict[str, int] = field(default_factory=dict)  # JobSet -> pods started
    url: str = ""
    storage_url: str = ""  # the emulator's address, as pods' clients are pointed at it
    autoplay: set[str] = field(default_factory=lambda: {"pipeline"})  # job labels whose pods run by themselves
    without_outputs: set[str] = field(default_factory=set)  # job labels that complete without writing them
    hold: dict[str, threading.Event] = field(default_factory=dict)  # job label -> released when its pods may run
    api_url: str = ""  # https://127.0.0.1:PORT, as pods reach the API
    ca: str = ""  # the API's certificate (PEM), the pods' ca.crt
    logs: dict[str, bytearray] = field(default_factory=dict)  # JobSet -> what its executed command printed
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (token, verb, path) from pods
    unreachable: bool = False  # fab's requests get 503 (a laptop off the network, an API behind a dead VPN)
    garble: dict[str, int] = field(default_factory=dict)  # API path -> how many pod requests get an empty object

    def token_of(self, account: str) -> str:
        return f"token-of-{account}"

    def allowed(self, token: str, verb: str, path: str) -> bool:
        """RBAC for pods' requests: a JobSet verb the driver's Role grants, with the driver's token."""
        m = JOBSETS.match(path)
        if token != self.token_of(DRIVER_SERVICE_ACCOUNT) or not m or m[1] != NAMESPACE:
            return False
        return any("jobsets" in rule["resources"] and verb in rule["verbs"] for rule in DRIVER_RULES)

    def plays(self, name: str) -> bool:
        """Whether the JobSet's pods run by themselves (reading their logs does not advance them)."""
        return name in self.jobsets and self.jobsets[name]["metadata"]["labels"]["tpu-rl/job"] in self.autoplay

    def play(self, name: str) -> None:
        """The JobSet's pods, run by the cluster itself (autoplay)."""
        gate = self.hold.get(self.jobsets[name]["metadata"]["labels"]["tpu-rl/job"])
        if gate is not None:
            gate.wait(EXEC_SECONDS)
        while self.runs.get(name):
            run = self.runs[name].pop(0)
            self.logs[name] += "".join(line + "\n" for line in run.lines).encode()
            if run.end == "exec":
                return self.finish(name, "exec" if self.run_pods(name) else "fail")
            if run.end == "restart":
                self.pods[name] += 1
            elif run.end in ("complete", "fail"):
                return self.finish(name, run.end)

    def run_pods(self, name: str) -> bool:
        """The Job controller's rules for the JobSet's one pod, its command really run: a pod that failed is
        replaced up to backoffLimit times, unless a FailJob rule of its podFailurePolicy names its exit code."""
        job = self.jobsets[name]["spec"]["replicatedJobs"][0]["template"]["spec"]
        rules = (job.get("podFailurePolicy") or {}).get("rules", [])
        for _ in range(job.get("backoffLimit", 6) + 1):
            _, code = self.execute(name)
            if code == 0:
                return True
            if any(r["action"] == "FailJob" and code in r.get("onExitCodes", {}).get("values", []) for r in rules):
                return False
            self.pods[name] += 1
        return False

    def finish(self, name: str, end: str) -> None:
        jobset = self.jobsets.get(name)
        if jobset is None:  # deleted meanwhile
            return
        kind = "Completed" if end in ("complete", "exec") else "Failed"
        if end == "complete" and jobset["metadata"]["labels"]["tpu-rl/job"] not in self.without_outputs:
            self.write_outputs(jobset["metadata"]["annotations"]["tpu-rl/outputs"].split())  # before its pod ends
        jobset["status"] = {"conditions": [{"type": kind, "status": "True", "lastTransitionTime": STAMP,
                                            "message": "a pod failed" if kind == "Failed" else ""}]}  # fmt: skip

    def execute(self, name: str) -> tuple[bytes, int]:
        """Run the JobSet's one container here: its output, and its exit code."""
        pod = self.jobsets[name]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        mounted = [
            self.storage.bucket(v["csi"]["volumeAttributes"]["bucketName"]) for v in pod["volumes"] if "csi" in v
        ]
        with tempfile.TemporaryDirectory() as root:
            tools, mount = os.path.join(root, "tools"), os.path.join(root, "gcs")
            os.makedirs(tools)
            for tool, text in self.config_maps["tpu-rl-tools"]["data"].items():
                with open(os.path.join(tools, tool), "w") as f:
                    f.write(text)
            before = {}  # object -> its bytes' SHA-256 as copied in
            for blob in (blob for bucket in mounted for blob in bucket.list_blobs()):
                path = os.path.join(mount, blob.name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                blob.download_to_filename(path)
                before[blob.name] = manifest.file_digest(path)
            env: dict[str, str] = {}
            for item in container["env"]:
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                env[item["name"]] = (
                    self.secrets[ref["name"]]["stringData"][ref["key"]] if ref else expand(item["value"], env)
                )
            account = os.path.join(root, "serviceaccount")  # what the kubelet mounts for the pod's service account
            os.makedirs(account)
            with open(os.path.join(account, "token"), "w") as f:
                f.write(self.token_of(pod["serviceAccountName"]))
            with open(os.path.join(account, "ca.crt"), "w") as f:
                f.write(self.ca)
            words = [expand(word, env) for word in container["command"]]
            command = [
                account
                if word == SERVICE_ACCOUNT_DIR
                else word.replace(TOOLS_DIR, tools).replace(f"{BUCKET_MOUNT}/", f"{mount}/")
                for word in words
            ]
            host, port = self.api_url.removeprefix("https://").split(":")
            env |= {
                "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin",
                "KUBERNETES_SERVICE_HOST": host,  # the kubelet's, in every pod
                "KUBERNETES_SERVICE_PORT": port,
                "STORAGE_EMULATOR_HOST": self.storage_url,  # stands in for the pod's Workload Identity
                "TPU_RL_GKE_POLL_SECONDS": POLL_SECONDS,
            }
            output = self.logs.setdefault(name, bytearray())
            with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
                killer = threading.Timer(EXEC_SECONDS, process.kill)
                killer.start()
                while chunk := process.stdout.read1(CHUNK):
                    output += chunk
                code = process.wait()
                killer.cancel()
            for folder, _, files in os.walk(mount):
                for file in files:
                    path = os.path.join(folder, file)
                    blob_name = os.path.relpath(path, mount)
                    if before.get(blob_name) != manifest.file_digest(path):  # new or changed, as FUSE writes it
                        mounted[0].blob(blob_name).upload_from_filename(path)
        return bytes(output), code

    def write_outputs(self, patterns: list[str]) -> None:
        """What a completed job leaves in the bucket for its declared outputs (globs: `*` as 4; a step folder
        `*` committed as Orbax commits one in a bucket, by a commit_success.txt)."""
        files: dict[str, dict[str, str]] = {}  # folder -> its files' SHA-256
        for pattern in patterns:
            if "/*/" in pattern:
                self._blob(f"{pattern.split('/*/')[0]}/4/commit_success.txt").upload_from_string(b"committed\n")
        for url in (pattern.replace("*", "4") for pattern in patterns):
            folder, name = url.rsplit("/", 1)
            if "." in name:
                data = f"{url}\n".encode()
                self._blob(url).upload_from_string(data)
                files.setdefault(folder, {})[name] = hashlib.sha256(data).hexdigest()
            elif name != manifest.NAME:
                self._blob(f"{url}/file").upload_from_string(b"written\n")
        for url in patterns:
            folder, name = url.rsplit("/", 1)
            if name == manifest.NAME:
                self._blob(url).upload_from_string(manifest.render(files.get(folder, {})))

    def _blob(self, url: str):
        bucket, _, name = url.removeprefix("gs://").partition("/")
        return self.storage.bucket(bucket).blob(name)


VERBS = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete"}


def _handler(kube: Kube, from_pods: bool = False):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def parse_request(self) -> bool:
            """A pod's request (the HTTPS listener) passes RBAC first; fab's (a kubeconfig user) is let through."""
            if not super().parse_request():
                return False
            if not from_pods and kube.unreachable:  # fab's way to the API is down; the pods' is not
                self.send(503, {"kind": "Status", "reason": "ServiceUnavailable", "code": 503})
                return False
            if not from_pods:
                return True
            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
            url = urlparse(self.path)
            path, verb = url.path, VERBS.get(self.command, "")
            if verb == "get" and ((m := JOBSETS.match(path)) is None or not m[2]):
                verb = "watch" if parse_qs(url.query).get("watch") == ["true"] else "list"
            kube.requests.append((token, verb, path))
            if kube.garble.get(path, 0) > 0:  # an answer with no JobSet in it: a bug's stand-in, the driver chokes
                kube.garble[path] -= 1
                self.send(200, {})
                return False
            if kube.allowed(token, verb, path):
                return True
            self.send(403, {"kind": "Status", "reason": "Forbidden", "code": 403})
            return False

        def send(self, status: int, body, length: int | None = None) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(body, bytes) else "application/json")
            self.send_header("Content-Length", str(length if length is not None else len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self) -> dict:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")

        def missing(self) -> None:
            self.send(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})

        def do_GET(self):
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if (m := JOBSETS.match(url.path)) and m[2]:
                return self.send(200, kube.jobsets[m[2]]) if m[2] in kube.jobsets else self.missing()
            if (m := CORE.match(url.path)) and m[2] == "pods" and not m[3]:
                name = query["labelSelector"][0].split("=", 1)[1]
                return self.send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": self.pods(name)})
            if (m := CORE.match(url.path)) and m[4]:
                return self.log(m[3].rsplit("-pod-", 1)[0], query)
            self.send(404, {"kind": "Status", "code": 404, "message": f"stub has no GET {url.path}"})

        def pods(self, name: str) -> list[dict]:
            jobset = kube.jobsets.get(name)
            if jobset is None or name not in kube.pods:
                return []
            head = jobset["spec"]["replicatedJobs"][0]
            pod_spec = head["template"]["spec"]["template"]["spec"]
            finished = bool(jobset.get("status"))
            labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": head["name"]}
            meta = {"name": f"{name}-pod-{kube.pods[name]}", "labels": labels, "creationTimestamp": STAMP}
            containers = [{"name": c["name"], "image": c["image"]} for c in pod_spec["containers"]]
            phase = "Succeeded" if finished else "Running"
            return [{"metadata": meta, "spec": {"containers": containers}, "status": {"phase": phase}}]

        def log(self, name: str, query: dict) -> None:
            if name in kube.logs and (kube.plays(name) or not kube.runs.get(name)):  # it runs, or ran, by itself
                return self.stream(name, query.get("follow") == ["true"])
            runs = kube.runs.get(name) or []
            if not runs:  # the JobSet has ended: its last pod's log (tail)
                return self.send(200, b"last line\n")
            run = runs[0]
            text = "".join(line + "\n" for line in run.lines).encode()
            if query.get("follow") != ["true"]:
                return self.send(200, text)
            runs.pop(0)
            if run.end == "exec":
                output, code = kube.execute(name)
                self.send(200, output)
                return kube.finish(name, "exec" if code == 0 else "fail")
            if run.end == "drop":  # announce more than is sent, then close: the client sees a broken stream
                self.send(200, text, length=len(text) + 1000)
                self.close_connection = True
                return
            self.send(200, text)
            if run.end == "restart":
                kube.pods[name] += 1
            elif run.end in ("complete", "fail"):
                kube.finish(name, run.end)

        def stream(self, name: str, follow: bool) -> None:
            """What the command printed so far; following, in chunks as it prints, until it has ended (chunked
            transfer encoding, as the API server streams a log)."""
            if not follow:
                return self.send(200, bytes(kube.logs[name]))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent = 0
            while True:
                if kube.unreachable and not from_pods:  # the network is gone: so is the open stream
                    self.close_connection = True
                    return None
                ended = name not in kube.jobsets or bool(kube.jobsets[name].get("status"))  # deleted: ended too
                data = bytes(kube.logs[name][sent:])
                if data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                sent += len(data)
                if ended and sent == len(kube.logs[name]):
                    self.wfile.write(b"0\r\n\r\n")
                    return
                threading.Event().wait(0.05)

        def do_POST(self):
            url = urlparse(self.path)
            body = self.body()
            if (m := JOBSETS.match(url.path)) and not m[2]:
                name = body["metadata"]["name"]
                if name in kube.jobsets:
                    return self.send(409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})
                body["metadata"]["creationTimestamp"] = STAMP
                body["metadata"]["uid"] = f"uid-{len(kube.created)}"
                kube.jobsets[name] = body
                kube.created.append(name)
                kube.runs[name] = list(kube.scripts[body["metadata"]["labels"]["tpu-rl/job"]])
                kube.pods[name] = 1
                kube.logs.pop(name, None)  # a new JobSet's pods have logs of their own
                self.send(201, body)
                if kube.plays(name):
                    kube.logs[name] = bytearray()
                    threading.Thread(target=kube.play, args=(name,), daemon=True).start()
                return None
            if m := CORE.match(url.path):
                store = kube.secrets if m[2] == "secrets" else kube.config_maps
                name = body["metadata"]["name"]
                if name in store:
                    return self.send(409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})
                store[name] = body
                return self.send(201, body)
            self.send(404, {"kind": "Status", "code": 404})

        def do_PUT(self):
            m = CORE.match(urlparse(self.path).path)
            body = self.body()
            (kube.secrets if m[2] == "secrets" else kube.config_maps)[m[3]] = body
            self.send(200, body)

        def do_DELETE(self):
            m = JOBSETS.match(urlparse(self.path).path)
            uid = (self.body().get("preconditions") or {}).get("uid")
            if m[2] not in kube.jobsets:
                return self.missing()
            if uid and kube.jobsets[m[2]]["metadata"]["uid"] != uid:
                return self.send(409, {"kind": "Status", "reason": "Conflict", "code": 409})
            kube.jobsets.pop(m[2], None)
            kube.deleted.append(m[2])
            self.send(200, {"kind": "Status", "status": "Success"})

    return Handler


def serve() -> tuple[Kube, list[ThreadingHTTPServer]]:
    """The API on HTTP for fab (its kubeconfig) and on HTTPS for pods; both are shut down by the caller."""
    kube = Kube()
    servers = [stubserver.start(kube, _handler)]
    with tempfile.TemporaryDirectory() as folder:
        cert, key = _certificate(folder)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        with open(cert) as f:
            kube.ca = f.read()
    pods = stubserver.QuietServer(("127.0.0.1", 0), _handler(kube, from_pods=True))
    pods.socket = tls.wrap_socket(pods.socket, server_side=True)
    kube.api_url = f"https://127.0.0.1:{pods.server_address[1]}"
    threading.Thread(target=pods.serve_forever, daemon=True).start()
    return kube, [*servers, pods]


def _certificate(folder: str) -> tuple[str, str]:
    """A throwaway self-signed certificate for 127.0.0.1 (the cluster's CA and the API's own, in one)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    paths = os.path.join(folder, "api.crt"), os.path.join(folder, "api.key")
    with open(paths[0], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths[1], "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return paths
