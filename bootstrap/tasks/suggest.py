"""What fab's command line most likely meant, when invoke cannot parse it: `fab trian`, `--arg KEY VALUE`.

invoke's parser says only "No idea what 'trian' is!". fabfile.py hands its errors through `explain`, which
adds the task or the option meant (difflib's closest), or the form `--arg` takes, to that one line.
"""

from __future__ import annotations

import difflib

from invoke.exceptions import ParseError
from invoke.parser.parser import ParseMachine

UNKNOWN = "No idea what "


def explain(parser: ParseMachine, message: str) -> str:
    """`message` with what was meant, when it says a word was not understood."""
    if not message.startswith(UNKNOWN):
        return message
    word = message[len(UNKNOWN) :].removesuffix(" is!").strip("'\"")
    context = parser.context
    arg = context.args.get("arg") if context is not None else None
    given = arg.value if arg is not None and isinstance(arg.value, list) else []
    if given and "=" not in given[-1] and not word.startswith("-"):
        return f"{message} --arg takes JOB.KEY=VALUE as one word: --arg {given[-1]}={word}"
    if word.startswith("-") and context is not None:
        names = [f"--{name}" for arg in context.args.values() for name in arg.names if len(name) > 1]
        meant = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
        where = f"fab {context.name}" if context.name else "fab"
        return f"{message} Did you mean {meant[0]}? ({where} --help)" if meant else f"{message} ({where} --help)"
    tasks = [name for name in parser.contexts if name]
    meant = difflib.get_close_matches(word, tasks, n=1, cutoff=0.6)
    return f"{message} Did you mean fab {meant[0]}? (fab --list)" if meant else f"{message} (fab --list)"


def install() -> None:
    """invoke's parser errors, explained."""

    def error(parser: ParseMachine, message: str) -> None:
        raise ParseError(explain(parser, message), parser.context)

    ParseMachine.error = error
