"""One immutable plan per fab command: every job rendered once, with its folder on the VM.

`build` resolves the job files (read once) for the chosen run and decides, exactly,
which jobs are shared by runs: those that render the same for two different run
names (and need only shared jobs). A shared job (convert) lives in one folder for
every run, so a new run never downloads or converts the model again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from .. import secrets
from ..errors import UserError
from ..remote import envcheck, gcs
from ..remote.jobrunner import Layout
from . import check, environment, schedule, tracking
from .accelerator import Accelerator
from .load import DEFERRED, SETUP, JobFiles, Pipeline, RenderedJob, provided_values, render, resolve
from .spec import PipelineSpec
from .task import GSM8K, GSM8K_NAME, TASKS, Task

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUN_NAME_RULE = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
PLACEHOLDER_RUN = "<run_name>"
_OTHER_RUN = "~another-run~"  # never a valid run name, so it cannot collide with a real one
VALIDATE = "validate"  # MaxText's own check of every job's arguments, and the environment's, before train
DURABLE_DIR = "durable_dir"  # the var naming where the converted model and the checkpoints live


def check_run_name(name: str, source: str = "--run-name") -> str:
    if not RUN_NAME.fullmatch(name) or ".." in name:
        raise UserError(f"{source}: {name!r} is not a run name ({RUN_NAME_RULE})")
    return name


@dataclass(frozen=True)
class PlannedJob:
    """A job as this command will drive it: its folder on the VM and what the runner runs there."""

    name: str
    job_dir: str
    runner_spec: Mapping  # what jobrunner.py reads from spec.json
    needs: tuple[str, ...] = ()
    shared: bool = False
    rendered: RenderedJob | None = None  # None for the setup and publish jobs
    target: str = ""  # where a publish job puts the model
    lr_schedule: schedule.Schedule | None = None  # an RL trainer's learning rate at every step

    @property
    def uses_tpu(self) -> bool:
        """A MaxText module: the VM preflight (chips, memory, TPU free) runs before it starts."""
        return self.rendered is not None and self.rendered.module is not None


def runner_spec(layout: Layout, name: str, argv: list[str], outputs: list[str], **extra) -> Mapping:
    """The spec.json of one job: the command, its environment, what decides done."""
    spec = {"name": name, "argv": argv, "env": {}, "secrets": [], "outputs": outputs, "cwd": "~", **extra}
    spec["secrets_dir"] = layout.secrets
    return MappingProxyType(spec)


@dataclass(frozen=True)
class Plan:
    """Everything after `build` reads this; nothing reads jobs/ again."""

    run_name: str
    spec: PipelineSpec
    layout: Layout
    jobs: tuple[PlannedJob, ...]  # setup first, then in run order
    base_model: str | None = None  # the Hugging Face repo the model is converted from
    durable_dir: str = ""  # vars.durable_dir: the converted model's and the checkpoints' place (gs://: a bucket)
    maxtext_version: str = ""  # the MaxText the environment installs, whose facts checked the jobs
    # every folder on the VM the jobs read or write, by the setting that names it: the VM checks that each is
    # the SSH user's alone before any job starts (remote/folders.py)
    folders: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    accelerator: Accelerator | None = None  # what the jobs run on (vm.accelerator, the stack's machine type)
    task: Task = field(default_factory=lambda: Task(GSM8K_NAME, GSM8K, Path(TASKS), {}))  # what train learns

    def job(self, name: str) -> PlannedJob:
        for job in self.jobs:
            if job.name == name:
                return job
        raise UserError(f"no job {name!r}; jobs are {', '.join(self.names)}")

    @property
    def names(self) -> list[str]:
        return [job.name for job in self.jobs]

    @property
    def rendered(self) -> list[RenderedJob]:
        return [job.rendered for job in self.jobs if job.rendered is not None]

    def export_folder(self) -> str:
        """Where the export job writes the model on the VM: the folder of its first output."""
        export = next((j for j in self.rendered if j.name == "export"), None)
        if export is None:
            raise UserError("the pipeline has no export job")
        return export.outputs[0].rsplit("/", 1)[0]


def secret_sources(pipeline: Pipeline) -> dict[str, list[str]]:
    """The secrets each job file declares, by file."""
    return {str(job.doc.path): job.spec.secrets for job in pipeline.jobs.values()}


def check_local(files: JobFiles, overrides: list[str]) -> Pipeline:
    """Every problem in jobs/ and the overrides, MaxText's keys included, before anything is contacted;
    also a secret set on this machine whose value was written into the job files or the overrides."""
    notify = (files.pipeline.data.get("results") or {}).get("notify")  # its URLs redacted from any error below
    secrets.here([entry for entry in notify if isinstance(entry, str)] if isinstance(notify, list) else [])
    pipeline = resolve(files, overrides)
    problems = check.check_pipeline(pipeline)
    problems += check.check_secret_values(pipeline, secrets.here(pipeline.spec.results.notify))
    if problems:
        raise UserError(problems)
    return pipeline


def _setup_job(spec: PipelineSpec, layout: Layout, durable_dir: str) -> PlannedJob:
    env = spec.environment
    job_dir = layout.setup(environment.digest(env))
    ready = f"{job_dir}/ready"
    cache = environment.cache_url(durable_dir)
    script = environment.setup_script(env, ready, (layout.tool("envcache.py"), cache) if cache else None)
    argv = ["bash", "-c", script]
    return PlannedJob(SETUP, job_dir, runner_spec(layout, SETUP, argv, [ready, env.python_path]), shared=True)


def validation_args(jobs: list[RenderedJob]) -> list[str]:
    """maxtext_check.py's arguments for every MaxText job: `--job NAME MODULE ARGS...` each.

    Values looked up on the VM when a job starts (the last checkpoint step) are not known
    yet: 0 stands in, which MaxText's checks accept wherever a step or path goes.
    """
    words = []
    for job in jobs:
        if job.module:
            words += ["--job", job.name, job.module, *(DEFERRED.sub("0", a) for a in job.argv[3:])]
    return words


def expected_environment(spec: PipelineSpec, chips: Accelerator) -> envcheck.Expected:
    """What the environment check proves: the chips JAX must see (vm.accelerator's, with the TPU_ variables the TPU
    jobs get, for its message when libtpu cannot start with them), the packages, the accepted conflicts."""
    env = spec.environment
    accepted = {c.conflict: c.why for c in env.accepted_conflicts}
    named = f"vm.accelerator {chips.name}" + (f" ({chips.source})" if chips.source != "vm.accelerator" else "")
    return envcheck.Expected(chips.chips, chips.device_kind, dict(env.check_packages), accepted, named, dict(chips.env))


def _accelerator_env(jobs: list[RenderedJob]) -> dict[str, str]:
    """The TPU_ variables the MaxText jobs set for libtpu (train's topology; not tpu-rl's own TPU_RL_ ones): JAX
    finds the chips as those jobs will."""
    return {
        k: v
        for job in jobs
        if job.module
        for k, v in job.env.items()
        if k.startswith("TPU_") and not k.startswith("TPU_RL_")
    }


def _validate_job(spec: PipelineSpec, chips: Accelerator, layout: Layout, jobs: list[RenderedJob]) -> PlannedJob:
    """MaxText's own validator on every job at once, and the environment proven (envcheck.py), as soon as the
    environment exists: a rejected argument of export or a missing vLLM fails in seconds, before train spends
    anything. Keyed by the environment too: a rebuilt one is proven again."""
    words = validation_args(jobs) if spec.vm.validate_args else []
    env = {}
    if spec.vm.check_environment:
        words = ["--environment", expected_environment(spec, chips).to_json(), *words]
        env = _accelerator_env(jobs)
    key = json.dumps([environment.digest(spec.environment), env, words])
    job_dir = layout.shared(VALIDATE, hashlib.sha256(key.encode()).hexdigest()[:12])
    marker = f"{job_dir}/accepted"
    argv = [spec.environment.python_path, layout.tool("maxtext_check.py"), "--marker", marker, *words]
    runner = runner_spec(layout, VALIDATE, argv, [marker], env=env)
    return PlannedJob(VALIDATE, job_dir, runner, (SETUP,), shared=True)


def validates(spec: PipelineSpec) -> bool:
    """Whether the plan has a validate job: MaxText's validator, the environment check, or both."""
    return spec.vm.validate_args or spec.vm.check_environment


