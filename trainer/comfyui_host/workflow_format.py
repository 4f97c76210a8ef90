"""Conversion between ComfyUI's two workflow formats, and reading a workflow file.

The API format is what ``POST /prompt`` takes (``{id: {class_type, inputs}}``, links as
``[node_id, slot]``); the web UI's LiteGraph format has ``nodes`` with positions and
``widgets_values`` in the node's widget order, and ``links`` as ``[id, from, from_slot, to, to_slot,
type]``. Both conversions are pure functions of node definitions shaped like the server's
``/object_info``, so ``scripts/api_to_ui.py`` (over HTTP) and ``treerpo run-workflow`` (from the
node classes in its process) share them. No ComfyUI import here.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WIDGET_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"})
VIRTUAL_NODES = frozenset({"Note", "MarkdownNote", "Reroute", "PrimitiveNode"})  # front-end only
SEED_NAMES = ("seed", "noise_seed")  # INT widgets the web UI gives a "control after generate" value
MODE_NEVER, MODE_BYPASS = 2, 4
Definitions = dict[str, dict[str, Any]]  # node type -> its /object_info entry

# ------------------------------------------------------------------------------ node definitions


@dataclass(frozen=True)
class InputSpec:
    """One input of a node definition, as the web UI sees it."""

    name: str
    type: str  # "COMBO" for combo lists
    options: dict[str, Any]
    optional: bool
    widget: bool  # shown as a widget (a value in widgets_values) rather than a socket
    control: bool  # the widget is followed by a "control after generate" value


def _input_spec(name: str, spec: Any, optional: bool) -> InputSpec:
    seq = isinstance(spec, (list, tuple))
    kind = spec[0] if seq and spec else spec
    options = spec[1] if seq and len(spec) > 1 and isinstance(spec[1], dict) else {}
    type_name = "COMBO" if isinstance(kind, (list, tuple)) else str(kind)
    widget = type_name in WIDGET_TYPES and not options.get("forceInput", False)
    control = widget and (bool(options.get("control_after_generate", name in SEED_NAMES))
                          if type_name == "INT" else bool(options.get("control_after_generate", False)))
    return InputSpec(name, type_name, options, optional, widget, control)


def node_inputs(definition: dict[str, Any]) -> list[InputSpec]:
    """The node's required then optional inputs in their declared order (hidden ones left out)."""
    inputs = definition.get("input", {})
    order = definition.get("input_order") or {k: list(v) for k, v in inputs.items()}
    return [_input_spec(name, inputs[group][name], group == "optional")
            for group in ("required", "optional") for name in order.get(group, [])]


def _definition(definitions: Definitions, node_type: str, where: str) -> dict[str, Any]:
    if node_type not in definitions:
        raise ValueError(f"{where}: unknown node type {node_type!r} (not a node of this ComfyUI: is its "
                         "pack installed?)")
    return definitions[node_type]


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], int) and not isinstance(
        value[1], bool)


# ------------------------------------------------------------------------------ API -> UI


IMAGE_NODE_HEIGHT = 280
"""An image node's height in a laid-out template: room for its picture, and short enough that two stacked
in the last column end above a tall node beside them, so the window's bottom-right corner, where
ComfyUI's minimap sits over the canvas, is empty when the frontend fits the graph to the window."""


def _node_size(node_type: str, specs: list[InputSpec], outputs: int) -> list[int]:
    """A size that shows every widget (the UI keeps the saved size, it does not grow a node)."""
    sockets = sum(not s.widget for s in specs)
    multiline = sum(s.widget and bool(s.options.get("multiline")) for s in specs)
    widgets = sum(s.widget for s in specs) + sum(s.control for s in specs) - multiline
    height = 40 + 22 * max(sockets, outputs) + 26 * widgets + 96 * multiline
    if node_type in ("SaveImage", "PreviewImage"):
        return [360, max(height, IMAGE_NODE_HEIGHT)]
    return [400 if multiline else 320, height]


def _depths(prompt: dict[str, dict]) -> dict[str, int]:
    """Longest path from a source to each node: its column, left to right."""
    depth: dict[str, int] = {}
    visiting: set[str] = set()

    def visit(node_id: str) -> int:
        if node_id in depth:
            return depth[node_id]
        if node_id in visiting:
            raise ValueError(f"workflow has a cycle through node {node_id}")
        visiting.add(node_id)
        sources = [str(v[0]) for v in prompt[node_id].get("inputs", {}).values() if _is_link(v)]
        for src in sources:
            if src not in prompt:
                raise ValueError(f"node {node_id} links to node {src}, which the workflow does not have")
        depth[node_id] = 1 + max((visit(s) for s in sources), default=-1)
        visiting.discard(node_id)
        return depth[node_id]

    for node_id in prompt:
        visit(node_id)
    return depth


