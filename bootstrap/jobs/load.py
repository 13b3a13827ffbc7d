"""Turn jobs/*.yaml (plus --arg overrides) into the exact commands that run on the VM.

The files are read once (`read`); everything after works on that text in memory, so
a file edited during a run changes nothing. Resolving checks the YAML structure,
applies overrides, resolves ${variables} and orders the jobs by their `needs`. Every
problem names the file (and line) or the --arg that caused it, and all of them are
reported at once.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import re
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from ..errors import Problem, UserError, shortened
from ..remote.jobrunner import Layout
from . import accelerator, schedule, schema, task, tracking, yamlfile
from .accelerator import Accelerator
from .spec import JOB_NAME, PATTERN_WORDS, JobSpec, PipelineSpec

NAME_LIKE = re.compile(r"[A-Za-z0-9_:-]{1,80}")  # what may be quoted back from results.notify: no URL, no secret

PIPELINE_FILE = "pipeline.yaml"
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Looked up on the VM when the job starts (see bootstrap/remote/jobrunner.py).
DEFERRED = re.compile(r"\$\{(hostname|latest_step:[^{}]+)\}")
# The key of a job's definition (see RenderedJob.key): a folder named by what made it, e.g. the converted
# checkpoint's, so a convert with other arguments writes beside the first one, never over it.
JOB_KEY = re.compile(r"\$\{key:([^{}]*)\}")


@dataclass
class Origin:
    """Where a value came from: a file and line, or a --arg option."""

    source: str
    line: int | None = None

    def problem(self, key: str, message: str) -> Problem:
        return Problem(self.source, key, message, self.line)


@dataclass
class Loaded:
    """A parsed YAML document with the origins of its values."""

    path: Path
    data: dict
    lines: yamlfile.Lines
    overridden: dict[tuple[str, ...], str] = field(default_factory=dict)

    def origin(self, *path: str) -> Origin:
        for depth in range(len(path), 0, -1):
            if path[:depth] in self.overridden:
                return Origin(self.overridden[path[:depth]])
            if path[:depth] in self.lines:
                return Origin(str(self.path), self.lines[path[:depth]])
        return Origin(str(self.path), None)


@dataclass
class Job:
    name: str
    spec: JobSpec
    doc: Loaded

    def origin(self, *path: str) -> Origin:
        return self.doc.origin(*path)


@dataclass
class Pipeline:
    directory: Path
    spec: PipelineSpec
    doc: Loaded
    jobs: dict[str, Job]  # in run order
    values: dict[str, str] = field(default_factory=dict)  # the shared vars, resolved
    maxtext: schema.MaxText = field(default_factory=schema.load)  # the version environment.packages installs
    accelerator: Accelerator = field(default_factory=lambda: accelerator.derive(accelerator.AUTO, None, None, None)[0])
    task: task.Task = field(default_factory=lambda: task.Task("gsm8k", task.GSM8K, Path(task.TASKS), {}))


@dataclass
class RenderedJob:
    """A job as it runs: argv, environment, and the paths that decide whether it is done."""

    name: str
    description: str
    module: str | None  # None for a plain command
    argv: list[str]  # a module's: python, `-m` or its launcher, the module, then its arguments
    env: dict[str, str]
    secrets: list[str]
    cwd: str
    needs: list[str]  # a MaxText module also needs the environment: "setup"
    inputs: list[str]
    outputs: list[str]
    after: list[list[str]] = field(default_factory=list)
    progress: dict | None = None
    key: str = ""  # what defines it (command, environment, outputs), as 12 hex digits: see `with_keys`

    def to_dict(self) -> dict:
        return asdict(self)


def definition_key(job: RenderedJob) -> str:
    """The hash of what the job does and writes, with ${key:...} references left as written."""
    return hashlib.sha256(json.dumps([job.argv, job.env, job.outputs, job.after]).encode()).hexdigest()[:12]


def _with_known_keys(job: RenderedJob, keys: dict[str, str]) -> RenderedJob:
    """`job` with each ${key:JOB} whose key is known replaced by it; the others as written."""
    put = lambda text: JOB_KEY.sub(lambda m: keys.get(m.group(1), m.group(0)), text)  # noqa: E731
    progress = {**job.progress, "tensorboard_dir": put(job.progress["tensorboard_dir"])} if job.progress else None
    return dataclasses.replace(
        job,
        argv=[put(a) for a in job.argv],
        env={k: put(v) for k, v in job.env.items()},
        inputs=[put(p) for p in job.inputs],
        outputs=[put(p) for p in job.outputs],
        after=[[put(a) for a in step] for step in job.after],
        progress=progress,
    )


def with_keys(jobs: list[RenderedJob]) -> list[RenderedJob]:
    """Each job with its key, and every ${key:JOB} replaced by that job's key. Jobs come in run order, and
    a key covers the keys of earlier jobs that it names (a job that reads convert's folder changes with
    it); its own key, or a later job's, is hashed as written, so a job may name its own in its outputs."""
    keys: dict[str, str] = {}
    for job in jobs:
        keys[job.name] = definition_key(_with_known_keys(job, keys))
    return [dataclasses.replace(_with_known_keys(job, keys), key=keys[job.name]) for job in jobs]


