"""The built environment proven before the first TPU job: the accelerator, the rollout packages, `uv pip check`.

Run by the validate job (maxtext_check.py --environment JSON) in the venv's Python, beside
convert: what would make train fail at its start (JAX not seeing the chips, tunix, vLLM or
tpu-inference missing, broken or from another commit, a dependency conflict nobody accepted)
fails here instead, one line each, before convert's minutes are spent on a train that cannot
start. The process exits before train starts (train needs validate), so the TPU is free again.

The facts (JAX's devices, the installed distributions, uv's report) are gathered by `gather`;
`problems` judges them against what the spec expects, so the judging is tested without a TPU.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ERROR_MARK = "ENVIRONMENT ERROR:"
# What install_tpu_post_train_extra_deps installs with --no-deps: one `name @ url` a line, in the maxtext wheel.
MAXTEXT_PINS = "dependencies/extra_deps/post_train_github_deps.txt"
FROM_MAXTEXT = "maxtext"  # a package's expected version: MaxText's pin in MAXTEXT_PINS
UV_CONFLICT = re.compile(r"^The package `[^`]+` ")
SLICE_VARIABLES = ("TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")


@dataclass(frozen=True)
class Expected:
    """What the spec says the environment is (plan.py builds it from jobs/pipeline.yaml)."""

    chips: int  # vm.accelerator's chips: that many TPU devices of `chip_kind`; 0: JAX on CPU
    chip_kind: str  # JAX's device_kind ("TPU v6 lite" for v6e)
    packages: dict[str, str]  # environment.check_packages: name -> "maxtext" or "==VERSION"
    accepted: dict[str, str] = field(default_factory=dict)  # `uv pip check` line -> why it is accepted
    accelerator: str = "vm.accelerator"  # the setting the chips come from, for the messages
    slice_env: dict[str, str] = field(default_factory=dict)  # libtpu's TPU_ variables, which the check runs with

    @classmethod
    def from_json(cls, text: str) -> Expected:
        return cls(**json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


@dataclass(frozen=True)
class Installed:
    """One distribution as the venv has it: version, PEP 610 origin, and whether its modules import."""

    version: str
    direct_url: dict | None = None
    import_error: str | None = None


@dataclass(frozen=True)
class Facts:
    platform: str  # JAX's default backend ("tpu", "cpu"), or "" when JAX could not list devices
    device_kinds: list[str]
    jax_error: str | None
    installed: dict[str, Installed | None]  # by expected name; None: not installed
    pins: dict[str, str]  # MaxText's `name @ url` pins by name
    maxtext: str  # MaxText's version, for the messages
    conflicts: list[str]  # the lines of `uv pip check`
    uv_error: str | None = None


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- judging --------------------------------------------------------------------------------------


# What libtpu says when the TPU_ variables describe another slice than the host's (measured on a v5e host with
# v6e-8's: tpu_v5e.md), and when it cannot start for another reason.
TOPOLOGY_ERRORS = ("Failed to get global TPU topology", "Unable to initialize backend 'tpu'")


def accelerator_problem(expected: Expected, facts: Facts) -> str | None:
    setting = expected.accelerator
    if facts.jax_error and expected.slice_env and any(e in facts.jax_error for e in TOPOLOGY_ERRORS):
        variables = " ".join(f"{k}={v}" for k, v in expected.slice_env.items() if k in SLICE_VARIABLES)
        return (
            f"accelerator: libtpu cannot start with {setting}'s slice ({variables}): this host is another TPU; set "
            f"vm.accelerator in jobs/pipeline.yaml (or the stack's tpu-rl:machineType) to what it is "
            f"({facts.jax_error.strip().splitlines()[-1][:300]})"
        )
    if facts.jax_error:
        return f"accelerator: JAX could not list its devices: {facts.jax_error}"
    seen = f"{len(facts.device_kinds)} {facts.platform} device(s) ({', '.join(sorted(set(facts.device_kinds)))})"
    if expected.chips == 0:
        ok = facts.platform == "cpu"
        return None if ok else f"accelerator: JAX sees {seen}, {setting} expects CPU only"
    want = f"{expected.chips} tpu devices ({expected.chip_kind})"
    if facts.platform != "tpu" or len(facts.device_kinds) != expected.chips:
        return f"accelerator: JAX sees {seen}, {setting} expects {want}"
    if expected.chip_kind and set(facts.device_kinds) != {expected.chip_kind}:
        return f"accelerator: JAX sees {seen}, {setting} expects {want}"
    return None


def _origin(installed: Installed) -> str:
    """Where an installed distribution came from, as its PEP 610 record says."""
    url = (installed.direct_url or {}).get("url")
    if not url:
        return f"{installed.version} (from an index)"
    vcs = (installed.direct_url or {}).get("vcs_info")
    return (
        f"{installed.version} from {vcs['vcs']}+{url}@{vcs.get('commit_id', '?')}"
        if vcs
        else f"{installed.version} from {url}"
    )


def matches_pin(installed: Installed, pin_url: str) -> bool:
    """Whether an install is MaxText's pin: the same archive, or the same repository at the pinned commit."""
    record = installed.direct_url or {}
    if not pin_url.startswith("git+"):
        return record.get("url") == pin_url
    repo, _, rev = pin_url[len("git+") :].rpartition("@")
    vcs = record.get("vcs_info") or {}
    same_repo = record.get("url", "").removesuffix(".git") == repo.removesuffix(".git")
    commit = vcs.get("commit_id", "")
    return same_repo and bool(rev) and (commit.startswith(rev) or vcs.get("requested_revision") == rev)


