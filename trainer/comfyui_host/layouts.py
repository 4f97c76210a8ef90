"""Saved workflows across releases: each release's node input layouts, and old widget values read by name.

The web UI saves a node's widget values by position (``widgets_values``), so an input added to a node,
or one moved from required to optional, shifts every later value into the wrong widget of a graph saved
before. ``web/node_layouts.json`` records, for every release, each node's widget slots in order (a seed
widget is followed by its "control after generate" slot, ``<name>:control``) and its required and
optional inputs, plus ``added``: for an input a release added, the value that keeps a graph saved
before it doing what it did (``TreeRPOTrainFromPicks.keep_following``: ``off (fixed weight)``, the fixed
picks weight of the graphs saved before the guard). The newest record is the pack's current layout
(tests/test_saved_workflows.py holds it so).

The same file drives two readers: ``web/saved_workflows.js`` re-maps a loaded graph's values in the web
UI before the frontend configures its nodes, and :func:`migrate_values` does it for ``treerpo
run-workflow``'s UI-format files. Pure, no ComfyUI import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .workflow_format import node_inputs

LAYOUTS_FILE = Path(__file__).resolve().parents[2] / "web" / "node_layouts.json"
CONTROL = ":control"
"""Suffix of the slot after a widget with "control after generate" (seed widgets)."""
STAMP = "treerpo_layout"
"""The node property the web UI writes: the release whose layout a saved node's values are in."""


CONTROL_VALUES = frozenset({"fixed", "increment", "decrement", "randomize"})


@dataclass(frozen=True)
class Layout:
    """One node's inputs in one release: its widget slots in order with the kind of value each holds
    (the input's type; ``CONTROL`` for a control slot), and its inputs by kind."""

    widgets: tuple[str, ...]
    kinds: tuple[str, ...]
    required: tuple[str, ...]
    optional: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"widgets": [[w, k] for w, k in zip(self.widgets, self.kinds, strict=True)],
                "required": list(self.required), "optional": list(self.optional)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        return cls(tuple(w for w, _ in data["widgets"]), tuple(k for _, k in data["widgets"]),
                   tuple(data["required"]), tuple(data["optional"]))

    def fits(self, values: list[Any]) -> bool:
        """Whether ``values`` could have been saved in this layout: as many, each of its slot's kind."""
        return len(values) == len(self.widgets) and all(
            _fits(kind, value) for kind, value in zip(self.kinds, values, strict=True))


