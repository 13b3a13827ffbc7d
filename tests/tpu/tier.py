"""The TPU tier's harness: the real jobs as `fab plan` renders them, driven on the TPU host itself by the real
VM-side driver (a TPU host may have no network and no sockets, not even loopback: no SSH, so no fab; the fault
campaign drives the VM side the same way).

The job files are the shipped ones with what this host needs, as a user of a `-H` TPU host would write them:
`vm.accelerator: host` (its own TPU environment: JAX must see `chips` chips of `chip_kind`), the tier's venv
(built by install.sh, stamped as fab's setup job stamps one), folders in a temporary one, and no prefetch job (no
Hub: the tiny model is in a local Hugging Face cache, read offline). The arguments are the CPU tier's `--arg`s
(tests/maxtext_cpu/conftest.py), with its rollout shim, which runs on the chip.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bootstrap.demo import MAKE_INPUTS, SHIM, cpu
from bootstrap.jobs import environment, load
from bootstrap.jobs.plan import Plan, build
from bootstrap.paths import REPO
from bootstrap.remote import jobrunner
from tests.maxtext_cpu.conftest import RELEASES, overrides

VENV_ENV = "TPU_RL_TPU_VENV"  # the tier's venv (install.sh), where the TPU host's JAX runs
ON_CPU_ENV = "TPU_RL_TPU_TIER_ON_CPU"  # 1: the harness tried on a CPU (JAX_PLATFORMS=cpu, vm.accelerator cpu)
RELEASE = RELEASES["0.2.3"]  # MaxText 0.2.5 needs jax >= 0.11; the TPU host's is 0.10.2
CHIP_GLOBS = ("/dev/vfio/[0-9]*", "/dev/accel*")  # where a TPU host shows its chips
COMPILER = "jax._src.compiler"  # JAX's module that logs its persistent cache's hits, at debug level
RUN_SECONDS = 540  # one run of the chain on the chip: about 150 s measured (tpu_v5e.md)
# `uv pip check` lines of the tier's venv, each installed as the tier's wheelhouse carries it: without the
# dependencies the TPU host's index lacks, none of which the three jobs import (they run).
ACCEPTED = {
    f"The package `{name}` requires *": f"{name} is installed from the tier's wheelhouse without its dependencies"
    for name in ("google-tunix", "pathwaysutils", "tokamax", "clu", "grain", "array-record", "qwix", "aqtp",
                 "google-metrax", "einshape", "perfetto", "portpicker", "maxtext", "google-cloud-storage",
                 "google-resumable-media", "google-cloud-core", "math-verify", "latex2sympy2-extended", "omegaconf")
} | {  # and what a package of the host's index declares and the index lacks (said in the tier's output)
    "The package `*` requires `*`, but it's not installed": "the host's index lacks it; the jobs run without it"
}  # fmt: skip


def venv() -> Path:
    found = os.environ.get(VENV_ENV)
    if not found or not Path(found, "bin", "python").exists():
        raise RuntimeError(f"the TPU tier needs its venv: bash tests/tpu/install.sh DIR, then {VENV_ENV}=DIR")
    return Path(found)


def chips_device() -> tuple[str, int]:
    """How this host shows its chips to the VM's preflight: a glob and how many it names."""
    for pattern in CHIP_GLOBS:
        if found := glob.glob(pattern):
            return pattern, len(found)
    return CHIP_GLOBS[0], 0


