"""Load YAML keeping every scalar as the text the user wrote, and where it was written.

MaxText receives `key=value` strings and parses them itself, so a job's values stay
strings here (`true` stays `true`, `1` stays `1`). Line numbers make errors point
at the line to fix.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import Problem, UserError

Lines = dict[tuple[str, ...], int]


def _build(node: yaml.Node, path: tuple[str, ...], lines: Lines):
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result = {}
        for key_node, value_node in node.value:
            key = key_node.value
            result[key] = _build(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, str(i)), lines) for i, item in enumerate(node.value)]
    return node.value


def load(path: Path) -> tuple[dict, Lines]:
    """Return (data, lines) where lines maps a key path to its 1-based line."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    except FileNotFoundError:
        raise UserError(Problem(str(path), "file", "not found")) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise UserError(Problem(str(path), "yaml", f"not valid YAML: {getattr(err, 'problem', err)}", line)) from None
    lines: Lines = {}
    if node is None:
        return {}, lines
    if not isinstance(node, yaml.MappingNode):
        raise UserError(Problem(str(path), "yaml", "must be a mapping of keys to values", node.start_mark.line + 1))
    return _build(node, (), lines), lines
