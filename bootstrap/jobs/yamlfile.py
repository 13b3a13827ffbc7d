"""Load YAML keeping every scalar as the text the user wrote, and where it was written.

MaxText receives `key=value` strings and parses them itself, so a job's values stay
strings here (`true` stays `true`, `1` stays `1`). Line numbers make errors point
at the line to fix.

A job file is a short, flat document, so anything a job file never needs is refused
before it is built, with its line: anchors and aliases (an alias bomb expands
exponentially), nesting deeper than `MAX_DEPTH`, files over `MAX_BYTES`, keys that
are not plain scalars, duplicate keys (the last would win silently), bytes that are
not UTF-8, and NUL or other control characters in values.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..errors import Problem, UserError

Lines = dict[tuple[str, ...], int]
MAX_BYTES = 256 * 1024
MAX_DEPTH = 8
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # C0 but tab and line ends, DEL, C1
LOADER = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # libyaml when PyYAML has it: every fab command reads the jobs


def _problem(path: Path, message: str, line: int | None = None) -> UserError:
    return UserError(Problem(str(path), "yaml", message, line))


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(Problem(str(path), "file", "not found")) from None
    if len(data) > MAX_BYTES:
        raise _problem(path, f"{len(data)} bytes; a job file is at most {MAX_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _problem(path, f"not UTF-8 (byte 0x{data[err.start]:02x})", data.count(b"\n", 0, err.start) + 1) from None
    if "\x00" in text:
        raise _problem(path, "contains a NUL byte", text.count("\n", 0, text.index("\x00")) + 1)
    return text


def _check_events(path: Path, text: str) -> None:
    """Refuse anchors, aliases and deep nesting in one linear pass, before anything is built."""
    depth = 0
    for event in yaml.parse(text, Loader=LOADER):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _problem(path, "anchors and aliases (&name, *name) are not supported; write the value out", line)
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise _problem(path, f"nested deeper than {MAX_DEPTH} levels", line)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _build(source: Path, node: yaml.Node, path: tuple[str, ...], lines: Lines):
    line = node.start_mark.line + 1
    lines[path] = line
    if isinstance(node, yaml.MappingNode):
        result = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise UserError(Problem(str(source), ".".join(path) or "yaml", "a key must be a plain name", key_line))
            key = key_node.value
            if CONTROL.search(key):  # never echoed: it could retitle or clear the terminal
                raise UserError(
                    Problem(str(source), ".".join(path) or "yaml", "a key holds a control character", key_line)
                )
            if key in result:
                raise UserError(Problem(str(source), ".".join((*path, key)), "duplicate key", key_line))
            result[key] = _build(source, value_node, (*path, key), lines)
            lines[(*path, key)] = key_line
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(source, item, (*path, str(i)), lines) for i, item in enumerate(node.value)]
    if CONTROL.search(node.value):
        raise UserError(Problem(str(source), ".".join(path), "contains a control character (NUL, ESC, ...)", line))
    return node.value


def load(path: Path) -> tuple[dict, Lines]:
    """Return (data, lines) where lines maps a key path to its 1-based line."""
    text = _text(path)
    try:
        _check_events(path, text)
        node = yaml.compose(text, Loader=LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(err, "problem", None) or str(err)
        if "maximum nesting depth" in problem:  # libyaml's own limit, met while it reads ahead of our count
            raise _problem(path, f"nested deeper than {MAX_DEPTH} levels", line) from None
        raise _problem(path, f"not valid YAML: {problem}", line) from None
    lines: Lines = {}
    if node is None:
        return {}, lines
    if not isinstance(node, yaml.MappingNode):
        raise _problem(path, "must be a mapping of keys to values", node.start_mark.line + 1)
    return _build(path, node, (), lines), lines