def _keys_at(model, path: tuple[str, ...]) -> list[str]:
    """The keys the schema allows at `path` under `model` (for a "did you mean"); [] where it cannot tell."""
    for part in path:
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        inner = (
            [t for t in _types(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)] if field else []
        )
        if not inner:
            return []
        model = inner[0]
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _types(annotation) -> list:
    """An annotation and every type inside it (list[X], X | None, dict[K, V], Annotated[X, ...])."""
    return [annotation, *(t for arg in typing.get_args(annotation) for t in _types(arg))]


def _validate(model, doc: Loaded, problems: list[Problem]):
    try:
        return model.model_validate(doc.data)
    except ValidationError as err:
        for e in err.errors():
            path = tuple(str(p) for p in e["loc"] if p != "[key]")
            message = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                close = difflib.get_close_matches(path[-1], _keys_at(model, path[:-1]), n=1, cutoff=0.7)
                message = "unknown key (not part of the schema)" + (f"; did you mean {close[0]}?" if close else "")
            elif (
                e["type"] == "string_pattern_mismatch"
                and path[:2] == ("results", "notify")
                and not NAME_LIKE.fullmatch(str(e["input"]))
            ):
                # a webhook URL (with or without its scheme) written where its variable's name goes: a secret
                message = (
                    "is a URL (not repeated here: it may be a secret), not the name of a variable holding one: "
                    "export NAME=<the URL> on this machine and write NAME here"
                )
            elif e["type"] == "string_pattern_mismatch" and e["ctx"]["pattern"] in PATTERN_WORDS:
                message = f"{e['input']!r} is not {PATTERN_WORDS[e['ctx']['pattern']]}"
            elif "[key]" in e["loc"]:
                message = "not a valid name (letters, digits and _, not starting with a digit)"
            problems.append(doc.origin(*path).problem(".".join(path), message))
        return None


def _apply_overrides(overrides: list[str], pipeline: Loaded, jobs: dict[str, Loaded], problems: list[Problem]) -> None:
    """Apply `--arg JOB.KEY=VALUE` (or vars.NAME=VALUE); a KEY starting with -- is a flag."""
    for text in overrides:
        option = f"--arg {text!r}" if yamlfile.CONTROL.search(text) else f"--arg {shortened(text)}"
        target, sep, value = text.partition("=")
        if yamlfile.CONTROL.search(text):
            problems.append(Problem(option, "--arg", "contains a control character (NUL, ESC, ...)"))
            continue
        name, dot, key = target.partition(".")
        if not sep or not dot or not key:
            problems.append(Problem(option, "--arg", "expected JOB.KEY=VALUE, e.g. --arg train.num_batches=100"))
            continue
        if name == "vars":
            pipeline.data.setdefault("vars", {})[key] = value
            pipeline.overridden[("vars", key)] = option
            continue
        if name not in jobs and name in PipelineSpec.model_fields:
            where = f"{pipeline.path.name} ({name}: {key})"
            problems.append(Problem(option, name, f"set in {where}, not with --arg (JOB.KEY or vars.NAME)"))
            continue
        if name not in jobs:
            problems.append(Problem(option, name, f"no such job; use one of {', '.join(jobs)} or vars"))
            continue
        section, key = ("flags", key[2:]) if key.startswith("--") else ("args", key)
        if key.startswith("env."):
            section, key = "env", key[4:]
        jobs[name].data.setdefault(section, {})[key] = value
        jobs[name].overridden[(section, key)] = option


