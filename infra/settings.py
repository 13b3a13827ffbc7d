"""The stack's settings, read once from plain strings into one typed, checked object.

`pulumi config` hands the program strings (lists arrive as JSON), so everything is
parsed here: a wrong type, a name GCE refuses, a second line in a public key or an
SSH range that opens the VM to everyone is a one-line `ConfigError` naming the key,
before any resource is declared. Tests build `Settings` from plain dicts.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import ipaddress
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from . import topology

PROJECT = "tpu-rl"
IMAGE = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
# Zones that offer v6e (Cloud TPU "regions and zones"); override with tpu-rl:v6eZones.
V6E_ZONES = (
    "us-central1-b",
    "us-east1-d",
    "us-east5-a",
    "us-east5-b",
    "europe-west4-a",
    "asia-northeast1-b",
    "southamerica-west1-a",
)
# The HF download (~32 GB with original/), the MaxText env with vLLM (~25 GB),
# the OS image and pip/uv caches: below this the convert job runs out of disk.
MIN_BOOT_DISK_GB = 100
MAX_BOOT_DISK_GB = 65_536  # GCE's limit for a persistent disk
MAX_RUN_DURATION_S = 120 * 24 * 3600  # GCE's limit for maxRunDuration
FLEX_START_MAX_S = 7 * 24 * 3600  # "Flex-start VMs run uninterrupted for up to seven days" (about-flex-start-vms)
IMAGE_REFERENCE = re.compile(
    r"(https://www\.googleapis\.com/compute/(v1|beta)/)?projects/[a-z]([a-z0-9.:-]*[a-z0-9])?"
    r"/global/images/(family/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
)
PROVISIONING_MODELS = ("RESERVATION_BOUND", "STANDARD", "SPOT", "FLEX_START")
SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
# Every key the program reads, as `pulumi config` names them.
KEYS = (
    "gcp:project",
    "gcp:zone",
    *(
        f"{PROJECT}:{name}"
        for name in (
            "instanceName",
            "machineType",
            "image",
            "bootDiskSizeGb",
            "provisioningModel",
            "reservation",
            "maxRunDurationSeconds",
            "sshUser",
            "sshPublicKey",
            "osLogin",
            "sshSourceRanges",
            "network",
            "resultsBucket",
            "serviceAccountEmail",
            "v6eZones",
            "backend",
            "gkeTopology",
            "gkeClusterName",
            "gkeCpuMachineType",
        )
    ),
)
GKE_CLUSTER_NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
GCE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
GCP_PROJECT = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")
ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
LINUX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
BUCKET = re.compile(r"[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]")
NETWORK = re.compile(r"(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/global/networks/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
SERVICE_ACCOUNT = re.compile(r"[a-z0-9][-a-z0-9]*@[a-z0-9][-a-z0-9.]*\.gserviceaccount\.com")
BACKENDS = ("vm", "gke")
# Multi-host v6e slices of ct6e-standard-4t hosts (4 chips each), as XPK's system characteristics list them.
GKE_TOPOLOGIES = ("2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
MACHINE_TYPE = re.compile(r"[a-z][a-z0-9]*-[a-z0-9-]+")
EVERYWHERE = ipaddress.ip_network("0.0.0.0/0")  # IPv6 ranges are refused: the VM has none
# The address ranges kept for documentation (RFC 5737, RFC 3849): no one's laptop is there, so a firewall rule for
# them opens port 22 to no one, and buys a VM nobody can reach. Pulumi.dev.yaml's placeholder is one of them.
DOCUMENTATION_RANGES = tuple(
    ipaddress.ip_network(r) for r in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
# Pulumi.dev.yaml's placeholders: a stack that still holds one was not filled in.
PLACEHOLDERS = {"gcp:project": "my-gcp-project", f"{PROJECT}:reservation": "my-v6e-8-reservation"}
MAX_INSTANCE_NAME = 56  # its network tag, tpu-rl-<name>, must fit GCE's 63 characters
FLEX_START_ZONES = ("asia-northeast1-b", "us-east5-a")  # where v6e is offered as flex-start (Cloud TPU docs)


class ConfigError(pulumi.RunError):
    """A stack config value that would make `pulumi up` fail or build the wrong VM (shown without a traceback)."""


def fail(key: str, problem: str, fix: str) -> None:
    raise ConfigError(f"{key}: {problem}. {fix}")


def label_value(text: str) -> str:
    """`text` as a GCE label value takes it: lower case, letters, digits, _ and -, at most 63 (a stack may be
    named Dev.Team; its label becomes dev-team)."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


