"""Job output as it may be shown: split into lines, token redacted, terminal control removed.

Every line of a job's log that reaches the user's screen passes through `Cleaner`:
a job that prints the token, or writes escape sequences, cannot leak it or repaint
the user's terminal. tqdm bars end their frames with a carriage return, so a `\\r`
ends a line as well as a `\\n`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from ..secrets import REDACTED

MAX_LINE = 1024 * 1024
# CSI and OSC sequences, then any other C0 control or DEL (tab kept).
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")
LINE_END = re.compile(rb"\r\n|\r|\n")
TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]{30,128}")  # any Hugging Face access token (joblog.TOKEN_SHAPE)


class Cleaner:
    """Redacts the given secret values, and anything shaped like a Hugging Face token, and strips control
    sequences from text."""

    def __init__(self, secrets: Iterable[str] = ()):
        self.secrets = [s for s in secrets if s]

    def __call__(self, text: str) -> str:
        text = CONTROL.sub("", text)  # first: a control sequence inside a secret must not hide it
        for value in self.secrets:
            text = text.replace(value, REDACTED)
        return TOKEN_SHAPE.sub(REDACTED, text)


def lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Split a byte stream into text lines at \\n or \\r; a runaway line is cut at MAX_LINE."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = LINE_END.split(pending)
        for line in complete:
            yield line.decode(errors="replace")
        if len(pending) > MAX_LINE:
            yield pending.decode(errors="replace")
            pending = b""
    if pending:
        yield pending.decode(errors="replace")