def _resolve_vars(pipeline: Loaded, provided: dict[str, str], problems: list[Problem]) -> dict[str, str]:
    """Resolve the shared vars against each other and fab's provided values."""
    raw = {k: v for k, v in (pipeline.data.get("vars") or {}).items() if isinstance(v, str)}
    resolved = dict(provided)
    known = {**provided, **raw}

    def resolve(name: str, stack: tuple[str, ...]) -> str:
        if name in resolved:
            return resolved[name]
        if name in stack:
            cycle = " -> ".join((*stack, name))
            problems.append(pipeline.origin("vars", name).problem(f"vars.{name}", f"refers to itself: {cycle}"))
            resolved[name] = ""
            return ""
        resolved[name] = substitute(
            raw[name],
            lambda ref: resolve(ref, (*stack, name)),
            pipeline.origin("vars", name),
            f"vars.{name}",
            problems,
            known,
        )
        return resolved[name]

    for name in raw:
        resolve(name, ())
    return resolved


def substitute(text: str, lookup, origin: Origin, key: str, problems: list[Problem], known) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name in known:
            return lookup(name)
        if DEFERRED.fullmatch(match.group(0)):
            return match.group(0)
        problems.append(origin.problem(key, f"undefined variable ${{{name}}}; defined: {', '.join(sorted(known))}"))
        return match.group(0)

    return VAR.sub(replace, text)


def _order(jobs: dict[str, Job], listed: list[str], problems: list[Problem]) -> dict[str, Job]:
    """Order jobs so that each comes after what it needs; report unknown needs and cycles."""
    for job in jobs.values():
        for need in job.spec.needs:
            if need not in listed:
                problems.append(job.origin("needs").problem("needs", f"no job {need!r}; jobs are {', '.join(listed)}"))
    ordered: dict[str, Job] = {}
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in ordered or name not in jobs:
            return
        if name in visiting:
            cycle = " -> ".join([*visiting[visiting.index(name) :], name])
            problems.append(jobs[name].origin("needs").problem("needs", f"dependency cycle: {cycle}"))
            return
        visiting.append(name)
        for need in jobs[name].spec.needs:
            visit(need)
        visiting.pop()
        ordered[name] = jobs[name]

    for name in listed:
        visit(name)
    return ordered


@dataclass(frozen=True)
class JobFiles:
    """jobs/ as read from disk, once: the pipeline document and each job's document."""

    directory: Path
    pipeline: Loaded
    jobs: dict[str, Loaded]
    problems: tuple[Problem, ...] = ()
    task: Loaded | None = None  # tasks/NAME.yaml of the task pipeline.yaml names (None: GSM8K, built in)