@dataclass(frozen=True)
class GkeSettings:
    """The `gke` backend: a cluster with one multi-host v6e slice and a CPU pool for the Pathways head."""

    cluster_name: str
    topology: str
    cpu_machine_type: str

    @property
    def chips(self) -> int:
        return topology.chips(self.topology)

    @property
    def nodes(self) -> int:
        return topology.hosts(self.topology)


@dataclass(frozen=True)
class Settings:
    """What the program declares, every value checked."""

    gcp_project: str
    zone: str
    instance_name: str
    machine_type: str
    image: str
    boot_disk_gb: int
    provisioning_model: str
    reservation: str | None
    max_run_duration_s: int | None
    ssh_user: str
    ssh_public_key: str | None
    os_login: bool
    ssh_source_ranges: tuple[str, ...]
    ssh_open_to_all: bool
    network: str
    results_bucket: str | None
    service_account_email: str | None
    v6e_zones: tuple[str, ...]
    gke: GkeSettings | None = None  # set when tpu-rl:backend is gke

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


class _Reader:
    """Typed reads of raw config strings; each failure names its key."""

    def __init__(self, raw: Mapping[str, str | None]):
        self.raw = raw

    def text(self, key: str) -> str | None:
        value = self.raw.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            fail(key, f"expected a string, got {type(value).__name__}", f"Set it with pulumi config set {key} VALUE")
        return value.strip()

    def name(self, key: str, pattern: re.Pattern, rule: str, default: str | None = None, what: str = "a valid name"):
        raw, value = self.raw.get(key), self.text(key) or default
        if isinstance(raw, str) and raw.strip() and raw != raw.strip():  # a pasted newline is not silently dropped
            fail(key, f"{raw[:80]!r} has white space around it", rule)
        if value is not None and not pattern.fullmatch(value):
            fail(key, f"{value[:80]!r} is not {what}", rule)
        return value

    def integer(self, key: str, low: int, high: int, default: int | None = None) -> int | None:
        value = self.text(key)
        if value is None:
            return default
        if not re.fullmatch(r"[0-9]{1,12}", value) or not low <= int(value) <= high:
            fail(key, f"{value[:40]!r} is not a whole number from {low} to {high}", f"Set it, e.g. {key} {low}")
        return int(value)

    def boolean(self, key: str) -> bool:
        value = (self.text(key) or "false").lower()
        if value not in ("true", "false"):
            fail(key, f"{value[:40]!r} is not true or false", f"Set it: pulumi config set {key} true")
        return value == "true"

    def strings(self, key: str) -> tuple[str, ...] | None:
        value = self.text(key)
        if value is None:
            return None
        try:
            items = json.loads(value)
        except json.JSONDecodeError:
            items = None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            fail(key, "expected a list of strings", f'Set it as a list: pulumi config set --path "{key}[0]" VALUE')
        return tuple(i.strip() for i in items)


def check_public_key(key: str, value: str) -> str:
    """One OpenSSH public key line whose base64 blob really holds the named key type."""
    fix = f'Set it to the one line of your .pub file: pulumi config set {key} "$(cat ~/.ssh/id_ed25519.pub)"'
    if "\n" in value or "\r" in value:
        fail(key, "holds more than one line (each line would become another ssh-keys entry)", fix)
    parts = value.split()
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        fail(key, f"not an OpenSSH public key (type must be one of {', '.join(SSH_KEY_TYPES[:3])}, ...)", fix)
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except binascii.Error:
        fail(key, "the key data is not base64 (is it still the placeholder?)", fix)
    try:
        (length,) = struct.unpack(">I", blob[:4])
        embedded = blob[4 : 4 + length].decode()
    except (struct.error, UnicodeDecodeError):
        embedded = None
    if embedded != parts[0]:
        fail(key, "the key data is damaged (its base64 blob does not match its type)", fix)
    try:
        serialization.load_ssh_public_key(f"{parts[0]} {parts[1]}".encode())
    except (ValueError, UnsupportedAlgorithm):
        fail(key, f"the key data is not a valid {parts[0]} key (truncated or edited?)", fix)
    return value


