"""The picking panel's server side (web/pick_leaves.js): a picks folder's trees, their leaf images, and
saving a choice, as HTTP routes on ComfyUI's own server.

Why routes and not a node that waits for clicks: the graph never waits. Trees are stored on disk by
TreeRPO Sample Trees to Pick, and every click of "save" is written at once (``PickStore.save_picks``:
append-only, atomic), so nothing hangs the queue, a closed tab loses nothing, and a restarted server
serves every earlier pick. The routes keep nothing but caches: tree records (never rewritten) and the
guidance below; every pick is on disk.

    GET  /treerpo/picks/{folder}/state              the trees, their prompts and newest picks, counts;
                                                    next_order (the unlabelled trees in the order to
                                                    show them; ?order=oldest|active) and advice (whether
                                                    more picks still help), when the folder exists
    GET  /treerpo/picks/{folder}/{tree}/{leaf}.png  one leaf as it was stored
    POST /treerpo/picks/{folder}/{tree}             {"liked": [..], "disliked": [..]} -> saved, or
                                                    400 with {"error": one line} (404: no such tree)

``folder`` is a plain name under ``<output>/treerpo_picks/`` (``picks_folders``); anything else is a 400.

``next_order`` and ``advice`` come from ``trainer/preferences/guidance.py``: computed once per folder
state on one worker thread, never on a poll that finds the folder unchanged. A request waits for them
at most ``GUIDE_WAIT_S``; past that it gets the last ones computed, brought up to date (a few seconds
the first time a large folder is opened, while its leaves are read).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from ..trainer.preferences.active import DEFAULT_ORDER, ORDERS
from ..trainer.preferences.guidance import FolderState, Guides, TreeState, fields, unlabelled
from ..trainer.preferences.records import PicksFormatError, TreeMeta
from ..trainer.preferences.store import PickStore
from ..trainer.utils.atomic import one_line
from .picks_folders import picks_folder

TREE_ID = re.compile(r"[0-9]{8}T[0-9]{12}Z_[0-9a-f]{8}")
GUIDE_WAIT_S = 0.25  # longest a state request waits for fresh guidance before answering with the last
METAS_KEPT = 20000  # tree records kept in memory, every folder together
_registered = False
_guides: Guides | None = None
_metas: dict[tuple[Path, str], TreeMeta] = {}


def guides() -> Guides:
    """The server's guides (made on first use; the personal reward's default features, pooled pixels)."""
    global _guides
    if _guides is None:
        from ..trainer.rewards.personal import pooled_features

        _guides = Guides(pooled_features)
    return _guides


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _store(name: str) -> tuple[PickStore | None, web.Response | None]:
    """The folder's store, None when it holds nothing yet, or the error response."""
    try:
        path = picks_folder(name)
    except ValueError as err:
        return None, _error(400, f"picks folder: {err}")
    try:
        return PickStore(path), None
    except FileNotFoundError:
        return None, None


def _meta(store: PickStore, tree_id: str) -> TreeMeta:
    """A tree's record, read once per server (a stored tree's ``tree.json`` is never rewritten)."""
    key = (store.root, tree_id)
    meta = _metas.get(key)
    if meta is None:
        if len(_metas) >= METAS_KEPT:
            _metas.clear()
        meta = _metas[key] = store.meta(tree_id)
    return meta


def folder_state(name: str, store: PickStore | None) -> dict[str, Any]:
    """What the panel shows: every tree (oldest first) with its prompt, leaf count and newest picks, and
    the fingerprint of the LoRA that sampled it (None: the base model; set for a trained model's trees,
    picked in a second round)."""
    trees = []
    for tree_id in store.tree_ids() if store is not None else []:
        meta, picks = _meta(store, tree_id), store.picks(tree_id)
        trees.append({"id": tree_id, "prompt": meta.prompt, "leaves": meta.leaves,
                      "size": list(meta.image_size), "labelled": picks is not None,
                      "liked": list(picks.liked) if picks else [],
                      "disliked": list(picks.disliked) if picks else [], "lora": meta.model.lora})
    return {"folder": name, "exists": store is not None, "total": len(trees),
            "labelled": sum(t["labelled"] for t in trees), "trees": trees}