@dataclass
class Tier:
    """One temporary folder's worth of the tier: inputs, job files, the VM's state and /dev/shm."""

    root: Path
    make_inputs: Path = MAKE_INPUTS
    chips: int = 1
    chip_kind: str = "TPU v5 lite"
    started: dict[str, float] = field(default_factory=dict)
    train_env: dict[str, str] = field(default_factory=dict)  # in train's environment beside what jobs/ renders
    jobs_run: tuple[str, ...] = ("convert", "train", "export")  # a benchmark of train alone leaves export out

    def __post_init__(self) -> None:
        self.inputs, self.jobs, self.state, self.shm = (self.root / n for n in ("inputs", "jobs", "state", "shm"))
        self.python = venv() / "bin" / "python"
        subprocess.run([self.python, self.make_inputs, self.inputs], check=True, capture_output=True)
        self._write_jobs()
        bin_ = self.state / "bin"  # tpu-rl's tools, as fab puts them on the VM
        bin_.mkdir(parents=True)
        for tool in (REPO / "bootstrap" / "remote").glob("[a-z]*.py"):
            shutil.copyfile(tool, bin_ / tool.name)
        secrets = self.state / "secrets"
        secrets.mkdir(parents=True, exist_ok=True)
        (secrets / "HF_TOKEN").write_text("hf_tier-offline-no-hub\n")  # the jobs read the Hub cache offline

    def _write_jobs(self) -> None:
        shutil.copytree(REPO / "jobs", self.jobs)
        pipeline = yaml.safe_load((self.jobs / "pipeline.yaml").read_text())
        pipeline["jobs"] = list(self.jobs_run)  # no prefetch: no Hub here
        if "export" not in self.jobs_run:  # nor MaxText's validator of every job, then: train's time alone is measured
            pipeline["vm"]["validate_args"] = False
        # the CPU tier's health rules: its tiny model's answers are no text; the learnable one's start wrong
        pipeline["health"] = {"smoke": False} if self.make_inputs == MAKE_INPUTS else {"smoke_right": 0}
        pipeline["vars"].update(work_dir=f"{self.shm}/${{model_name}}", hf_home=str(self.inputs / "hf_home"))
        pipeline["environment"] = {
            "python": "3.11",
            "venv": str(venv()),
            "packages": ["maxtext==0.2.3"],
            "check_packages": {"google-tunix": "==0.1.7"},
            "accepted_conflicts": [{"conflict": k, "why": v} for k, v in ACCEPTED.items()],
        }
        glob_, _ = chips_device()
        pipeline["vm"].update(
            state_dir=str(self.state),
            startup_marker=str(self.root / "startup.done"),
            **(
                {"accelerator": "cpu", "check_environment": False}  # a CPU venv is not the tier's
                if os.environ.get(ON_CPU_ENV)
                else {"accelerator": "host", "chips": self.chips, "chip_kind": self.chip_kind}
            ),
            chip_glob=glob_,
            min_memory_gb=0,
            min_shm_gb=0,
            shm_path=str(self.root),
        )
        (self.jobs / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
        convert = yaml.safe_load((self.jobs / "convert.yaml").read_text())
        convert["needs"] = []  # the model is in the local Hugging Face cache already
        (self.jobs / "convert.yaml").write_text(yaml.safe_dump(convert, sort_keys=False))
        files = load.read(self.jobs)
        stamp = venv() / environment.STAMP  # what fab's setup job leaves in a venv it built for this spec
        stamp.write_text(environment.digest(load.resolve(files).spec.environment) + "\n")

    def args(self, steps: int, *extra: str) -> list[str]:
        """The CPU tier's --args for this host: its shim beside the host's own JAX on PYTHONPATH, and MaxText's own
        grader pool (a VM's, which test_chip.py proves is built once)."""
        path = f"{SHIM}:{os.environ.get('PYTHONPATH', '')}"
        unrun = tuple(f"{job}." for job in ("convert", "train", "export") if job not in self.jobs_run)
        kept = (arg for arg in overrides(self.inputs, steps, RELEASE) if arg != cpu.ONE_GRADER)
        return [
            *(arg for arg in kept if not (unrun and arg.startswith(unrun))),
            f"train.env.PYTHONPATH={path}",
            f"convert.env.PYTHONPATH={path}",
            f"train.env.JAX_DEBUG_LOG_MODULES={COMPILER}",  # JAX's own lines on its persistent cache
            *extra,
        ]

    def plan(self, run: str, args: list[str]) -> Plan:
        return build(load.read(self.jobs), args, run)

    def driver_plan(self, plan: Plan) -> dict:
        """The plan as fab's pipeline.driver_plan hands it to the VM's driver (no durable copy, no autostop)."""
        jobs = [
            {"name": j.name, "job_dir": j.job_dir, "spec": self._spec(j), "needs": list(j.needs),
             "uses_tpu": j.uses_tpu, "start": True}
            for j in plan.jobs
        ]  # fmt: skip
        glob_, _ = chips_device()
        preflight = {
            "folders": dict(plan.folders),
            "chips": plan.accelerator.chips if chips_device()[1] else 0,  # a host that shows none is not counted
            "chip_glob": glob_,
            "min_memory_gb": 0,
            "min_shm_gb": 0,
            "shm_path": str(self.root),
            "secrets": {"HF_TOKEN": str(self.state / "secrets" / "HF_TOKEN")},
        }
        return {"run": plan.run_name, "jobs": jobs, "preflight": preflight, "digest": plan.run_name, "hint": ""}

    def _spec(self, job) -> dict:
        spec = dict(job.runner_spec)
        if job.name == "train" and self.train_env:
            spec["env"] = {**spec["env"], **self.train_env}
        return spec

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{venv() / 'bin'}:{os.environ.get('PATH', '')}",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **({"JAX_PLATFORMS": "cpu"} if os.environ.get(ON_CPU_ENV) else {}),
        }

    def drive(self, plan: Plan, seconds: float = RUN_SECONDS) -> list[dict]:
        """`driver.py start --follow` as fab runs it on the VM: its items, each with when it came (`at`)."""
        argv = [sys.executable, str(self.state / "bin" / "driver.py"), "start", str(self.state), "--follow"]
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env()
        )
        process.stdin.write(json.dumps(self.driver_plan(plan)))
        process.stdin.close()
        items, deadline = [], time.monotonic() + seconds
        for line in process.stdout:
            items.append({**json.loads(line), "at": time.monotonic()})
            if time.monotonic() > deadline:
                process.kill()
                break
        process.wait(timeout=60)
        return items

    def failure(self, plan: Plan) -> str:
        """What failed, for an assertion's message: the driver's verdicts and the last lines of each job's log."""
        record = jobrunner.read_json(str(self.state / "pipeline" / "driver.json")) or {}
        lines = [f"failed: {record.get('failed')}"]
        for job in plan.jobs:
            log = Path(job.job_dir) / jobrunner.LOG
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            lines += [f"--- {job.name}", *tail]
        return "\n".join(lines)

    def log(self, plan: Plan, job: str) -> str:
        return (Path(plan.job(job).job_dir) / jobrunner.LOG).read_text(errors="replace")

    def kill_all(self) -> None:
        """Every process the pipeline started (the driver, runners, jobs), as a lost VM loses them."""
        records = [self.state / "pipeline" / "driver.json", *self.state.glob("**/runner.json")]
        records += list(self.state.glob("**/process.json"))
        for record in records:
            pid = (jobrunner.read_json(str(record)) or {}).get("pid")
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                    kill(pid, 9)


RESULTS = Path(os.environ.get("OUT") or ".") / "tpu-tier.json"  # the numbers, for docs/benchmarks.md


def note(**numbers) -> None:
    """Keep a measured number beside the others (the tier's output, read into docs/benchmarks.md)."""
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(json.dumps({**kept, **numbers}, indent=1))


def seconds_to_first_step(items: list[dict]) -> float | None:
    """From train's start (its decide event) to its first `Train step 1` line, as they came."""
    start = next((i["at"] for i in items if i.get("event") == "decide" and i.get("job") == "train"), None)
    first = next((i["at"] for i in items if i.get("job") == "train" and "Train step 1 " in i.get("line", "")), None)
    return first - start if start is not None and first is not None else None


def finished(items: list[dict]) -> str | None:
    return next((i["state"] for i in items if i.get("event") == "finished"), None)
