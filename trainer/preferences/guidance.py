"""What the picking panel is told besides the trees: which unlabelled tree to show next (``active``) and
whether more picks still help (``progress``), cached so that polling costs nothing.

Why a cache and a worker: the panel asks for a folder's state after every save and whenever it opens.
The answer depends only on the folder's trees and their newest picks (a stored tree never changes), so
it is computed once per such state; the leaves' features are computed once per tree. Computing can
still take seconds the first time (reading every leaf image of a large folder), so it runs on one
worker thread, and a request that cannot wait gets the last answer, brought up to date (``fields``).
The features are whatever the caller gives (the routes give the personal reward's pooled pixels).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .active import ORDERS, WARMUP, next_order
from .linear_reward import Basis, fit_basis
from .pairs import Pair, tree_pairs
from .progress import MIN_TREES, Advice, folder_advice
from .records import Picks
from .store import PickStore

Features = Callable[[Tensor], Tensor]
FOLDERS_KEPT = 8  # folders whose features stay in memory (least recently asked about goes first)


@dataclass(frozen=True)
class TreeState:
    """One tree as the panel's state lists it: its id (oldest first), leaves and newest picks."""

    id: str
    leaves: int
    liked: tuple[int, ...] | None  # None: not labelled
    disliked: tuple[int, ...] = ()


FolderState = tuple[TreeState, ...]


@dataclass(frozen=True)
class Guidance:
    """The answer for one folder state: the unlabelled trees in the active order, and the advice."""

    state: FolderState
    active_order: tuple[str, ...]
    advice: Advice


def unlabelled(state: FolderState) -> list[str]:
    return [t.id for t in state if t.liked is None]


def fields(state: FolderState, guidance: Guidance | None, order: str) -> dict[str, Any]:
    """``next_order`` and ``advice`` for the panel. ``guidance`` may be of an older state (or None, when
    nothing is computed yet): its order keeps the trees still unlabelled, then newer ones oldest first,
    and its advice says how many trees it was read on."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}: expected one of {', '.join(ORDERS)}")
    todo = unlabelled(state)
    ordered = todo
    if order == "active" and guidance is not None:
        left = set(todo)
        ordered = [t for t in guidance.active_order if t in left]
        known = set(ordered)
        ordered += [t for t in todo if t not in known]
    if guidance is None:
        advice = {"text": "reading your picks...", "more_helps": None, "trees": None}
    else:
        a = guidance.advice
        advice = {"text": a.text, "more_helps": a.more_helps, "trees": a.trees}
    return {"next_order": ordered, "advice": advice}


def needs_fit(state: FolderState) -> bool:
    """Whether the guidance of ``state`` fits a reward (else it is oldest first and a count: instant)."""
    return sum(t.liked is not None for t in state) >= min(WARMUP, MIN_TREES)


class FolderGuide:
    """One folder: the features of its trees (computed once per tree) and its basis (per set of trees)."""

    def __init__(self, root: Path, features: Features) -> None:
        self.root, self.features = root, features
        self._features: dict[str, Tensor] = {}
        self._basis: tuple[tuple[str, ...], Basis] | None = None
        self.computed = 0  # guidance computed (how often the cache was missed)

    def _leaf_features(self, store: PickStore, ids: Sequence[str]) -> dict[str, Tensor]:
        for tree_id in ids:
            if tree_id not in self._features:
                with torch.no_grad():
                    self._features[tree_id] = self.features(store.load_images(tree_id)).double().cpu()
        return {t: self._features[t] for t in ids}

    def compute(self, state: FolderState) -> Guidance:
        """The guidance of ``state`` (read from the folder only for features not computed yet)."""
        self.computed += 1
        ids = [t.id for t in state]
        pairs: dict[str, list[Pair]] = {t.id: tree_pairs(Picks(t.liked, t.disliked), t.leaves)
                                        for t in state if t.liked is not None}
        if not needs_fit(state):
            return Guidance(state, tuple(unlabelled(state)), folder_advice(ids, pairs, {}))
        feats = self._leaf_features(PickStore(self.root), ids)
        if self._basis is None or self._basis[0] != tuple(ids):
            self._basis = (tuple(ids), fit_basis(list(feats.values())))
        basis = self._basis[1]
        order = next_order(ids, pairs, feats, "active", basis=basis)
        return Guidance(state, tuple(order), folder_advice(ids, pairs, feats, basis))


class Guides:
    """Every folder's guide and its last guidance, computed on one worker thread (one at a time: the
    CPU is shared with whatever ComfyUI is running)."""

    def __init__(self, features: Features) -> None:
        self.features = features
        self._guides: OrderedDict[Path, FolderGuide] = OrderedDict()
        self._done: dict[Path, Guidance] = {}
        self._pending: dict[Path, tuple[FolderState, Future[Guidance]]] = {}
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="treerpo-picks-guide")

    def guide(self, root: Path) -> FolderGuide:
        with self._lock:
            guide = self._guides.pop(root, None) or FolderGuide(root, self.features)
            self._guides[root] = guide
            while len(self._guides) > FOLDERS_KEPT:
                old, _ = self._guides.popitem(last=False)
                self._done.pop(old, None)
            return guide

    def request(self, root: Path, state: FolderState) -> Future[Guidance]:
        """A future of ``state``'s guidance: done at once when it is the last one computed or needs no fit;
        the one under way for the same state; else a new computation (after whatever runs now)."""
        guide = self.guide(root)
        with self._lock:
            done = self._done.get(root)
            if (done is None or done.state != state) and not needs_fit(state):
                done = self._done[root] = guide.compute(state)  # oldest first and a count: instant
            if done is not None and done.state == state:
                ready: Future[Guidance] = Future()
                ready.set_result(done)
                return ready
            pending = self._pending.get(root)
            if pending is not None and pending[0] == state:
                return pending[1]
            future = self._worker.submit(self._compute, guide, root, state)
            self._pending[root] = (state, future)
            return future

    def _compute(self, guide: FolderGuide, root: Path, state: FolderState) -> Guidance:
        with self._lock:
            pending, done = self._pending.get(root), self._done.get(root)
        if pending is not None and pending[0] != state and done is not None:
            return done  # a newer state waits behind this one: nobody needs this answer any more
        guidance = guide.compute(state)
        with self._lock:
            self._done[root] = guidance
            if self._pending.get(root, (None,))[0] == state:
                del self._pending[root]
        return guidance

    def latest(self, root: Path) -> Guidance | None:
        """The last guidance computed for ``root`` (of any state), None before the first."""
        with self._lock:
            return self._done.get(root)
