"""Check MaxText keys on the laptop, in milliseconds, without MaxText installed.

The facts come from bootstrap/jobs/maxtext/<version>.json (schema.py), generated from
the real maxtext package of the version the environment installs. This catches what
MaxText would reject after minutes of setup, and the traps it would silently accept:
RL keys at the top level (0.2.3), unknown keys under rl./debug., a key that changed
meaning between versions, and an RL learning-rate schedule that cannot train the run
(schedule.py). A key another supported version has is named as such, with its new name.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

from .. import secrets
from ..errors import Problem
from . import schedule
from .load import DEFERRED, Origin, Pipeline
from .schema import MaxText, load, supported

TOKEN_ARG = (
    "the token is never passed as an argument (`ps` on the VM, spec.json and fab plan would show it); fab gives "
    "it to the job through its environment: declare `secrets: [HF_TOKEN]` and set HF_TOKEN or run `hf auth login`"
)
VAR_ONLY = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # a value that is one shared variable, as written
BOOL_WORDS = {"true", "false", "1", "0", "yes", "no"}
BOOL_WORDS_TRUE = {"true", "1", "yes"}
# Keys renamed between supported versions: the old spelling -> (the version that renamed it, the new one).
RENAMED = {"hf_name": ("0.2.4", "hf_subset"), "debug.rl": ("0.2.4", "debug")}
# Keys the RL trainer still accepts after that version but reads no more for what they meant: silently ignored.
MEANING_CHANGED = {
    "hf_name": ("0.2.4", "train_rl reads the dataset's subset from hf_subset; hf_name is accepted and ignored"),
    "chat_template_path": (
        "0.2.4",
        "train_rl reads the prompt template (gsm8k_rl.json) from data_template_path; chat_template_path only fills "
        "a tokenizer that has no chat template of its own (Llama 3.1's has one)",
    ),
}


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else ""


def _type_error(value: str, desc: dict) -> str | None:
    """Why MaxText would reject `value` for a field described by `desc`, or None."""
    if DEFERRED.search(value) or (desc.get("nullable") and value in ("None", "null")):
        return None
    kind = desc["type"]
    if kind == "enum" and value not in desc["choices"]:
        return f"{value!r} is not one of {', '.join(desc['choices'])}{_suggest(value, desc['choices'])}"
    if kind == "bool" and value.lower() not in BOOL_WORDS:
        return f"{value!r} is not a boolean (use true or false)"
    for name, parse in (("int", int), ("float", float)):
        if kind == name:
            try:
                number = parse(value)
            except ValueError:
                return f"{value!r} is not {'an integer' if name == 'int' else 'a number'}"
            if not math.isfinite(number):
                return f"{value!r} is not a finite number"
    return None


def _elsewhere(maxtext: MaxText, module: str, key: str) -> str:
    """Where a key this version lacks lives: its new name here, or the supported versions that have it."""
    renamed = RENAMED.get(key)
    if renamed and maxtext.release >= load(renamed[0]).release:
        return f"; MaxText {renamed[0]} renamed it {renamed[1]}"
    old = next((old for old, (_, new) in RENAMED.items() if new == key), None)
    if old and maxtext.release < load(RENAMED[old][0]).release:
        return f"; MaxText {maxtext.version} calls it {old}"
    head, dot, tail = key.partition(".")
    having = [
        version
        for version in supported()
        if version != maxtext.version
        and module in load(version).modules
        and (
            tail in load(version).config(module)["nested"].get(head, {})
            if dot
            else key in load(version).config(module)["fields"]
        )
    ]
    return f"; it is a key of MaxText {', '.join(having)}, not of {maxtext.version}" if having else ""


def _key_problem(maxtext: MaxText, module: str, key: str, value: str) -> str | None:
    """Why MaxText `maxtext` would refuse, or silently ignore, `key=value` for `module`; None if it takes it."""
    config, version = maxtext.config(module), maxtext.version
    fields, nested = config["fields"], config["nested"]
    head, dot, tail = key.partition(".")
    if key == "hf_access_token":
        return TOKEN_ARG
    if dot:
        if head not in nested:
            groups = ", ".join(nested) or "none"
            return f"{head!r} has no nested keys in MaxText {version}; nested groups are {groups}{_elsewhere(maxtext, module, key)}"
        if tail not in nested[head]:
            return (
                f"unknown key under {head}. (MaxText would silently ignore it){_suggest(tail, nested[head])}"
                f"{_elsewhere(maxtext, module, key)}; valid: {', '.join(nested[head])}"
            )
        if tail in maxtext.flat_over_groups(module):
            return (
                f"MaxText {version}'s {maxtext.modules[module]['config']} sets {tail} itself, and that value is "
                f"copied over {key} (silently ignored); write it as {tail}"
            )
        return _type_error(value, nested[head][tail])
    changed = MEANING_CHANGED.get(key)
    if changed and module == schedule.RL_TRAINER and maxtext.release >= load(changed[0]).release:
        return f"from MaxText {changed[0]} on, {changed[1]}"
    if key in nested.get("rl", {}) and not config["routes_flat_keys"]:
        return f"RL setting at the top level has no effect on RL training; write it as rl.{key}"
    if key in nested:
        return f"a group, not a value; set its keys as {key}.NAME ({', '.join(nested[key])})"
    if key not in fields:
        return f"not a MaxText {version} config key{_suggest(key, fields)}{_elsewhere(maxtext, module, key)}"
    return _type_error(value, fields[key])


def check_job_args(
    maxtext: MaxText, module: str, args: dict[str, str], flags: dict[str, str], origin, value_origin=None
) -> list[Problem]:
    """Problems with one job's MaxText args and flags; `origin(section, key)` says where each came from,
    `value_origin` where a key's own value did (default: origin). The run's length and rates are the job's."""
    if module not in maxtext.modules:
        return [
            origin("module").problem(
                "module",
                f"{module!r} is not a MaxText {maxtext.version} entry point{_suggest(module, maxtext.modules)}",
            )
        ]
    problems = [
        (value_origin or origin)("args", key).problem(f"args.{key}", why)
        for key, value in args.items()
        if (why := _key_problem(maxtext, module, key, value))
    ]
    problems += _check_model_keys(maxtext, args, origin)
    if not problems:  # the run's length and learning rates, once every value is a number MaxText takes
        problems += [
            origin("args", key).problem(f"args.{key}", why) for key, why in schedule.problems(maxtext, module, args)
        ]
    allowed = maxtext.modules[module]["flags"]
    for flag in flags:
        if flag not in allowed:
            owners = [m for m, info in maxtext.modules.items() if flag in info["flags"]]
            hint = (
                f"it belongs to {', '.join(owners)}"
                if owners
                else f"{module} accepts {', '.join('--' + f for f in allowed) or 'no flags'}"
            )
            problems.append(
                origin("flags", flag).problem(f"flags.{flag}", f"--{flag} is not a flag of {module}; {hint}")
            )
    return problems


