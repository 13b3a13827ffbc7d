"""Check MaxText keys on the laptop, in milliseconds, without MaxText installed.

The facts come from bootstrap/jobs/maxtext_schema.json, generated from the real
maxtext package by scripts/generate_maxtext_schema.py. This catches what MaxText
would reject after minutes of setup, and the traps it would silently accept:
RL keys at the top level, unknown keys under rl./debug., and an RL learning-rate
schedule that cannot train the run (schedule.py).
"""

from __future__ import annotations

import difflib
import math

from .. import secrets
from ..errors import Problem
from . import schedule
from .load import DEFERRED, Pipeline
from .schema import schema

TOKEN_ARG = (
    "the token is never passed as an argument (`ps` on the VM, spec.json and fab plan would show it); fab gives "
    "it to the job through its environment: declare `secrets: [HF_TOKEN]` and set HF_TOKEN or run `hf auth login`"
)
BOOL_WORDS = {"true", "false", "1", "0", "yes", "no"}
BOOL_WORDS_TRUE = {"true", "1", "yes"}


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


def check_job_args(job_name: str, module: str, args: dict[str, str], flags: dict[str, str], origin) -> list[Problem]:
    """Problems with one job's MaxText args and flags; `origin(section, key)` says where each came from."""
    facts = schema()
    problems = []
    version = facts["maxtext_version"]
    if module not in facts["modules"]:
        return [
            origin("module").problem(
                "module", f"{module!r} is not a MaxText {version} entry point{_suggest(module, facts['modules'])}"
            )
        ]
    fields, nested = facts["fields"], facts["nested"]
    rl_keys = set(nested.get("rl", {}))
    for key, value in args.items():
        where = origin("args", key)
        head, dot, tail = key.partition(".")
        if key == "hf_access_token":
            problems.append(where.problem(f"args.{key}", TOKEN_ARG))
            continue
        if dot:
            if head not in nested:
                problems.append(
                    where.problem(
                        f"args.{key}",
                        f"{head!r} has no nested keys in MaxText {version}; nested groups are {', '.join(nested)}",
                    )
                )
            elif tail not in nested[head]:
                problems.append(
                    where.problem(
                        f"args.{key}",
                        f"unknown key under {head}. (MaxText would silently ignore it){_suggest(tail, nested[head])}; valid: {', '.join(nested[head])}",
                    )
                )
            elif error := _type_error(value, nested[head][tail]):
                problems.append(where.problem(f"args.{key}", error))
            continue
        if key in rl_keys:
            problems.append(
                where.problem(
                    f"args.{key}", f"RL setting at the top level has no effect on RL training; write it as rl.{key}"
                )
            )
        elif key in nested:
            problems.append(
                where.problem(
                    f"args.{key}", f"a group, not a value; set its keys as {key}.NAME ({', '.join(nested[key])})"
                )
            )
        elif key not in fields:
            problems.append(where.problem(f"args.{key}", f"not a MaxText {version} config key{_suggest(key, fields)}"))
        elif error := _type_error(value, fields[key]):
            problems.append(where.problem(f"args.{key}", error))
    problems += _check_model_keys(args, origin)
    if not problems:  # the run's length and learning rates, once every value is a number MaxText takes
        problems += [origin("args", key).problem(f"args.{key}", why) for key, why in schedule.problems(module, args)]
    allowed = facts["modules"][module]["flags"]
    for flag in flags:
        if flag not in allowed:
            owners = [m for m, info in facts["modules"].items() if flag in info["flags"]]
            hint = (
                f"it belongs to {', '.join(owners)}"
                if owners
                else f"{module} accepts {', '.join('--' + f for f in allowed) or 'no flags'}"
            )
            problems.append(
                origin("flags", flag).problem(f"flags.{flag}", f"--{flag} is not a flag of {module}; {hint}")
            )
    return problems


def _check_model_keys(args: dict[str, str], origin) -> list[Problem]:
    """MaxText refuses a different value for a key the model's own yml sets, unless override_model_config."""
    model = args.get("model_name", "default").replace("-Instruct", "")
    owned = schema()["model_keys"].get(model, {})
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


def base_model(model_name: str) -> str | None:
    """The Hugging Face repository MaxText converts `model_name` from."""
    return schema()["hf_ids"].get(model_name)


def base_model_of(pipeline: Pipeline) -> str | None:
    names = [job.spec.args["model_name"] for job in pipeline.jobs.values() if "model_name" in job.spec.args]
    return base_model(names[0]) if names else None


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
                message = f"holds the value of your {name}; {secrets.KNOWN[name].split(' (')[0]} reaches a job "
                message += f"only through its environment: declare `secrets: [{name}]` in the job instead"
                key = ".".join(path).replace(values[name], secrets.REDACTED)
                found.setdefault((source, key), Problem(source, key, message, where.line))

    scan(pipeline.doc.data, (), pipeline.doc.origin)
    for job in pipeline.jobs.values():
        scan(job.doc.data, (), job.origin)
        scan(job.spec.model_dump(), (), job.origin)  # resolved: a token pieced together from ${variables}
    return list(found.values())


def check_pipeline(pipeline: Pipeline) -> list[Problem]:
    problems = _check_hf_model(pipeline)
    for name, job in pipeline.jobs.items():
        if job.spec.module:
            problems += check_job_args(name, job.spec.module, job.spec.args, job.spec.flags, job.origin)
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