def package_problem(name: str, wanted: str, facts: Facts) -> str | None:
    installed = facts.installed.get(name)
    if wanted == FROM_MAXTEXT:
        pin = facts.pins.get(normalize(name))
        if pin is None:
            return f"{name}: MaxText {facts.maxtext}'s {MAXTEXT_PINS} has no pin for it (environment.check_packages)"
        source = f"{name} @ {pin} (MaxText {facts.maxtext}'s {MAXTEXT_PINS.rsplit('/', 1)[-1]})"
        if installed is None:
            return f"{name}: not installed, the spec installs {source}"
        if not matches_pin(installed, pin):
            return f"{name}: {_origin(installed)} installed, the spec installs {source}"
    else:
        version = wanted.removeprefix("==")
        if installed is None:
            return f"{name}: not installed, the spec installs {name}=={version}"
        if installed.version != version:
            return f"{name}: {installed.version} installed, the spec installs {name}=={version}"
    if installed.import_error:
        return f"{name} {installed.version}: does not import: {installed.import_error}"
    return None


def accepted(expected: Expected, line: str) -> bool:
    """Whether an accepted conflict covers `line`: the same text, where a `*` stands for any text."""
    return any(fnmatch.fnmatchcase(line, pattern) for pattern in expected.accepted)


def conflict_problems(expected: Expected, facts: Facts) -> list[str]:
    if facts.uv_error:
        return [f"uv pip check: {facts.uv_error}"]
    return [
        f"uv pip check: {line} (not among environment.accepted_conflicts)"
        for line in facts.conflicts
        if not accepted(expected, line)
    ]


def problems(expected: Expected, facts: Facts) -> list[str]:
    """Every way the environment differs from the spec, one line each (empty: it is what the jobs expect)."""
    found = [accelerator_problem(expected, facts)]
    found += [package_problem(name, wanted, facts) for name, wanted in expected.packages.items()]
    return [p for p in found if p] + conflict_problems(expected, facts)


def summary(expected: Expected, facts: Facts) -> str:
    devices = f"{len(facts.device_kinds)} {facts.platform} device(s)"
    packages = ", ".join(f"{n} {facts.installed[n].version}" for n in expected.packages if facts.installed.get(n))
    count = sum(accepted(expected, line) for line in facts.conflicts)
    return f"ok: JAX sees {devices}; {packages or 'no packages to check'}; uv pip check: {count} accepted conflict(s)"


# --- gathering ------------------------------------------------------------------------------------


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def _devices() -> tuple[str, list[str], str | None]:
    try:
        import jax

        devices = jax.devices()
        return jax.default_backend(), [d.device_kind for d in devices], None
    except Exception as err:  # no jax, or a backend that does not start: both are the answer
        return "", [], _first_line(err)


def _modules(dist: metadata.Distribution) -> list[str]:
    """The top-level packages a distribution installs (what `import` of it means)."""
    tops = {str(f).split("/", 1)[0] for f in dist.files or [] if str(f).endswith("/__init__.py")}
    return sorted(t for t in tops if t.isidentifier() and not t.startswith("_") and t not in ("tests", "test"))


def _installed(name: str) -> Installed | None:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    text = dist.read_text("direct_url.json")
    error = None
    for module in _modules(dist):
        try:
            importlib.import_module(module)
        except BaseException as err:  # noqa: BLE001 - an import may even exit; any of it is the answer
            error = f"import {module}: {_first_line(err)}"
            break
    return Installed(dist.version, json.loads(text) if text else None, error)


def _maxtext_pins() -> tuple[str, dict[str, str]]:
    try:
        dist = metadata.distribution("maxtext")
    except metadata.PackageNotFoundError:
        return "(not installed)", {}
    path = Path(str(dist.locate_file(MAXTEXT_PINS)))
    pins = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        name, at, url = line.partition(" @ ")
        if at:
            pins[normalize(name.strip())] = url.strip()
    return dist.version, pins


def _uv() -> list[str] | None:
    """The uv the setup used: the venv's own (install_tpu_post_train_extra_deps installs it), else the VM's."""
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    found = shutil.which("uv", path=f"{os.environ.get('PATH', '')}:{os.path.expanduser('~/.local/bin')}")
    return [found] if found else None


def _conflicts() -> tuple[list[str], str | None]:
    uv = _uv()
    if uv is None:
        return [], f"no uv in {sys.prefix} or on PATH (the setup job installs it)"
    result = subprocess.run([*uv, "pip", "check", "--python", sys.executable], capture_output=True, text=True)
    lines = [line.strip() for line in (result.stdout + result.stderr).splitlines()]
    conflicts = [line for line in lines if UV_CONFLICT.match(line)]
    if result.returncode and not conflicts:
        return [], f"exited with {result.returncode}: {next((x for x in reversed(lines) if x), '')[:300]}"
    return conflicts, None


def gather(expected: Expected) -> Facts:
    platform, kinds, jax_error = _devices()
    version, pins = _maxtext_pins()
    conflicts, uv_error = _conflicts()
    installed = {name: _installed(name) for name in expected.packages}
    return Facts(platform, kinds, jax_error, installed, pins, version, conflicts, uv_error)
