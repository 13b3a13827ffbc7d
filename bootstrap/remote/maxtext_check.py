"""MaxText's own config validator on jobs' rendered arguments (no TPU needed).

    python maxtext_check.py MODULE key=value ... [--module_flag=value ...]
    python maxtext_check.py [--marker FILE] [--environment JSON] [--job NAME MODULE ARGS...]...

Runs pyconfig.initialize exactly as MODULE would, with its default config file, hides
MaxText's long config dump, and prints one line per job: `ok ...` or the `MAXTEXT CONFIG
ERROR`; exit 2 if any job was rejected. With --environment (envcheck.Expected as JSON), first
proves the environment itself (envcheck.py): one `ENVIRONMENT ERROR` line per problem, exit 2.
Checking every job in one process pays MaxText's import time once, and only pyconfig's: the
package's own __init__ is not run (see _package_without_reexports). FILE is written only when
everything was accepted. Needs Python 3.12 with maxtext importable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

try:
    from . import envcheck, faults  # on the laptop: bootstrap.remote.maxtext_check
except ImportError:
    import envcheck  # on the VM: beside this script in the tools folder
    import faults

ERROR_MARK = "MAXTEXT CONFIG ERROR:"
CONFIG_CLASS = re.compile(r"config_class=types\.(\w+)")


def config_class_name(source: str) -> str:
    """The pydantic class a module's source parses its config with: from 0.2.4, train_rl passes
    `config_class=types.RLConfig` (other keys than MaxTextConfig's); the rest take pyconfig's default."""
    found = CONFIG_CLASS.search(source)
    return found.group(1) if found else "MaxTextConfig"


def _redact(text: str) -> str:
    token = os.environ.get("HF_TOKEN")
    return text.replace(token, "<redacted>") if token else text


@contextmanager
def _captured() -> Iterator[IO[str]]:
    """Everything the process and its libraries print (MaxText's config dump, vLLM's import logs), kept aside."""
    with tempfile.TemporaryFile(mode="w+") as captured:
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(captured.fileno(), 1), os.dup2(captured.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def check_environment(expected: envcheck.Expected) -> list[str]:
    """The environment's lines: one `ok` line, or one `ENVIRONMENT ERROR` line per problem."""
    with _captured():
        facts = envcheck.gather(expected)
    found = envcheck.problems(expected, facts)
    if not found:
        return [f"environment: {envcheck.summary(expected, facts)}"]
    return [_redact(f"{envcheck.ERROR_MARK} {problem}")[:800] for problem in found]


def _package_without_reexports() -> None:
    """MaxText's package, registered without running its __init__: 0.2.3's imports every model to re-export a few
    names (3,600 modules, 11 CPU-s, against 1,900 and 4.5 CPU-s for pyconfig alone); 0.2.4 made those re-exports
    lazy itself. The submodules load as they would. Its one other line is kept. So validate no longer proves that
    `import maxtext` works (from 0.2.4 it never did): a model module that fails to import fails convert."""
    if "maxtext" in sys.modules:
        return
    spec = importlib.util.find_spec("maxtext")
    if spec is None:  # the import in check() then says what is missing
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")  # as its __init__ does, before jax loads
    sys.modules["maxtext"] = importlib.util.module_from_spec(spec)


def check(module: str, args: list[str]) -> tuple[bool, str]:
    config_args = [a for a in args if not a.startswith("--")]  # module flags are not config keys
    with _captured() as captured:
        try:
            _package_without_reexports()
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None:
                raise ImportError(f"{module} is not importable with {sys.executable}")
            from maxtext.configs import pyconfig, types

            with open(spec.origin, encoding="utf-8") as source:
                name = config_class_name(source.read())
            # 0.2.3's initialize has no config_class: it would read one as a config key
            chosen = {} if name == "MaxTextConfig" else {"config_class": getattr(types, name)}
            pyconfig.initialize([spec.origin, *config_args], **chosen)
            return True, f"ok: {module} accepts {len(config_args)} keys"
        except SystemExit as exit_:
            failure = f"exit {exit_.code}"
        except Exception as err:  # MaxText raises many kinds for bad values
            failure = f"{type(err).__name__}: {err}"
        sys.stdout.flush(), sys.stderr.flush()
        captured.seek(0)
        lines = captured.read().splitlines()
    marked = [i for i, line in enumerate(lines) if ERROR_MARK in line]
    if marked:  # the marked line, and pydantic's details that follow it
        first = lines[marked[0]]
        detail = " ".join(
            [
                first[first.index(ERROR_MARK) :],
                *(line.strip() for line in lines[marked[0] + 1 : marked[0] + 4] if "====" not in line),
            ]
        )
    else:
        detail = failure
    return False, _redact(detail[:800])


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The leading `--marker FILE` and `--environment JSON`, and the words after them."""
    options = {}
    while argv[:1] in (["--marker"], ["--environment"]) and len(argv) > 1:
        options[argv[0][2:]], argv = argv[1], argv[2:]
    return options, argv


def _jobs(words: list[str]) -> list[tuple[str, str, list[str]]]:
    """[(name, module, args)] from `--job NAME MODULE ARGS...` groups, or from a lone `MODULE ARGS...`."""
    if not words:
        return []
    if words[0] != "--job":
        return [(words[0].rsplit(".", 1)[-1], words[0], words[1:])]
    jobs, current = [], []
    for word in words:
        if word == "--job":
            current = []
            jobs.append(current)
        else:
            current.append(word)
    return [(group[0], group[1], group[2:]) for group in jobs]


def main(argv: list[str]) -> int:
    options, words = _options(argv)
    jobs = _jobs(words)
    if not jobs and "environment" not in options:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 64
    rejected = 0
    if "environment" in options:  # first: what would stop train at its start, whatever its arguments
        started = time.monotonic()
        lines = check_environment(envcheck.Expected.from_json(options["environment"]))
        rejected += any(line.startswith(envcheck.ERROR_MARK) for line in lines)
        lines[-1] += f" ({time.monotonic() - started:.1f} s)"
        print("\n".join(lines), flush=True)
    for name, module, args in jobs:
        started = time.monotonic()
        ok, message = check(module, args)
        print(f"{name}: {message} ({time.monotonic() - started:.1f} s)", flush=True)
        rejected += not ok
    if rejected:
        return 2
    marker = options.get("marker")
    if marker:
        with open(marker, "w") as f:
            f.write(f"{len(jobs)} jobs accepted{', the environment proven' if 'environment' in options else ''}\n")
        faults.point("validate.wrote-marker")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