def _check_model_keys(maxtext: MaxText, args: dict[str, str], origin) -> list[Problem]:
    """MaxText refuses a different value for a key the model's own yml sets, unless override_model_config."""
    model = args.get("model_name", "default").replace("-Instruct", "")
    owned = maxtext.model_keys(model)
    if args.get("override_model_config", "false").lower() in ("true", "1"):
        return []
    return [
        origin("args", key).problem(
            f"args.{key}",
            f"{model}.yml (MaxText's model config) sets it to {owned[key]!r}; add override_model_config=True to change it",
        )
        for key, value in args.items()
        if key in owned and not _same_value(value, owned[key])
    ]


def _same_value(text: str, expected) -> bool:
    """Whether the argument `text` is the model config's `expected` value, read as MaxText reads
    scalars, without parsing the user's text as YAML (a tag or a deep nest in it must not run)."""
    if isinstance(expected, bool):
        return text.lower() in (BOOL_WORDS_TRUE if expected else BOOL_WORDS - BOOL_WORDS_TRUE)
    if isinstance(expected, int | float):
        try:
            return float(text) == expected
        except ValueError:
            return False
    return text == str(expected)


def base_model_of(pipeline: Pipeline) -> str | None:
    """The Hugging Face repository MaxText converts the pipeline's model from."""
    names = [job.spec.args["model_name"] for job in pipeline.jobs.values() if "model_name" in job.spec.args]
    return pipeline.maxtext.hf_id(names[0]) if names else None


def _check_hf_model(pipeline: Pipeline) -> list[Problem]:
    """vars.hf_model (what prefetch downloads, what export's config comes from) is the model MaxText converts."""
    named, expected = pipeline.doc.data.get("vars", {}).get("hf_model"), base_model_of(pipeline)
    if not isinstance(named, str) or expected is None or named == expected:
        return []
    return [
        pipeline.doc.origin("vars", "hf_model").problem(
            "vars.hf_model", f"{named!r} is not the repository MaxText converts this model from ({expected})"
        )
    ]