def _durable_record(durable_dir: str, layout: Layout, job_dir: str, outputs: list[str]) -> str | None:
    """Where a job whose outputs all live in the bucket records that it is done, beside them: a new VM
    finds the job done there (its outputs verified again) instead of running it again."""
    if not gcs.is_gcs(durable_dir) or not outputs or not all(o.startswith(f"{durable_dir}/") for o in outputs):
        return None
    return f"{durable_dir}/tpu-rl/{job_dir.removeprefix(f'{layout.root}/')}.json"


GLOB_OR_LATER = re.compile(r"[*?\[]|\$\{")  # where a path stops being fixed: a glob, or a value looked up on the VM


def _local_folder(value: str) -> str | None:
    """The fixed folder a path on the VM names (up to a glob or a value looked up later); None for anything
    else (a bucket's URL, a name, a list of paths)."""
    fixed = GLOB_OR_LATER.split(value, maxsplit=1)
    if not value.startswith(("/", "~/")) or ":" in fixed[0]:
        return None
    return (fixed[0] if len(fixed) == 1 else fixed[0].rsplit("/", 1)[0]).rstrip("/") or None


def folders(spec: PipelineSpec, values: dict[str, str], layout: Layout, jobs: list[RenderedJob]) -> dict[str, str]:
    """Every folder on the VM the pipeline reads or writes, once, by the first setting that names it: the shared
    vars that are paths (work_dir, durable_dir when it is not a bucket, hf_home, ...), the venv, the state folder,
    then every path a job's arguments, environment, outputs or follow-up steps name. Derived, not listed: a
    folder added to the job files is checked without anyone listing it."""
    found: dict[str, str] = {}

    def add(setting: str, value: str) -> None:
        folder = _local_folder(value)
        if folder is not None and folder not in found.values():
            found[setting] = folder

    for name, value in values.items():
        if name not in provided_values(spec):  # the venv and the tools: below
            add(f"vars.{name}", value)
    add("environment.venv", spec.environment.venv_path)
    add("vm.state_dir", layout.root if layout.root.startswith("/") else f"~/{layout.root}")
    for job in jobs:
        words = [(word.partition("=") if "=" in word else ("argv", "=", word)) for word in job.argv[1:]]
        named = [(f"{job.name}.{key}", value) for key, _, value in words]
        named += [(f"{job.name}.env.{key}", value) for key, value in job.env.items()]
        named += [(f"{job.name}.outputs", p) for p in job.outputs] + [(f"{job.name}.inputs", p) for p in job.inputs]
        named += [(f"{job.name}.after", w) for step in job.after for w in step]
        for setting, value in named:
            add(setting, value)
    return found