def api_to_ui(prompt: dict[str, dict], definitions: Definitions, workflow_id: str | None = None) -> dict:
    """The web UI (LiteGraph) form of an API-format graph, laid out left to right by depth.

    Node ids must be integers (as strings); widget values follow each node's widget order, with
    "fixed" after seed-like widgets. ``_meta.title`` and ``_meta.models`` (the model files the UI
    offers to download) carry over as the node's title and ``properties.models``.
    """
    bad = [k for k in prompt if not str(k).isdigit()]
    if bad:
        raise ValueError(f"node ids must be integers for the UI format, not {bad}")
    depth = _depths(prompt)
    ids = sorted(prompt, key=lambda k: (depth[k], int(k)))
    specs = {k: node_inputs(_definition(definitions, prompt[k]["class_type"], f"node {k}")) for k in ids}
    outputs = {k: definitions[prompt[k]["class_type"]].get("output", []) for k in ids}
    sizes = {k: _node_size(prompt[k]["class_type"], specs[k], len(outputs[k])) for k in ids}

    nodes: dict[str, dict] = {}
    x = 40
    for column in sorted(set(depth.values())):
        members = [k for k in ids if depth[k] == column]
        y = 40
        for k in members:
            nodes[k] = {"id": int(k), "type": prompt[k]["class_type"], "pos": [x, y], "size": sizes[k]}
            y += sizes[k][1] + 60
        x += max(sizes[k][0] for k in members) + 80

    links: list[list] = []
    out_links: dict[tuple[str, int], list[int]] = {}
    for order, k in enumerate(ids):
        node, values = prompt[k], prompt[k].get("inputs", {})
        definition = definitions[node["class_type"]]
        ui_inputs: list[dict] = []
        widgets_values: list[Any] = []
        for spec in specs[k]:
            value = values.get(spec.name)
            linked = _is_link(value)
            if spec.widget:
                widgets_values.append(spec.options.get("default", 0) if linked or value is None else value)
                if spec.control:
                    widgets_values.append("fixed")
            if not spec.widget or linked:
                entry: dict[str, Any] = {"name": spec.name, "type": spec.type, "link": None}
                if spec.widget:
                    entry["widget"] = {"name": spec.name}
                if spec.optional:
                    entry["shape"] = 7
                if linked:
                    src, slot = str(value[0]), int(value[1])
                    src_outputs = definitions[prompt[src]["class_type"]].get("output", [])
                    if slot >= len(src_outputs):
                        raise ValueError(f"node {k} input {spec.name!r} links to output {slot} of node "
                                         f"{src}, which has {len(src_outputs)} outputs")
                    link_id = len(links) + 1
                    links.append([link_id, int(src), slot, int(k), len(ui_inputs), src_outputs[slot]])
                    out_links.setdefault((src, slot), []).append(link_id)
                    entry["link"] = link_id
                ui_inputs.append(entry)
        unknown = set(values) - {s.name for s in specs[k]}
        if unknown:
            raise ValueError(f"node {k} ({node['class_type']}): unknown inputs {sorted(unknown)}")
        meta = node.get("_meta", {})
        properties: dict[str, Any] = {"Node name for S&R": node["class_type"]}
        if meta.get("models"):
            properties["models"] = meta["models"]
        nodes[k].update({"flags": {}, "order": order, "mode": 0, "inputs": ui_inputs,
                         "outputs": [], "properties": properties, "widgets_values": widgets_values})
        if meta.get("title"):
            nodes[k]["title"] = meta["title"]
        nodes[k]["_definition"] = definition
    for k in ids:
        definition = nodes[k].pop("_definition")
        names = definition.get("output_name") or definition.get("output", [])
        nodes[k]["outputs"] = [
            {"name": names[i], "type": t, "links": out_links.get((k, i), []), "slot_index": i}
            for i, t in enumerate(definition.get("output", []))]
    return {"id": workflow_id or str(uuid.uuid4()), "revision": 0,
            "last_node_id": max((int(k) for k in ids), default=0), "last_link_id": len(links),
            "nodes": [nodes[k] for k in sorted(ids, key=int)], "links": links, "groups": [], "config": {},
            "extra": {"ds": {"scale": 1.0, "offset": [0, 0]}}, "version": 0.4}


# ------------------------------------------------------------------------------ UI -> API


def is_ui_workflow(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("nodes"), list) and "links" in data


def _ui_links(workflow: dict) -> dict[int, tuple[int, int]]:
    """link id -> (origin node id, origin slot); links are lists, or dicts in newer files."""
    out: dict[int, tuple[int, int]] = {}
    for link in workflow.get("links") or []:
        if isinstance(link, dict):
            out[int(link["id"])] = (int(link["origin_id"]), int(link["origin_slot"]))
        else:
            out[int(link[0])] = (int(link[1]), int(link[2]))
    return out


