"""MaxText's own config validator on jobs' rendered arguments (no TPU needed).

    python maxtext_check.py MODULE key=value ... [--module_flag=value ...]
    python maxtext_check.py [--marker FILE] --job NAME MODULE ARGS... [--job NAME MODULE ARGS...]

Runs pyconfig.initialize exactly as MODULE would, with its default config file, hides
MaxText's long config dump, and prints one line per job: `ok ...` or the `MAXTEXT CONFIG
ERROR`; exit 2 if any job was rejected. Checking every job in one process pays MaxText's
import time (about 10 s) once. FILE is written only when every job was accepted. Needs
Python 3.12 with maxtext importable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile
import time

try:
    from . import faults  # on the laptop: bootstrap.remote.maxtext_check
except ImportError:
    import faults  # on the VM: beside this script in the tools folder

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


def check(module: str, args: list[str]) -> tuple[bool, str]:
    config_args = [a for a in args if not a.startswith("--")]  # module flags are not config keys
    with tempfile.TemporaryFile(mode="w+") as captured:
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(captured.fileno(), 1), os.dup2(captured.fileno(), 2)
        try:
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None:
                raise ImportError(f"{module} is not importable with {sys.executable}")
            from maxtext.configs import pyconfig, types

            with open(spec.origin, encoding="utf-8") as source:
                name = config_class_name(source.read())
            # 0.2.3's initialize has no config_class: it would read one as a config key
            chosen = {} if name == "MaxTextConfig" else {"config_class": getattr(types, name)}
            pyconfig.initialize([spec.origin, *config_args], **chosen)
            failure = None
        except SystemExit as exit_:
            failure = f"exit {exit_.code}"
        except Exception as err:  # MaxText raises many kinds for bad values
            failure = f"{type(err).__name__}: {err}"
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        if failure is None:
            return True, f"ok: {module} accepts {len(config_args)} keys"
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


def _jobs(argv: list[str]) -> tuple[str | None, list[tuple[str, str, list[str]]]]:
    """(marker, [(name, module, args)]) from the command line."""
    marker = None
    if argv[:1] == ["--marker"]:
        marker, argv = argv[1], argv[2:]
    if argv[:1] != ["--job"]:
        return marker, [(argv[0].rsplit(".", 1)[-1], argv[0], argv[1:])]
    jobs, current = [], None
    for word in argv:
        if word == "--job":
            current = []
            jobs.append(current)
        else:
            current.append(word)
    return marker, [(group[0], group[1], group[2:]) for group in jobs]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 64
    marker, jobs = _jobs(argv)
    rejected = 0
    for name, module, args in jobs:
        started = time.monotonic()
        ok, message = check(module, args)
        print(f"{name}: {message} ({time.monotonic() - started:.1f} s)", flush=True)
        rejected += not ok
    if rejected:
        return 2
    if marker:
        with open(marker, "w") as f:
            f.write(f"{len(jobs)} jobs accepted\n")
        faults.point("validate.wrote-marker")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
