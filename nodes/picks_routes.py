"""The picking panel's server side (web/pick_leaves.js): a picks folder's trees, their leaf images, and
saving a choice, as HTTP routes on ComfyUI's own server.

Why routes and not a node that waits for clicks: the graph never waits. Trees are stored on disk by
TreeRPO Sample Trees to Pick, and every click of "save" is written at once (``PickStore.save_picks``:
append-only, atomic), so nothing hangs the queue, a closed tab loses nothing, and a restarted server
serves every earlier pick. The routes hold no state of their own.

    GET  /treerpo/picks/{folder}/state              the trees, their prompts and newest picks, counts
    GET  /treerpo/picks/{folder}/{tree}/{leaf}.png  one leaf as it was stored
    POST /treerpo/picks/{folder}/{tree}             {"liked": [..], "disliked": [..]} -> saved, or
                                                    400 with {"error": one line} (404: no such tree)

``folder`` is a plain name under ``<output>/treerpo_picks/`` (``picks_folders``); anything else is a 400.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from ..trainer.preferences.records import PicksFormatError
from ..trainer.preferences.store import PickStore
from .picks_folders import picks_folder

TREE_ID = re.compile(r"[0-9]{8}T[0-9]{12}Z_[0-9a-f]{8}")
_registered = False


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


def folder_state(name: str, store: PickStore | None) -> dict[str, Any]:
    """What the panel shows: every tree (oldest first) with its prompt, leaf count and newest picks."""
    trees = []
    for tree_id in store.tree_ids() if store is not None else []:
        meta, picks = store.meta(tree_id), store.picks(tree_id)
        trees.append({"id": tree_id, "prompt": meta.prompt, "leaves": meta.leaves,
                      "size": list(meta.image_size), "labelled": picks is not None,
                      "liked": list(picks.liked) if picks else [],
                      "disliked": list(picks.disliked) if picks else []})
    return {"folder": name, "exists": store is not None, "total": len(trees),
            "labelled": sum(t["labelled"] for t in trees), "trees": trees}


async def get_state(request: web.Request) -> web.Response:
    name = request.match_info["folder"]
    store, error = _store(name)
    if error is not None:
        return error
    try:
        return web.json_response(folder_state(name, store))
    except PicksFormatError as err:
        return _error(400, str(err))


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