def build(
    files: JobFiles,
    overrides: list[str],
    run_name: str = PLACEHOLDER_RUN,
    user: str | None = None,
    machine_type: str | None = None,
) -> Plan:
    """Render every job for `run_name` and place it: in the run's folder, or shared by all runs. `user`: the SSH
    user (its own folder in /dev/shm), the stack's default when not known yet; `machine_type`: the stack's
    (vm.accelerator auto), None when no stack was read."""
    provided = {"user": user} if user else {}
    pipeline = resolve(files, overrides, {**provided, "run_name": run_name}, machine_type)
    other = render(resolve(files, overrides, {**provided, "run_name": _OTHER_RUN}, machine_type))
    other = {job.name: job for job in other}
    spec = pipeline.spec
    layout = Layout(spec.vm.state_dir)
    durable = pipeline.values.get(DURABLE_DIR, "")
    planned = [_setup_job(spec, layout, durable)]
    shared_names = {SETUP}
    modules: set[str] = set()
    for job in render(pipeline):
        shared = job == other[job.name] and all(need in shared_names for need in job.needs)
        if shared:
            shared_names.add(job.name)
        job_dir = layout.shared(job.name, job.key) if shared else layout.run_job(run_name, job.name)
        record = _durable_record(durable, layout, job_dir, job.outputs)
        runner = runner_spec(
            layout, job.name, job.argv, job.outputs, env=job.env, secrets=job.secrets, cwd=job.cwd, after=job.after
        )
        if optional := tracking.optional_secrets(spec, job.module):
            runner = MappingProxyType({**runner, "optional_secrets": optional})
        if record:
            runner = MappingProxyType({**runner, "record": record})
        # A MaxText job after another one waits for the check of all of them; the first (convert) does not:
        # MaxText checks its arguments at its own start, in seconds, and it runs beside the check.
        follows_module = any(need in modules for need in job.needs)
        needs = (*job.needs, VALIDATE) if follows_module and validates(spec) else tuple(job.needs)
        if job.module:
            modules.add(job.name)
        lr = schedule.of(pipeline.maxtext, job.module, pipeline.jobs[job.name].spec.args)
        planned.append(PlannedJob(job.name, job_dir, runner, needs, shared, job, lr_schedule=lr))
    if validates(spec):
        planned.insert(1, _validate_job(spec, pipeline.accelerator, layout, [job.rendered for job in planned[1:]]))
    rendered = [job.rendered for job in planned if job.rendered is not None]
    return Plan(
        run_name,
        spec,
        layout,
        tuple(planned),
        check.base_model_of(pipeline),
        durable,
        pipeline.maxtext.version,
        MappingProxyType(folders(spec, pipeline.values, layout, rendered)),
        pipeline.accelerator,
        pipeline.task,
    )