def _fits(kind: str, value: Any) -> bool:
    if kind == CONTROL:
        return value in CONTROL_VALUES
    if kind in ("INT", "FLOAT"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "BOOLEAN":
        return isinstance(value, bool)
    return isinstance(value, str)  # STRING and COMBO


def layout_of(definition: dict[str, Any]) -> Layout:
    """A node's layout from its ``/object_info`` entry, as the web UI orders its widgets."""
    specs = node_inputs(definition)
    slots: list[tuple[str, str]] = []
    for spec in specs:
        if spec.widget:
            slots.append((spec.name, spec.type))
            if spec.control:
                slots.append((spec.name + CONTROL, CONTROL))
    return Layout(tuple(s for s, _ in slots), tuple(k for _, k in slots),
                  tuple(s.name for s in specs if not s.optional), tuple(s.name for s in specs if s.optional))


def layouts_of(definitions: dict[str, dict[str, Any]], prefix: str = "TreeRPO") -> dict[str, Layout]:
    """The layout of every node of the pack (its ids start with ``prefix``)."""
    return {name: layout_of(d) for name, d in sorted(definitions.items()) if name.startswith(prefix)}


@dataclass(frozen=True)
class Record:
    """``web/node_layouts.json``: the releases oldest first, each with its nodes' layouts, and the values
    that keep old graphs' behaviour for inputs added later (node -> input -> value)."""

    releases: tuple[tuple[str, dict[str, Layout]], ...]
    added: dict[str, dict[str, Any]]

    @property
    def current(self) -> tuple[str, dict[str, Layout]]:
        return self.releases[-1]

    def layout(self, release: str, node: str) -> Layout | None:
        return dict(self.releases).get(release, {}).get(node)

    def to_json(self) -> dict[str, Any]:
        return {"format": 1,
                "releases": [{"version": v, "nodes": {n: lay.to_json() for n, lay in nodes.items()}}
                             for v, nodes in self.releases],
                "added": self.added}


def read_record(path: Path = LAYOUTS_FILE) -> Record:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    releases = tuple((r["version"], {n: Layout.from_json(lay) for n, lay in r["nodes"].items()})
                     for r in data["releases"])
    return Record(releases, data.get("added", {}))


def saved_layout(record: Record, node: str, values: list[Any], stamp: str | None = None
                 ) -> tuple[str, Layout] | None:
    """Which release's layout a saved node's ``values`` are in: the one its stamp names if they fit it
    (the web UI stamps what it saves), else the newest whose slots the values fit, count and kinds (the
    current layout first); None when none does."""
    if stamp is not None and (layout := record.layout(stamp, node)) is not None and layout.fits(values):
        return stamp, layout
    for version, nodes in reversed(record.releases):
        layout = nodes.get(node)
        if layout is not None and layout.fits(values):
            return version, layout
    return None


def migrate_values(record: Record, node: str, values: list[Any], stamp: str | None = None) -> list[Any]:
    """``values`` in the current layout of ``node``: read by name from the release they were saved in;
    an input that release lacked gets the value in ``added`` (what keeps the graph's old behaviour).
    Values already in the current layout, and nodes the record does not know, are returned as they are.
    A count no release had is a one-line ValueError naming the node."""
    current = record.current[1].get(node)
    if current is None:
        return values
    found = saved_layout(record, node, values, stamp)
    if found is None:
        raise ValueError(f"{node}: its {len(values)} saved widget values fit the inputs of no release of "
                         "this pack (web/node_layouts.json): the node cannot be read; add it again")
    version, saved = found
    if saved.widgets == current.widgets:
        return list(values)
    by_name = dict(zip(saved.widgets, values, strict=True))
    added = record.added.get(node, {})
    out = []
    for slot in current.widgets:
        if slot in by_name:
            out.append(by_name[slot])
        elif slot in added:
            out.append(added[slot])
        else:
            raise ValueError(f"{node}.{slot}: graphs saved with {version} lack it and the record gives no "
                             "value that keeps their behaviour (web/node_layouts.json, 'added')")
    return out


def migrate_workflow(workflow: dict[str, Any], record: Record | None = None) -> dict[str, Any]:
    """A UI-format workflow with every node of the pack's values in the current layout (as the web UI's
    ``web/saved_workflows.js`` does on loading), subgraphs included; other nodes untouched."""
    record = record or read_record()
    out = json.loads(json.dumps(workflow))
    groups = [out.get("nodes") or []] + [s.get("nodes") or [] for s in
                                         (out.get("definitions") or {}).get("subgraphs") or []]
    for nodes in groups:
        for node in nodes:
            values = node.get("widgets_values")
            if isinstance(values, list) and node.get("type") in record.current[1]:
                stamp = (node.get("properties") or {}).get(STAMP)
                node["widgets_values"] = migrate_values(record, node["type"], values, stamp)
    return out


def with_added_inputs(prompt: dict[str, dict], record: Record | None = None) -> dict[str, dict]:
    """An API-format prompt as the server reads one saved before inputs were added: each of the pack's
    nodes without an input of ``added`` gets that input's old-behaviour value (what the node's default
    for a missing optional input gives, and what the web UI fills in on loading)."""
    record = record or read_record()
    out = json.loads(json.dumps(prompt))
    for node in out.values():
        for name, value in record.added.get(node.get("class_type"), {}).items():
            node.setdefault("inputs", {}).setdefault(name, value)
    return out