def source_ranges(key: str, ranges: tuple[str, ...] | None) -> tuple[tuple[str, ...], bool]:
    """Valid CIDR ranges, and whether together they cover every IPv4 or every IPv6 address."""
    fix = 'List your own address range: pulumi config set --path "tpu-rl:sshSourceRanges[0]" "$(curl -4 -s ifconfig.me)/32"'
    if ranges is None:
        ranges = ("0.0.0.0/0",)  # unset: open, with the warning below
    if not ranges:
        fail(key, "is an empty list (GCE would open port 22 to every address)", fix)
    networks = []
    for text in ranges:
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError as err:
            fail(key, f"{text[:60]!r} is not a CIDR range ({err})", fix)
        if networks[-1].version == 6:
            fail(
                key,
                f"{text} is an IPv6 range: the VM has no IPv6 address",
                "Use your IPv4 address: curl -4 -s ifconfig.me",
            )
        if any(networks[-1].subnet_of(doc) for doc in DOCUMENTATION_RANGES if doc.version == 4):
            fail(
                key,
                f"{text} is a documentation range (the placeholder?): no one could reach the VM",
                'Use your own address: pulumi config set --path "tpu-rl:sshSourceRanges[0]" "$(curl -4 -s ifconfig.me)/32"',
            )
    open_to_all = list(ipaddress.collapse_addresses(networks)) == [EVERYWHERE]
    return ranges, open_to_all