def tree_states(trees: list[dict[str, Any]]) -> FolderState:
    """The folder state guidance is computed on, from ``folder_state``'s trees."""
    return tuple(TreeState(t["id"], t["leaves"], tuple(t["liked"]) if t["labelled"] else None,
                           tuple(t["disliked"])) for t in trees)


async def guidance_fields(root: Path, state: FolderState, order: str) -> dict[str, Any]:
    """``next_order`` and ``advice``: fresh when they come within ``GUIDE_WAIT_S``, else the last ones."""
    future = guides().request(root, state)
    try:
        guidance = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), GUIDE_WAIT_S)
    except asyncio.TimeoutError:
        guidance = guides().latest(root)
    except Exception as err:  # e.g. a leaf image that cannot be read: the panel still works, and says so
        logging.warning("TreeRPO: no picking advice for %s: %s", root, one_line(err))
        return {"next_order": unlabelled(state),
                "advice": {"text": f"no advice: {one_line(err)}", "more_helps": None, "trees": None}}
    return fields(state, guidance, order)


async def get_state(request: web.Request) -> web.Response:
    name = request.match_info["folder"]
    order = request.query.get("order", DEFAULT_ORDER)
    if order not in ORDERS:
        return _error(400, f"order must be one of {', '.join(ORDERS)}, got {order[:40]!r}")
    store, error = _store(name)
    if error is not None:
        return error
    try:
        body = folder_state(name, store)
    except PicksFormatError as err:
        return _error(400, str(err))
    if store is not None:
        body.update(await guidance_fields(store.root, tree_states(body["trees"]), order))
    return web.json_response(body)


def _tree(request: web.Request) -> tuple[PickStore | None, str, web.Response | None]:
    name, tree_id = request.match_info["folder"], request.match_info["tree"]
    store, error = _store(name)
    if error is not None:
        return None, tree_id, error
    if store is None:
        return None, tree_id, _error(404, f"picks folder {name!r} holds no tree yet")
    if not TREE_ID.fullmatch(tree_id) or not store.has_tree(tree_id):
        return None, tree_id, _error(404, f"no tree {tree_id!r} in picks folder {name!r}")
    return store, tree_id, None


async def get_leaf(request: web.Request) -> web.StreamResponse:
    store, tree_id, error = _tree(request)
    if error is not None:
        return error
    leaf = int(request.match_info["leaf"])
    path: Path = store.image_path(tree_id, leaf)
    if not path.is_file():  # past the tree's leaves: stored trees hold exactly their leaves' images
        return _error(404, f"tree {tree_id} has no leaf {leaf}")
    # a stored leaf never changes: the browser may keep it
    return web.FileResponse(path, headers={"Cache-Control": "max-age=31536000, immutable"})


def _leaf_list(body: dict, key: str) -> list[int]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ValueError(f"{key} must be a list of leaf numbers, got {json.dumps(value)[:60]}")
    return value


async def post_picks(request: web.Request) -> web.Response:
    store, tree_id, error = _tree(request)
    if error is not None:
        return error
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, 'send JSON: {"liked": [leaf numbers], "disliked": [leaf numbers]}')
    if not isinstance(body, dict):
        return _error(400, 'send JSON: {"liked": [leaf numbers], "disliked": [leaf numbers]}')
    try:
        picks = store.save_picks(tree_id, _leaf_list(body, "liked"), _leaf_list(body, "disliked"))
    except ValueError as err:
        return _error(400, str(err))
    labelled = len(store.labelled())
    return web.json_response({"tree": tree_id, "liked": list(picks.liked), "disliked": list(picks.disliked),
                              "labelled": labelled, "total": len(store.tree_ids())})


def register_routes() -> bool:
    """Add the routes to ComfyUI's server (once); False when no server runs (a headless workflow)."""
    global _registered
    module = sys.modules.get("server")  # ComfyUI's server module, loaded only when a server runs
    server = getattr(getattr(module, "PromptServer", None), "instance", None)
    if server is None:
        return False
    if not _registered:
        routes = server.routes
        routes.get("/treerpo/picks/{folder}/state")(get_state)
        routes.get(r"/treerpo/picks/{folder}/{tree}/{leaf:\d{1,3}}.png")(get_leaf)
        routes.post("/treerpo/picks/{folder}/{tree}")(post_picks)
        _registered = True
        logging.debug("TreeRPO: picking routes registered under /treerpo/picks/")
    return True
