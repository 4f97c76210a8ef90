"""Where a config's fields sit in its YAML file, when that is not their own section.

Options kept only for experiments live in their section's dataclass (the math reads them there)
but are written under one ``experimental:`` section, so a newcomer's file shows what matters.
A file that still has such a key in its old place loads, with one line saying where it moved;
keys that are no longer options are read, ignored and named in that line too.
"""

from __future__ import annotations

import copy
import difflib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError


def _get(data: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _pop(data: dict[str, Any], path: str) -> Any:
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    return node.pop(leaf)


def _put(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = data
    for depth, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parents[: depth + 1])!r} must be a section (a mapping)")
        node = child
    node[leaf] = value


def _prune(data: dict[str, Any], path: str) -> None:
    """Remove the now empty sections along ``path`` (deepest first)."""
    parts = path.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        found, node = _get(data, ".".join(parts[:depth]))
        if found and isinstance(node, dict) and not node:
            _pop(data, ".".join(parts[:depth]))


def _leaves(node: Any, prefix: str) -> list[str]:
    if isinstance(node, Mapping) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}.{key}")]
    return [prefix]


def print_note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


@dataclass(frozen=True)
class YamlLayout:
    """``moved``: field path -> YAML path (``"tree.noise_pool"`` -> ``"experimental.tree.noise_pool"``);
    ``removed``: keys of older files that are no longer options -> why (read and ignored)."""

    moved: Mapping[str, str]
    removed: Mapping[str, str] = field(default_factory=dict)

    def read(self, data: Mapping[str, Any], note: Callable[[str], None] = print_note) -> dict[str, Any]:
        """YAML data -> the fields' layout (what :func:`~.files.from_dict` builds from)."""
        out = copy.deepcopy(dict(data))
        old_places: list[str] = []
        for field_path, yaml_path in self.moved.items():
            at_field, _ = _get(out, field_path)
            at_yaml, value = _get(out, yaml_path)
            if at_field and at_yaml:
                raise ConfigError(f"{field_path!r} and {yaml_path!r} are the same option: "
                                  f"set only {yaml_path!r}")
            if at_field:
                old_places.append(f"{field_path} -> {yaml_path}")
            elif at_yaml:
                _pop(out, yaml_path)
                _prune(out, yaml_path)
                _put(out, field_path, value)
        ignored = []
        for path in self.removed:
            found, _ = _get(out, path)
            if found:
                _pop(out, path)
                ignored.append(path)
        for container in sorted({p.split(".")[0] for p in self.moved.values()}):
            left = out.get(container)
            if left is None:
                continue
            if left == {}:
                del out[container]
                continue
            unknown = _leaves(left, container)[0]
            guess = difflib.get_close_matches(unknown, list(self.moved.values()), n=1)
            hint = f"did you mean {guess[0]!r}?" if guess else \
                f"known keys: {', '.join(p for p in self.moved.values() if p.startswith(container + '.'))}"
            raise ConfigError(f"unknown key {unknown!r} ({hint})")
        parts = []
        if old_places:
            parts.append(f"keys read from their old place (move them): {', '.join(old_places)}")
        if ignored:
            parts.append("no longer options, ignored: " + ", ".join(
                f"{p} ({self.removed[p]})" for p in ignored))
        if parts:
            note("config: " + "; ".join(parts))
        return out

    def write(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The fields' layout (``to_dict``) -> YAML data, moved keys at the end in their section."""
        out = copy.deepcopy(dict(data))
        for path in self.removed:
            if _get(out, path)[0]:
                _pop(out, path)
        for field_path, yaml_path in self.moved.items():
            found, value = _get(out, field_path)
            if found:
                _pop(out, field_path)
                _put(out, yaml_path, value)
        return out