def read(raw: Mapping[str, str | None]) -> Settings:
    """Check every key and build the settings; raise ConfigError naming the first bad key."""
    unknown = [k for k in raw if k.startswith(f"{PROJECT}:") and k not in KEYS]
    if unknown:
        known = [k for k in KEYS if k.startswith(PROJECT)]
        close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.8)
        hint = f"Did you mean {close[0]}? " if close else ""
        fail(unknown[0], "unknown key", f"{hint}Known keys: {', '.join(known)}")
    r = _Reader(raw)
    t = f"{PROJECT}:"
    for key, placeholder in PLACEHOLDERS.items():
        if (r.text(key) or "").strip() == placeholder:
            fail(key, f"{placeholder} is Pulumi.dev.yaml's placeholder", f"Set your own: pulumi config set {key} VALUE")
    gcp_project = r.name("gcp:project", GCP_PROJECT, "A project ID: 6-30 lower-case letters, digits and -")
    if not gcp_project:
        fail("gcp:project", "missing", "Set it: pulumi config set gcp:project YOUR_PROJECT_ID")
    v6e_zones = r.strings(t + "v6eZones") or V6E_ZONES
    for listed in v6e_zones:
        if not ZONE.fullmatch(listed):
            fail(t + "v6eZones", f"{listed[:40]!r} is not a zone name", "List zones like us-east5-b")
    zone = r.text("gcp:zone")
    if not zone:
        fail("gcp:zone", "missing", f"Set it to a zone with v6e, e.g. pulumi config set gcp:zone {V6E_ZONES[0]}")
    if zone not in v6e_zones:
        fail(
            "gcp:zone",
            f"{zone[:40]!r} has no TPU v6e",
            f"Use one of {', '.join(v6e_zones)} (or list it in {t}v6eZones)",
        )
    gce_rule = "GCE names: 1-63 lower-case letters, digits and -, starting with a letter"
    instance_name = r.name(t + "instanceName", GCE_NAME, gce_rule, "tpu-rl-v6e-8")
    if len(instance_name) > MAX_INSTANCE_NAME:
        fail(
            t + "instanceName",
            f"{len(instance_name)} characters: its network tag {PROJECT}-NAME would pass GCE's 63",
            f"Use at most {MAX_INSTANCE_NAME} characters",
        )
    machine_type = r.name(
        t + "machineType",
        re.compile(r"ct6e-standard-(1|4|8)t"),
        "Use ct6e-standard-8t (or -4t, -1t)",
        "ct6e-standard-8t",
        "a v6e machine type",
    )
    image = r.text(t + "image") or IMAGE
    if re.search(r"\s", image):
        fail(t + "image", "contains white space", "Use an image URL or family path")
    if not IMAGE_REFERENCE.fullmatch(image):
        fail(
            t + "image",
            f"{image[:80]!r} is not a Compute Engine image",
            "Use projects/PROJECT/global/images/NAME or projects/PROJECT/global/images/family/FAMILY (or its URL)",
        )
    boot_disk_gb = r.integer(t + "bootDiskSizeGb", 1, MAX_BOOT_DISK_GB, 200)
    if boot_disk_gb < MIN_BOOT_DISK_GB:
        fail(
            t + "bootDiskSizeGb",
            f"{boot_disk_gb} GB is too small for the model download and the MaxText environment",
            f"Use at least {MIN_BOOT_DISK_GB} (the reference uses 200)",
        )
    model = (r.text(t + "provisioningModel") or "RESERVATION_BOUND").upper()
    if model not in PROVISIONING_MODELS:
        fail(t + "provisioningModel", f"unknown model {model[:40]!r}", f"Use one of {', '.join(PROVISIONING_MODELS)}")
    reservation = r.name(t + "reservation", GCE_NAME, gce_rule)
    if model == "RESERVATION_BOUND" and not reservation:
        fail(
            t + "reservation",
            "missing; a RESERVATION_BOUND VM (a future reservation: calendar mode) must name its reservation",
            f"Set it: pulumi config set {t}reservation YOUR_RESERVATION. An ordinary reservation: also set "
            f"{t}provisioningModel STANDARD. None: STANDARD, SPOT or FLEX_START",
        )
    if reservation and model in ("SPOT", "FLEX_START"):
        fail(
            t + "reservation",
            f"a {model} VM cannot consume a reservation",
            f"Remove it: pulumi config rm {t}reservation",
        )
    max_run = r.integer(t + "maxRunDurationSeconds", 1, MAX_RUN_DURATION_S)
    if model == "FLEX_START" and max_run and max_run > FLEX_START_MAX_S:
        fail(
            t + "maxRunDurationSeconds",
            f"{max_run} s is more than a flex-start VM may run ({FLEX_START_MAX_S} s, seven days)",
            f"Use at most {FLEX_START_MAX_S} (https://cloud.google.com/compute/docs/instances/about-flex-start-vms)",
        )
    if model == "FLEX_START" and not max_run:
        fail(
            t + "maxRunDurationSeconds",
            "missing; FLEX_START VMs need a maximum run time",
            f"Set it, e.g. pulumi config set {t}maxRunDurationSeconds 14400",
        )
    backend = r.text(t + "backend") or "vm"
    if backend not in BACKENDS:
        fail(
            t + "backend",
            f"unknown backend {backend[:40]!r}",
            "Use vm (one TPU VM over SSH) or gke (a multi-host slice)",
        )
    gke = _gke(r, t) if backend == "gke" else None
    os_login = r.boolean(t + "osLogin")
    public_key = r.text(t + "sshPublicKey")
    if gke is None:  # on gke, jobs reach the slice through the Kubernetes API: no SSH key
        _check_ssh_access(t, os_login, public_key)
    ranges, open_to_all = source_ranges(t + "sshSourceRanges", r.strings(t + "sshSourceRanges"))
    return Settings(
        gcp_project=gcp_project,
        zone=zone,
        instance_name=instance_name,
        machine_type=machine_type,
        image=image,
        boot_disk_gb=boot_disk_gb,
        provisioning_model=model,
        reservation=reservation,
        max_run_duration_s=max_run,
        ssh_user=_ssh_user(r, t),
        ssh_public_key=public_key,
        os_login=os_login,
        ssh_source_ranges=ranges,
        ssh_open_to_all=open_to_all,
        network=r.name(t + "network", NETWORK, f"A VPC network name ({gce_rule})", "default"),
        results_bucket=r.name(t + "resultsBucket", BUCKET, "Bucket names: 3-63 lower-case letters, digits, - and _"),
        service_account_email=r.name(
            t + "serviceAccountEmail", SERVICE_ACCOUNT, "A service account email, NAME@PROJECT.iam.gserviceaccount.com"
        ),
        v6e_zones=tuple(v6e_zones),
        gke=gke,
    )