def read(directory: Path) -> JobFiles:
    """Parse pipeline.yaml and every job file it lists; problems are kept for `resolve` to report."""
    problems: list[Problem] = []
    pipeline_doc = Loaded(directory / PIPELINE_FILE, *yamlfile.load(directory / PIPELINE_FILE))
    names = pipeline_doc.data.get("jobs") if isinstance(pipeline_doc.data.get("jobs"), list) else []
    job_docs: dict[str, Loaded] = {}
    for name in names:
        if not isinstance(name, str) or not re.fullmatch(JOB_NAME, name):
            continue  # the schema reports it; its file is never looked for
        path = directory / f"{name}.yaml"
        if not path.is_file():
            problems.append(pipeline_doc.origin("jobs").problem("jobs", f"job {name!r} has no file {path}"))
            continue
        try:
            job_docs[name] = Loaded(path, *yamlfile.load(path))
        except UserError as err:
            problems.extend(err.problems)
    task_doc = None
    named = pipeline_doc.data.get("task", task.GSM8K_NAME)
    path = directory / task.TASKS / f"{named}.yaml"
    if isinstance(named, str) and re.fullmatch(task.TASK_NAME, named) and path.is_file():
        try:
            task_doc = Loaded(path, *yamlfile.load(path))
        except UserError as err:
            problems.extend(err.problems)
    elif isinstance(named, str) and named != task.GSM8K_NAME and re.fullmatch(task.TASK_NAME, named):
        problems.append(pipeline_doc.origin("task").problem("task", f"task {named!r} has no file {path}"))
    return JobFiles(directory, pipeline_doc, job_docs, tuple(problems), task_doc)


def resolve(
    files: JobFiles, overrides: list[str] = (), provided: dict[str, str] | None = None, machine_type: str | None = None
) -> Pipeline:
    """The checked pipeline for these overrides and provided values, on a stack of `machine_type` (None: no stack
    read, vm.accelerator auto is the default's); raise UserError listing every problem."""
    problems = list(files.problems)
    pipeline_doc = copy.deepcopy(files.pipeline)
    job_docs = copy.deepcopy(files.jobs)
    _apply_overrides(list(overrides), pipeline_doc, job_docs, problems)
    spec = _validate(PipelineSpec, pipeline_doc, problems)
    jobs = {}
    for name, doc in job_docs.items():
        job_spec = _validate(JobSpec, doc, problems)
        if job_spec is not None:
            jobs[name] = Job(name, job_spec, doc)
    if spec is None:
        raise UserError(problems)
    tracking.with_wandb(spec.environment, spec.results)
    maxtext = _maxtext(spec, pipeline_doc, problems)
    chips, why = accelerator.derive(spec.vm.accelerator, spec.vm.chips, spec.vm.chip_kind, machine_type)
    if why:
        problems.append(pipeline_doc.origin("vm", "accelerator").problem("vm.accelerator", why))
    values = _resolve_vars(pipeline_doc, {**provided_values(spec, chips), **(provided or {})}, problems)
    for job in jobs.values():
        _resolve_job(job, values, spec.jobs, maxtext, problems)
        if (
            job.spec.tpu
            and job.spec.module
            and (why := accelerator.fit_problem(chips, maxtext, job.spec.module, job.spec.args))
        ):
            problems.append(pipeline_doc.origin("vm", "accelerator").problem("vm.accelerator", why))
    ordered = _order(jobs, spec.jobs, problems)
    chosen = _task(files, spec, maxtext, problems)
    if chosen is not None:
        for job in (j for j in ordered.values() if j.spec.module == schedule.RL_TRAINER):
            _with_task(job, chosen, Layout(spec.vm.state_dir), problems)
    if problems:
        raise UserError(problems)
    return Pipeline(files.directory, spec, pipeline_doc, ordered, values, maxtext, chips, chosen)


def _task(files: JobFiles, spec: PipelineSpec, maxtext: schema.MaxText, problems: list[Problem]) -> task.Task | None:
    """The task pipeline.yaml names, checked: its YAML, its files (each in its folder), and a MaxText that takes it."""
    folder = files.directory / task.TASKS
    if files.task is None:
        return task.Task(task.GSM8K_NAME, task.GSM8K, folder, {})
    found = _validate(task.TaskSpec, files.task, problems)
    if found is None:
        return None
    digests = {files.task.path.name: task.digest_of(files.task.path)}
    for name in task.files_of(found):
        if why := task.file_problem(folder, name):
            problems.append(files.task.origin().problem("task", why))
        else:
            digests[name] = task.digest_of(folder / name)
    if not found.builtin and schema.numbers(maxtext.version) < task.LEAST_MAXTEXT:
        why = (
            f"a task of your own needs MaxText 0.2.5's reward hooks; the environment installs {maxtext.version} "
            "(environment.packages: maxtext[tpu-post-train]==0.2.5)"
        )
        problems.append(files.pipeline.origin("task").problem("task", why))
    return task.Task(spec.task, found, folder, digests)