def check_secret_values(pipeline: Pipeline, values: dict[str, str]) -> list[Problem]:
    """A secret's value written anywhere in the job files or the overrides (an argument, an environment
    value, a command, a follow-up step, the environment spec, a shared setting), as typed or once the
    ${variables} are resolved, would reach the VM's argv, spec.json or fab plan: refused, without
    repeating it."""
    found: dict[tuple[str, str], Problem] = {}

    def scan(value, path: tuple[str, ...], origin) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                scan(item, (*path, str(key)), origin)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                scan(item, (*path, str(index)), origin)
        elif isinstance(value, str) and path[-2:] != ("args", "hf_access_token"):  # refused by name already
            for name in (n for n, secret in values.items() if secret and secret in value):
                where = origin(*path)
                source = where.source.replace(values[name], secrets.REDACTED)
                if name in secrets.KNOWN:
                    message = f"holds the value of your {name}; {secrets.describe(name)} reaches a job only through "
                    message += f"its environment: declare `secrets: [{name}]` in the job instead"
                else:
                    message = f"holds the value of your {secrets.describe(name)} (a secret): it reaches the VM only "
                    message += f"as results.notify names {name}, never in a job"
                key = ".".join(path).replace(values[name], secrets.REDACTED)
                found.setdefault((source, key), Problem(source, key, message, where.line))

    scan(pipeline.doc.data, (), pipeline.doc.origin)
    for job in pipeline.jobs.values():
        scan(job.doc.data, (), job.origin)
        scan(job.spec.model_dump(), (), job.origin)  # resolved: a token pieced together from ${variables}
    return list(found.values())


@dataclass(frozen=True)
class _VarOrigin:
    """A job's value that is one ${NAME}: its problem is the vars line's (or --arg's) that set it."""

    origin: Origin
    name: str
    job: str

    def problem(self, key: str, message: str) -> Problem:
        return self.origin.problem(f"vars.{self.name}", f"{message} (as {self.job}'s {key})")


def _blaming_vars(pipeline: Pipeline, job):
    """job.origin, except that a problem with the value of a known key, written in the job file as just ${NAME},
    is blamed on where NAME was set (a misspelt key, or a value given with --arg, stays the job's)."""
    shared = pipeline.doc.data.get("vars") or {}

    def origin(*path: str):
        raw = job.doc.data
        for part in path:
            raw = raw.get(part) if isinstance(raw, dict) else None
        found = VAR_ONLY.fullmatch(raw) if isinstance(raw, str) else None
        known = path[:1] != ("args",) or _known_key(pipeline.maxtext, job.spec.module, path[-1])
        if found and found[1] in shared and known and tuple(path) not in job.doc.overridden:
            return _VarOrigin(pipeline.doc.origin("vars", found[1]), found[1], job.name)
        return job.origin(*path)

    return origin


def _known_key(maxtext: MaxText, module: str, key: str) -> bool:
    config = maxtext.config(module)
    head, dot, tail = key.partition(".")
    return tail in config["nested"].get(head, {}) if dot else key in config["fields"]


def check_pipeline(pipeline: Pipeline) -> list[Problem]:
    problems = _check_hf_model(pipeline)
    for job in pipeline.jobs.values():
        if job.spec.module:
            blamed = _blaming_vars(pipeline, job)
            problems += check_job_args(
                pipeline.maxtext, job.spec.module, job.spec.args, job.spec.flags, job.origin, blamed
            )
        problems += [
            job.origin("secrets").problem(
                "secrets", f"unknown secret {secret!r}; fab can provide {', '.join(secrets.KNOWN)}"
            )
            for secret in job.spec.secrets
            if secret not in secrets.KNOWN
        ]
    models = {name: job.spec.args["model_name"] for name, job in pipeline.jobs.items() if "model_name" in job.spec.args}
    first = next(iter(models.items()), None)
    for name, model in models.items():
        if first and model != first[1]:
            problems.append(
                pipeline.jobs[name]
                .origin("args", "model_name")
                .problem(
                    "args.model_name",
                    f"{model!r} differs from {first[0]}'s {first[1]!r}; export would ship the wrong tokenizer and config",
                )
            )
    return problems