def _ssh_user(r: _Reader, t: str) -> str:
    user = r.name(t + "sshUser", LINUX_USER, "A Linux user name: lower-case letters, digits, - and _", "tpu-rl")
    if user == "root":
        fail(t + "sshUser", "root may not log in over SSH on the VM image", "Use your own user name (default tpu-rl)")
    return user


def _check_ssh_access(t: str, os_login: bool, public_key: str | None) -> None:
    if os_login and public_key:
        fail(t + "sshPublicKey", f"set together with {t}osLogin", "Use one: OS Login manages keys itself")
    if not os_login:
        if not public_key:
            fail(
                t + "sshPublicKey",
                "missing; Fabric needs SSH access",
                f'Set it: pulumi config set {t}sshPublicKey "$(cat ~/.ssh/id_ed25519.pub)"',
            )
        check_public_key(t + "sshPublicKey", public_key)


def _gke(r: _Reader, t: str) -> GkeSettings:
    topology = r.text(t + "gkeTopology") or "4x4"
    if topology not in GKE_TOPOLOGIES:
        fail(
            t + "gkeTopology",
            f"{topology[:40]!r} is not a multi-host v6e topology",
            f"Use one of {', '.join(GKE_TOPOLOGIES)} (4x4 is v6e-16); one v6e-8 host is the vm backend",
        )
    if not r.text(t + "resultsBucket"):
        fail(
            t + "resultsBucket",
            "missing; on gke every checkpoint and export lives in the stack's bucket",
            f"Set it: pulumi config set {t}resultsBucket YOUR_BUCKET",
        )
    return GkeSettings(
        cluster_name=r.name(
            t + "gkeClusterName", GKE_CLUSTER_NAME, "GKE cluster names: 1-40 lower-case letters, digits and -", "tpu-rl"
        ),
        topology=topology,
        cpu_machine_type=r.name(
            t + "gkeCpuMachineType",
            MACHINE_TYPE,
            "A machine type like n2-standard-64",
            "n2-standard-64",
            "a machine type",
        ),
    )


def from_pulumi() -> Settings:
    """Read every key of the stack's config, a misspelt tpu-rl: key included (to refuse it, not ignore it)."""
    keys = [*KEYS, *(k for k in pulumi.runtime.config.CONFIG.get() if k.startswith(f"{PROJECT}:") and k not in KEYS)]
    return read({key: pulumi.Config(key.split(":")[0]).get(key.split(":", 1)[1]) for key in keys})


def check_jobs(checked: Settings) -> None:
    """The job files against the stack's VM, before anything is made: its machine type must hold their run, and a
    vm.accelerator they pin must be that machine (bootstrap/jobs/accelerator.py). fab reports the job files' other
    problems; only these belong to the stack."""
    from bootstrap.errors import UserError  # the job files' own reader, which fab checks them with
    from bootstrap.jobs import load
    from bootstrap.paths import jobs_dir

    try:
        load.resolve(load.read(jobs_dir()), [], machine_type=checked.machine_type)
    except UserError as err:
        for problem in (p for p in err.problems if p.key == "vm.accelerator"):
            fail(
                f"{PROJECT}:machineType",
                f"{checked.machine_type} does not fit the job files ({problem.source}: vm.accelerator: "
                f"{problem.message})",
                "Change one of them",
            )
