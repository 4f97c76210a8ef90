"""Typed YAML configs: load a file plus ``--set key=value`` overrides onto (nested, frozen) dataclasses.

The dataclasses stay the single source of defaults and validation; this module only checks that
what the user wrote matches their annotations, and says exactly which dotted key is wrong, in one
line, so a typo fails at start-up rather than hours into a run.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from ..utils.atomic import atomic_write_text
from .errors import ConfigError
from .layout import YamlLayout

__all__ = [
    "ConfigError",
    "apply_overrides",
    "from_dict",
    "load_config",
    "parse_override",
    "save_config",
    "to_dict",
]

T = TypeVar("T")

# PyYAML follows YAML 1.1, which reads ``1e-4`` (no dot) as a string; float fields accept such text.
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_MAX_REPR = 60


class _Mismatch(ConfigError):
    """A value of the wrong type at ``path``; unions catch it to name all their alternatives."""

    def __init__(self, path: str, expected: str, value: Any) -> None:
        super().__init__(f"{path}: expected {expected}, got {_show(value)}")
        self.path = path

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return ConfigError, (str(self),)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _where(path: str) -> str:
    return path or "config"


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:  # a NameError/TypeError here is a bug in the dataclass, not in the YAML
        raise TypeError(f"cannot resolve the annotations of {cls.__name__}: {exc}") from exc


def _is_union(tp: Any) -> bool:
    return get_origin(tp) is Union or isinstance(tp, types.UnionType)


def _describe(tp: Any) -> str:
    """Name a type the way a YAML user thinks of it."""
    origin = get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if _is_union(tp):
        names = [_describe(a) for a in get_args(tp)]
        return " or ".join(dict.fromkeys(names))
    if tp in (tuple, list) or origin in (tuple, list):
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} items"
        return f"a list of {_describe(args[0])}" if args else "a list"
    if tp is dict or origin is dict or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return "a mapping"
    if isinstance(tp, type) and issubclass(tp, PurePath):
        return "str (a path)"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, path: str, default: Any = None) -> Any:
    """Check ``value`` against annotation ``tp`` and return it in the annotated shape.

    ``default`` is the field's default; a section (mapping) given for a dataclass field fills its
    missing keys from it when it is an instance of that dataclass.
    """
    origin = get_origin(tp)
    if tp is Any or tp is object:
        return value
    if _is_union(tp):
        return _convert_union(tp, value, path, default)
    if origin is Literal:
        for choice in get_args(tp):
            if value == choice and type(value) is type(choice):
                return choice
        raise _Mismatch(path, _describe(tp), value)
    if tp is type(None):
        if value is None:
            return None
        raise _Mismatch(path, "null", value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch(path, "bool (true or false)", value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch(path, "int", value)
    if tp is float:
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if numeric or (isinstance(value, str) and _NUMBER.fullmatch(value.strip())):
            try:
                return float(value)
            except OverflowError:
                raise _Mismatch(path, "a float in range", value) from None
        raise _Mismatch(path, "float", value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch(path, "str", value)
    if isinstance(tp, type) and issubclass(tp, PurePath):
        if isinstance(value, (str, PurePath)):
            return tp(value)
        raise _Mismatch(path, _describe(tp), value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, Mapping):
            return _build(tp, value, path, default if isinstance(default, tp) else None)
        raise _Mismatch(path, "a mapping", value)
    if tp in (tuple, list) or origin in (tuple, list):
        return _convert_sequence(tp, value, path)
    if tp is dict or origin is dict:
        return _convert_mapping(tp, value, path)
    if isinstance(tp, type) and origin is None:
        if isinstance(value, tp):
            return value
        raise _Mismatch(path, _describe(tp), value)
    raise TypeError(f"{_where(path)}: unsupported annotation {tp!r}")


def _convert_union(tp: Any, value: Any, path: str, default: Any) -> Any:
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    deeper: ConfigError | None = None
    for alt in args:
        if alt is type(None):
            continue
        try:
            return _convert(alt, value, path, default)
        except _Mismatch as exc:
            if exc.path != path and deeper is None:
                deeper = exc
        except ConfigError as exc:
            deeper = deeper or exc
    # An alternative that got past this level (e.g. a section with one bad key) explains best.
    raise deeper if deeper is not None else _Mismatch(path, _describe(tp), value)


def _convert_sequence(tp: Any, value: Any, path: str) -> Any:
    target = get_origin(tp) or tp
    args = get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise _Mismatch(path, _describe(tp), value)
    if target is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise _Mismatch(path, _describe(tp), value)
        items = [_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))]
    elif args:
        items = [_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    else:
        items = list(value)
    return tuple(items) if target is tuple else items


def _convert_mapping(tp: Any, value: Any, path: str) -> dict:
    if not isinstance(value, Mapping):
        raise _Mismatch(path, "a mapping", value)
    key_tp, value_tp = get_args(tp) or (Any, Any)
    out = {}
    for key, item in value.items():
        if key_tp is str and not isinstance(key, str):
            raise ConfigError(f"{_where(path)}: keys must be str, got {_show(key)}")
        out[key] = _convert(value_tp, item, _join(path, key))
    return out


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; absent keys keep the dataclass defaults.

    A partial section keeps the other values of its field's default, so with
    ``tree: TreeConfig = field(default_factory=lambda: TreeConfig(steps=10))`` the section
    ``{"tree": {"depth": 3}}`` keeps ``steps=10``. Raises :class:`ConfigError` for unknown or
    missing keys, wrong types, and for a ``ValueError`` of the dataclass's own ``__post_init__``
    (prefixed with its key path).
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"from_dict needs a dataclass type, got {cls!r}")
    return _build(cls, data, prefix, None)


def _field_default(field: dataclasses.Field, base: Any) -> Any:
    if base is not None:
        return getattr(base, field.name)
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _build(cls: type[T], data: Any, prefix: str, base: T | None) -> T:
    """:func:`from_dict`, with missing keys taken from ``base`` (an instance of ``cls``) if given."""
    if not isinstance(data, Mapping):
        raise _Mismatch(_where(prefix), "a mapping", data)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            guess = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"did you mean {_join(prefix, guess[0])!r}?" if guess else \
                f"known keys: {', '.join(fields) or 'none'}"
            raise ConfigError(f"unknown key {_join(prefix, key)!r} ({hint})")
    if base is None:
        for name, field in fields.items():
            if name not in data and field.default is dataclasses.MISSING \
                    and field.default_factory is dataclasses.MISSING:
                raise ConfigError(f"missing required key {_join(prefix, name)!r}")
    hints = _hints(cls)
    kwargs = {name: getattr(base, name) for name in fields if base is not None and name not in data}
    for name, value in data.items():
        default = _field_default(fields[name], base) if isinstance(value, Mapping) else None
        kwargs[name] = _convert(hints[name], value, _join(prefix, name), default)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{prefix}: {exc}" if prefix else str(exc)) from exc


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    return value


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass as plain YAML-able data (tuples become lists), readable again by :func:`from_dict`."""
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        raise TypeError(f"to_dict needs a dataclass instance, got {type(obj).__name__}")
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``--set key=value``; the value is YAML, so ``2``, ``0.5``, ``true``, ``[1,2]`` keep types."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part.strip() for part in key.split(".")):
        raise ConfigError(f"invalid override {text!r}: expected key=value, e.g. sampler.depth=4")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid value in override {text!r}: {problem}") from exc
    return key, value