def ui_to_api(workflow: dict, definitions: Definitions) -> dict[str, dict]:
    """The API-format prompt of a web UI workflow, as the UI would queue it: notes dropped,
    reroutes and bypassed nodes followed through, muted nodes and their links left out. A file
    whose nodes or links lack a field, or hold the wrong kind of value, is a one-line ValueError."""
    try:
        return _ui_to_api(workflow, definitions)
    except (KeyError, IndexError, TypeError, AttributeError) as err:
        detail = f"missing field {err}" if isinstance(err, KeyError) else str(err).split("\n")[0][:120]
        raise ValueError(f"malformed UI workflow: a node or link is not as the web UI writes it "
                         f"({type(err).__name__}: {detail})") from None


def _ui_to_api(workflow: dict, definitions: Definitions) -> dict[str, dict]:
    if workflow.get("definitions", {}).get("subgraphs"):
        raise ValueError("workflows with subgraphs are not supported here: convert them in the web UI "
                         "(Workflow > Export (API))")
    by_id = {int(n["id"]): n for n in workflow["nodes"]}
    links = _ui_links(workflow)

    def source(link_id: int | None, link_type: str | None) -> tuple[int, int] | None:
        """The real producer of a link: None for unconnected or muted, or a PrimitiveNode (its
        value already sits in the target's widgets_values)."""
        seen = 0
        while link_id is not None and seen < 1000:
            seen += 1
            if link_id not in links:
                raise ValueError(f"workflow link {link_id} is not in its links list")
            origin, slot = links[link_id]
            node = by_id.get(origin)
            if node is None:
                raise ValueError(f"workflow link {link_id} comes from node {origin}, which is not in "
                                 "the workflow")
            mode = node.get("mode", 0)
            if node["type"] == "PrimitiveNode" or mode == MODE_NEVER:
                return None
            if node["type"] == "Reroute" or mode == MODE_BYPASS:
                candidates = [i for i in node.get("inputs", []) if i.get("link") is not None and (
                    node["type"] == "Reroute" or link_type is None or i.get("type") in (link_type, "*"))]
                link_id = candidates[0]["link"] if candidates else None
                continue
            return origin, slot
        return None

    prompt: dict[str, dict] = {}
    for node in sorted(workflow["nodes"], key=lambda n: int(n["id"])):
        node_type, node_id = node["type"], int(node["id"])
        virtual = node_type in VIRTUAL_NODES and node_type not in definitions
        if virtual or node.get("mode", 0) in (MODE_NEVER, MODE_BYPASS):
            continue
        where = f"workflow node {node_id} ({node_type})"
        specs = node_inputs(_definition(definitions, node_type, where))
        ui_inputs = {i["name"]: i for i in node.get("inputs", [])}
        values = node.get("widgets_values", [])
        by_name = values if isinstance(values, dict) else None
        needed = sum(s.widget for s in specs) + sum(s.control for s in specs)
        if by_name is None and len(values) < needed:
            raise ValueError(f"{where}: {len(values)} widget values for {needed} widgets: the node's "
                             "inputs changed since the workflow was saved")
        position = 0
        inputs: dict[str, Any] = {}
        for spec in specs:
            entry = ui_inputs.get(spec.name)
            if spec.widget:
                value = by_name.get(spec.name) if by_name is not None else values[position]
                position += 1 + spec.control
                linked = source(entry.get("link"), entry.get("type")) if entry else None
                inputs[spec.name] = [str(linked[0]), linked[1]] if linked else value
            elif entry is not None:
                linked = source(entry.get("link"), entry.get("type"))
                if linked is not None:
                    inputs[spec.name] = [str(linked[0]), linked[1]]
        api_node: dict[str, Any] = {"class_type": node_type, "inputs": inputs}
        meta = {k: v for k, v in (("title", node.get("title")),
                                   ("models", node.get("properties", {}).get("models"))) if v}
        if meta:
            api_node["_meta"] = meta
        prompt[str(node_id)] = api_node
    return prompt


# ------------------------------------------------------------------------------ reading workflows


def read_workflow(path: Path) -> dict:
    """The JSON of a workflow file, API or UI format; one-line errors for what is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"workflow not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not JSON: {err}") from None
    if isinstance(data, dict) and isinstance(data.get("prompt"), dict) and not is_ui_workflow(data):
        data = data["prompt"]  # the body of a POST /prompt
    if is_ui_workflow(data):
        return data
    if isinstance(data, dict) and data and all(isinstance(v, dict) and "class_type" in v
                                               for v in data.values()):
        return data
    raise ValueError(f"{path} is not a ComfyUI workflow: expected the API format ({{id: {{class_type, "
                     "inputs}}}}) or the web UI's (nodes, links)")
