"""A real OpenSSH server on 127.0.0.1 with throwaway keys, and `fab` run against it.

Shared by the SSH tests (tests/ssh/conftest.py) and the benchmarks.

The loopback host plays the TPU VM: its PATH offers uv and (last) a Python 3.12 (as the
startup script leaves the VM), and jobs/ is the real one with the test settings
below: state and "/dev/shm" under a temp dir, no TPU chips, and the stand-in
maxtext package (tests/standin) installed by `fab setup` in place of the real one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bootstrap.vm.here import NETWORK_ENV
from scripts.maxtext_config_env import python312
from tests import fabfork, hubstub

REPO = Path(__file__).resolve().parents[1]
SSHD = shutil.which("sshd", path="/usr/sbin:/usr/bin:/sbin") or "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Host:
    port: int
    key: Path
    bin_dir: Path
    user: str

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    @property
    def host_key(self) -> Path:
        return self.key.with_name("host_key.pub")

    def known_hosts_line(self) -> str:
        """This host as ~/.ssh/known_hosts records it (ssh -p PORT writes [127.0.0.1]:PORT)."""
        kind, blob = self.host_key.read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {blob}\n"


@contextmanager
def loopback_host(root: Path, extra_env: dict[str, str] | None = None, sftp: bool = True) -> Iterator[Host]:
    """Start sshd on 127.0.0.1 with keys made in `root`; stop it on exit. `extra_env`: the VM's environment;
    `sftp`: whether it serves the SFTP subsystem. Its log (root/sshd.log) names every command it ran
    (`round_trips` counts them)."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", root / "host_key"], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", root / "user_key"], check=True)
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    bin_dir = root / "bin"
    bin_dir.mkdir()
    pinned = Path(sys.executable).with_name("uv")  # requirements-dev's: the stand-in's build backend is its version's
    (bin_dir / "uv").symlink_to(pinned if pinned.exists() else shutil.which("uv"))

    port = _free_port()
    config = root / "sshd_config"
    # The machine's own network settings (CA bundle, proxy, index), as a VM would have its own.
    # SHLVL=1: bash runs no ~/.bashrc for a command (it does for a top-level shell run by sshd), as a TPU VM's
    # Ubuntu .bashrc does nothing for one; this machine's runs `pyenv init` and puts its shims before python3.
    passed = " ".join(
        f"{k}={v}"
        for k, v in {**os.environ, **(extra_env or {})}.items()
        if k in NETWORK_ENV or k.startswith("UV_") and " " not in v or k in (extra_env or {})
    )
    config.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {root / "host_key"}
AuthorizedKeysFile {root / "authorized_keys"}
PidFile {root / "sshd.pid"}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
SetEnv SHLVL=1 PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin:{Path(python312()).parent} {passed}
{"Subsystem sftp internal-sftp" if sftp else ""}
ClientAliveInterval 5
LogLevel DEBUG1
"""
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    with open(root / "sshd.log", "w") as log:
        server = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=log)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"sshd did not start: {(root / 'sshd.log').read_text()}") from None
            time.sleep(0.1)
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    try:
        yield Host(port, root / "user_key", bin_dir, user)
    finally:
        server.terminate()
        server.wait(timeout=10)


def wait_for(condition, timeout: float = 180, what: str = "condition"):
    """Poll `condition` until it is true (and return it); fail after `timeout` seconds, never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


HF_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
INSTRUCT_TOKEN_IDS = {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}


def write_hub_cache(hf_home: Path) -> None:
    """The model's files as the Hub leaves them in a Hugging Face cache (HF_HUB_OFFLINE=1 reads it)."""
    repo = hf_home / "hub" / f"models--{HF_MODEL.replace('/', '--')}"
    snapshot = repo / "snapshots" / "0e9e39f249a16976918f6564b8830bc894c89659"
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(snapshot.name)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama", **INSTRUCT_TOKEN_IDS}))
    (snapshot / "generation_config.json").write_text(json.dumps({**INSTRUCT_TOKEN_IDS, "temperature": 0.6}))
    (snapshot / "model.safetensors").write_bytes(b"weights")


def edit_yaml(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def round_trips(host: Host) -> int:
    """How many commands and subsystems (SFTP) the loopback sshd has run so far: one a round trip."""
    log = (host.key.parent / "sshd.log").read_text(errors="replace")
    return len(re.findall(r"session_input_channel_req: session \d+ req (?:exec|subsystem)", log))


def write_test_jobs(directory: Path, tmp: Path, packages: list[str], venv: Path | None = None) -> None:
    """The real jobs/, with the settings a loopback host without a TPU needs, and the Hub's files in a
    local Hugging Face cache read offline."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in (REPO / "jobs").glob("*.yaml"):
        shutil.copy(path, directory / path.name)
    write_hub_cache(tmp / "hf_home")
    for job in ("prefetch", "export"):
        edit_yaml(directory / f"{job}.yaml", lambda data: data["env"].update(HF_HUB_OFFLINE="1"))
    pipeline = yaml.safe_load((REPO / "jobs" / "pipeline.yaml").read_text())
    pipeline["vars"]["work_dir"] = f"{tmp}/shm/${{model_name}}"
    pipeline["vars"]["hf_home"] = str(tmp / "hf_home")
    pipeline["environment"] = {"python": "3.12", "venv": str(venv or tmp / "venv"), "packages": packages}
    pipeline["results"]["publish_if"] = "always"  # the stand-ins' evals judge nothing; tests of the gate set it
    (tmp / "startup.done").write_text("ok\n")
    pipeline["vm"].update(
        state_dir=str(tmp / "state"),
        startup_marker=str(tmp / "startup.done"),
        startup_log=str(tmp / "startup.log"),
        accelerator="cpu",
        min_memory_gb=0,
        min_shm_gb=0,
        shm_path=str(tmp),
        validate_args=False,  # the stand-in maxtext has no pyconfig
        check_environment=False,  # nor jax, tunix or vLLM
    )
    (directory / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))


class Runs:
    """Runs `fab` as `command()` and `env()` say: to its end, or started in the background."""

    def command(self, *args: str) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return fabfork.run(
            self.command(*args),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def start(self, *args: str, own_group: bool = False) -> subprocess.Popen:
        """fab running; `own_group`: in a process group of its own, which os.killpg ends with what fab started."""
        return subprocess.Popen(
            self.command(*args),
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=own_group,
        )


@dataclass
class Fab(Runs):
    host: Host
    tmp: Path
    token: str
    jobs: Path
    hub: hubstub.Hub
    secrets: dict[str, str] = field(default_factory=dict)  # more secrets in fab's environment (a W&B key)

    def __post_init__(self) -> None:
        """fab's home: a known_hosts that knows the loopback host, as after `fab trust-host`."""
        (self.home / ".ssh").mkdir(parents=True, exist_ok=True)
        (self.home / ".ssh" / "known_hosts").write_text(self.host.known_hosts_line())

    @property
    def home(self) -> Path:
        return self.tmp / "home"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.home),
            "TPU_RL_JOBS": str(self.jobs),
            "TPU_RL_RUNS": str(self.tmp / "runs"),
            "HF_TOKEN": self.token,
            "HF_ENDPOINT": self.hub.url,
            "COLUMNS": "200",
            **self.secrets,
        }

    def command(self, *args: str) -> list[str]:
        return [fabfork.FAB, "-r", str(REPO), "-H", self.host.target, "-i", str(self.host.key), *args]

    def job_dir(self, run: str, job: str) -> Path:
        return self.tmp / "state" / "runs" / run / job
