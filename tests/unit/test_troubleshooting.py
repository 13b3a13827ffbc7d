"""docs/troubleshooting.md cannot drift: every message it lists is still one the code can print."""

from __future__ import annotations

import re

from bootstrap.paths import REPO

PAGE = REPO / "docs" / "troubleshooting.md"
SOURCES = [*(REPO / "bootstrap").rglob("*.py"), *(REPO / "infra").rglob("*.py"), REPO / "__main__.py"]


GOOGLES = "## Google Cloud's own errors"  # the section of messages Google Cloud prints, not this project's code


def listed_messages() -> list[str]:
    """The first cell of every table row: the message, in backticks (Google Cloud's own section left out)."""
    sections = re.split(r"(?m)^(?=## )", PAGE.read_text())
    lines = [line for section in sections if not section.startswith(GOOGLES) for line in section.splitlines()]
    return [re.match(r"\| `([^`]+)` \|", line)[1] for line in lines if line.startswith("| `")]


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
