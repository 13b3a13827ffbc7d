"""docs/troubleshooting.md cannot drift: every message it lists is still one the code can print."""

from __future__ import annotations

import ast
import re

from bootstrap.paths import REPO

PAGE = REPO / "docs" / "troubleshooting.md"
SOURCES = [*(REPO / "bootstrap").rglob("*.py"), *(REPO / "infra").rglob("*.py"), REPO / "__main__.py"]


GOOGLES = "## Google Cloud's own errors"  # the section of messages Google Cloud prints, not this project's code


def listed_messages() -> list[str]:
    """The first cell of every table row: the message, in backticks (Google Cloud's own section left out)."""
    sections = re.split(r"(?m)^(?=## )", PAGE.read_text())
    lines = [line for section in sections if not section.startswith(GOOGLES) for line in section.splitlines()]
    return [re.match(r"\| (`+)(.+?)\1 \|", line)[2].strip() for line in lines if line.startswith("| `")]


def fragments(message: str) -> list[str]:
    """The fixed parts of a message: `…` stands for what changes."""
    return [part.strip() for part in message.split("…") if len(part.strip()) >= 6]


def test_every_listed_message_is_still_in_the_code():
    code = "\n".join(path.read_text() for path in SOURCES)
    messages = listed_messages()
    assert len(messages) >= 30, "the page lost its tables"
    missing = [(m, part) for m in messages for part in fragments(m) if part not in code]
    assert missing == [], "listed in docs/troubleshooting.md but printed by no code:\n" + "\n".join(
        f"  {m!r}: {part!r}" for m, part in missing
    )


RAISES = ("UserError", "DamagedRecord", "fail", "Problem", "problem", "_problem")  # a one-line error for the user
# Raisers whose message the page need not list, each with why.
EXEMPT = {
    "bootstrap/vm/machine.py::check": "a command on the VM failed: the message is that command's own error",
    "bootstrap/vm/machine.py::drive": "the driver's own error line, quoted: the row of what it says applies",
    "bootstrap/vm/startup.py::failed": "quotes the startup script's own last line, listed as 'fix the cause, ...'",
    "bootstrap/gke/driving.py::run": "Ctrl-C or the driver's end while watching: the line says what to do next",
    "bootstrap/results/hub.py::preflight": "the Hub check's own lines: each row of 'HF_TOKEN: ...' above",
}


def raisers() -> dict[str, list[str]]:
    """Each function of the CLI's code that raises a one-line error with words of its own (a constant with a space
    in it: a key's name alone is no message), by `file::function`: the texts of those constants."""
    found: dict[str, list[str]] = {}
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
                words = [c.value for c in ast.walk(call) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if name in RAISES and any(" " in word.strip() for word in words):
                    found.setdefault(f"{path.relative_to(REPO)}::{function.name}", []).append("".join(words))
    return found


def test_every_error_the_cli_raises_is_listed_or_exempt_with_why():
    """Two-way: every function that raises a one-line error for the user has a message on the page (or an
    exemption above that says why), so a new class of error is documented when it is written."""
    listed = [part for message in listed_messages() for part in fragments(message)]
    found = raisers()
    unlisted = sorted(
        where for where, texts in found.items()
        if where not in EXEMPT and not any(part in text for part in listed for text in texts)
    )  # fmt: skip
    assert unlisted == [], "raises an error docs/troubleshooting.md does not list:\n  " + "\n  ".join(unlisted)
    assert sorted(set(EXEMPT) - set(found)) == []  # an exemption for code that is gone