def _with_task(job: Job, chosen: task.Task, layout: Layout, problems: list[Problem]) -> None:
    """The RL trainer's arguments and environment for the task; one it sets itself is refused, naming its line."""
    for key, value in chosen.train_args(layout).items():
        if key in job.spec.args:
            why = f"set by the task {chosen.name} (jobs/tasks/{chosen.name}.yaml): leave it out of {job.doc.path.name}"
            problems.append(job.origin("args", key).problem(f"args.{key}", why))
        job.spec.args[key] = value
    job.spec.env.update(chosen.train_env(layout))


def _maxtext(spec: PipelineSpec, doc: Loaded, problems: list[Problem]) -> schema.MaxText:
    """The MaxText version the environment installs (the guide's, for the rest of the checks, if refused)."""
    try:
        return schema.pinned(spec.environment.packages)
    except ValueError as err:
        problems.append(doc.origin("environment", "packages").problem("environment.packages", str(err)))
        return schema.load()


DEFAULT_USER = "tpu-rl"  # the stack's SSH user unless tpu-rl:sshUser says otherwise (Pulumi.yaml)


def provided_values(spec: PipelineSpec, chips: Accelerator | None = None) -> dict[str, str]:
    """Values fab provides to the job files; run_name is <run_name> until a run is chosen, user the SSH user
    (the stack's default until the connection names it), chips vm.accelerator's."""
    return {
        "run_name": "<run_name>",
        "user": DEFAULT_USER,
        "chips": str(chips.chips if chips and chips.chips else 1),  # cpu: JAX's one CPU device (chips_per_vm > 0)
        "venv": spec.environment.venv,
        "python": spec.environment.python_path,
        "tools": Layout(spec.vm.state_dir).bin,
    }


TRAIN_STEPS = "train_steps"  # an RL trainer's own step count, from its resolved arguments
CHECKPOINT_PERIOD = "checkpoint_period"  # a tenth of it: what a lost VM costs at most
CHECKPOINTS_PER_RUN = 10