def _merge(base: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` in ``base``; a mapping merges into an existing section instead of replacing it."""
    current = base.get(key)
    if isinstance(value, Mapping) and isinstance(current, dict):
        for sub_key, sub_value in value.items():
            _merge(current, sub_key, sub_value)
    else:
        base[key] = copy.deepcopy(value)


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key=value`` set, creating intermediate sections.

    Keys are not checked here; :func:`from_dict` reports an unknown one with a suggestion.
    """
    out = copy.deepcopy(dict(data))
    for text in overrides:
        key, value = parse_override(text)
        *parents, leaf = key.split(".")
        node = out
        for depth, part in enumerate(parents):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                section = ".".join(parents[: depth + 1])
                raise ConfigError(f"cannot set {key!r}: {section!r} is a value, not a section")
            node = child
        _merge(node, leaf, value)
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def _layout(cls: type) -> YamlLayout | None:
    """A config class's :class:`~.layout.YamlLayout` (its ``yaml_layout`` class variable), if any."""
    layout = getattr(cls, "yaml_layout", None)
    return layout if isinstance(layout, YamlLayout) else None


def load_config(cls: type[T], path: str | os.PathLike[str] | None,
                overrides: Sequence[str] = ()) -> T:
    """Defaults of ``cls``, then the YAML file (if any), then ``overrides``, checked and built;
    keys the class's YAML layout places elsewhere (``experimental:``) are read from there."""
    data = apply_overrides(_read_yaml(Path(path)) if path is not None else {}, overrides)
    layout = _layout(cls)
    return from_dict(cls, layout.read(data) if layout is not None else data)


def save_config(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML (atomically), in field order, so a run can be reproduced."""
    data = to_dict(obj)
    layout = _layout(type(obj))
    if layout is not None:
        data = layout.write(data)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
    atomic_write_text(path, text)