def _job_values(job: Job, values: dict[str, str], maxtext: schema.MaxText, problems: list[Problem]) -> dict[str, str]:
    """The shared values, plus in an RL trainer's files ${train_steps}, the updates MaxText will run
    (num_batches x rl.num_iterations x train_fraction x num_epoch), for its progress bar, and
    ${checkpoint_period}, a tenth of them (at least 1)."""
    if job.spec.module != schedule.RL_TRAINER:
        return values
    reference = f"${{{TRAIN_STEPS}}}"
    for key, _ in schedule.STEP_KEYS:
        if reference in job.spec.args.get(key, ""):
            problems.append(job.origin("args", key).problem(f"args.{key}", f"{reference} is counted from {key}"))
    args = {
        k: substitute(v, values.__getitem__, job.origin("args", k), f"args.{k}", [], values)
        for k, v in job.spec.args.items()
        if reference not in v
    }
    steps = schedule.train_steps(maxtext, args)  # None, or out of range: the MaxText key check says why
    steps = steps if steps and 0 < steps <= schedule.MAX_STEPS else 0
    return {**values, TRAIN_STEPS: str(steps), CHECKPOINT_PERIOD: str(max(1, steps // CHECKPOINTS_PER_RUN))}


def _resolve_job(
    job: Job, values: dict[str, str], job_names: list[str], maxtext: schema.MaxText, problems: list[Problem]
) -> None:
    values = _job_values(job, values, maxtext, problems)

    def sub(text: str, *path: str) -> str:
        text = substitute(text, values.__getitem__, job.origin(*path), ".".join(path), problems, values)
        for name in JOB_KEY.findall(text):
            if name not in job_names:
                message = f"${{key:{name}}} names no job; jobs are {', '.join(job_names)}"
                problems.append(job.origin(*path).problem(".".join(path), message))
        return text

    spec = job.spec
    spec.args = {k: sub(v, "args", k) for k, v in spec.args.items()}
    spec.flags = {k: sub(v, "flags", k) for k, v in spec.flags.items()}
    spec.env = {k: sub(v, "env", k) for k, v in spec.env.items()}
    if spec.launcher is not None:
        spec.launcher = sub(spec.launcher, "launcher")
    if spec.command is not None:
        spec.command = [sub(v, "command", str(i)) for i, v in enumerate(spec.command)]
    spec.after = [[sub(v, "after", str(n), str(i)) for i, v in enumerate(a)] for n, a in enumerate(spec.after)]
    spec.inputs = [sub(v, "inputs", str(i)) for i, v in enumerate(spec.inputs)]
    spec.outputs = [sub(v, "outputs", str(i)) for i, v in enumerate(spec.outputs)]
    if spec.progress:
        spec.progress.tensorboard_dir = sub(spec.progress.tensorboard_dir, "progress", "tensorboard_dir")
        spec.progress.total_steps = sub(spec.progress.total_steps, "progress", "total_steps")
        if not re.fullmatch(r"[0-9]{1,9}", spec.progress.total_steps):
            problems.append(
                job.origin("progress", "total_steps").problem(
                    "progress.total_steps", f"{spec.progress.total_steps[:20]!r} is not a whole number below 10**9"
                )
            )


SETUP = "setup"  # the environment build every MaxText module needs
HEALTH_ENV = "TPU_RL_HEALTH"  # the RL trainer's rules (remote/health.py reads them)
AGREEMENT_MAXTEXT = (0, 2, 5)  # the first MaxText with rl.log_sampler_trainer_agreement: its sampler's log-probs


def health_env(pipeline: Pipeline, spec: JobSpec) -> dict[str, str]:
    """The RL trainer's health rules (jobs/pipeline.yaml's health), as its launcher reads them; none elsewhere."""
    if spec.module != schedule.RL_TRAINER:
        return {}
    rules = pipeline.spec.health.model_dump()
    try:
        budget = int(spec.args.get("max_target_length", 1024)) - int(spec.args.get("max_prefill_predict_length", 256))
    except ValueError:  # MaxText's own check says why
        budget = 0
    rules |= {"max_tokens": budget, "agreement": schema.numbers(pipeline.maxtext.version) >= AGREEMENT_MAXTEXT}
    return {HEALTH_ENV: json.dumps(rules, sort_keys=True)}


def render(pipeline: Pipeline) -> list[RenderedJob]:
    """The exact argv and environment of every job, in run order, each with its key."""
    python = pipeline.spec.environment.python_path
    rendered = []
    for job in pipeline.jobs.values():
        spec = job.spec
        if spec.module:
            argv = [python, spec.launcher or "-m", spec.module]
            argv += [f"{k}={v}" for k, v in spec.args.items()]
            argv += [f"--{k}={v}" for k, v in spec.flags.items()]
        else:
            argv = list(spec.command)
        rendered.append(
            RenderedJob(
                name=job.name,
                description=spec.description,
                module=spec.module,
                argv=argv,
                env={
                    **(pipeline.accelerator.env if spec.tpu else {}),
                    **tracking.trainer_env(pipeline.spec, spec.module, pipeline.values["run_name"]),
                    **health_env(pipeline, spec),
                    **spec.env,
                },
                secrets=list(spec.secrets),
                cwd="~",
                needs=([SETUP] if spec.module or python in argv else []) + list(spec.needs),  # the venv's users
                inputs=list(spec.inputs),
                outputs=list(spec.outputs),
                after=[list(a) for a in spec.after],
                progress={
                    "tensorboard_dir": spec.progress.tensorboard_dir,
                    "total_steps": int(spec.progress.total_steps),
                }
                if spec.progress
                else None,
            )
        )
    return with_keys(rendered)
