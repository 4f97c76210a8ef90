"""What a ``treerpo bench taste`` run keeps on disk: ``taste.json`` (one per taste, written after every
seed), and the finished pieces of a seed still running (``.seed<N>.pieces``).

Why kept this way: a run takes hours, so a stopped one resumes where it stopped, and every page and
ablation is summarised again from the per-seed values with the current version's figures.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ...utils.atomic import atomic_write_text
from ..common.provenance import check_resume, versions
from .budget import FRONTIER_ONLY, SeedResult, TasteBudget


def load_json(path: Path) -> dict[str, Any] | None:
    """The JSON at ``path``, or None when there is no such file."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def seed_results(data: dict[str, Any]) -> list[SeedResult]:
    """The per-seed results stored in a ``taste.json``."""
    out = []
    for row in data.get("per_seed", []):
        row = dict(row)
        row["reward"] = {int(n): v for n, v in row.get("reward", {}).items()}
        out.append(SeedResult(**{k: v for k, v in row.items() if k in SeedResult.__dataclass_fields__}))
    return out


def per_seed_budget(budget: dict[str, Any]) -> dict[str, Any]:
    """The budget less its seed count and frontier-only fields: what each seed's method ran with (so a
    resumed run may add or drop seeds, or redo the frontier)."""
    return {k: v for k, v in budget.items() if k != "seeds" and k not in FRONTIER_ONLY}


LEGACY_FIELDS = {"frontier_strengths": 0, "picks_weights": [], "lora_rank": None, "lora_alpha": None,
                 "as_node": False, "template": False, "every_point": False}
"""What a ``taste.json`` written before a budget field existed ran with: no frontier strengths, the picks
weight alone (before the guard chose it), the config's LoRA size and the benchmark's own loop (before the
method ran as the node does, 0.6)."""


def budget_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A ``taste.json``'s budget, the fields it predates filled with what it ran (:data:`LEGACY_FIELDS`)."""
    return {**LEGACY_FIELDS, **data["budget"]}


def stored_budget(data: dict[str, Any]) -> TasteBudget:
    """The budget a stored ``taste.json`` was run with (its tuples as tuples again)."""
    b = budget_fields(data)
    tuples = ("modes", "at", "frontier_weights", "picks_weights")
    return TasteBudget(**{**b, **{k: tuple(b[k]) for k in tuples}})


def load_piece(pieces: Path | None, name: str, keep: dict[str, torch.Tensor] | None) -> dict[str, Any] | None:
    """A finished piece of a seed (a frontier arm, a tree count) kept in ``pieces``, its grid rows put
    into ``keep``; None when it has not run."""
    if pieces is None or not (pieces / f"{name}.json").is_file():
        return None
    images = pieces / f"{name}.pt"
    if keep is not None and images.is_file():
        keep.update(torch.load(images, weights_only=True))
    return json.loads((pieces / f"{name}.json").read_text(encoding="utf-8"))


def save_piece(pieces: Path | None, name: str, value: dict[str, Any], rows: dict[str, torch.Tensor]) -> None:
    """Keep a finished piece (and the grid rows it made) until its seed is whole."""
    if pieces is None:
        return
    if rows:
        torch.save(rows, pieces / f"{name}.pt")
    atomic_write_text(pieces / f"{name}.json", json.dumps(value) + "\n")


def run_piece(pieces: Path | None, name: str, keep: dict[str, torch.Tensor] | None,
              run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()`` unless ``pieces`` holds its result already (a resumed seed); kept there after."""
    found = load_piece(pieces, name, keep)
    if found is not None:
        return found
    had = set(keep or {})
    value = run()
    save_piece(pieces, name, value, {k: v for k, v in (keep or {}).items() if k not in had})
    return value


def seed_pieces(out: Path, seed: int, code: dict[str, Any], resume: bool) -> Path:
    """The folder that keeps a seed's finished pieces while it runs: reused by ``--resume`` when the
    same code made it (refused in one line otherwise), emptied for a fresh run."""
    pieces = out / f".seed{seed}.pieces"
    stamp = pieces / "code.json"
    if pieces.exists() and resume and stamp.is_file():
        made = json.loads(stamp.read_text(encoding="utf-8"))
        check_resume([made], code, pieces)
        return pieces
    shutil.rmtree(pieces, ignore_errors=True)
    pieces.mkdir(parents=True)
    atomic_write_text(stamp, json.dumps(code) + "\n")
    return pieces


def write_taste_json(path: Path, done: list[SeedResult], budget: TasteBudget, taste: str, command: str,
                     wanted: Sequence[int], extra: Sequence[str] = (), note: dict[str, Any] | None = None
                     ) -> None:
    """``taste.json`` from the seeds ``done``; ``note``: keys added as they are (where a combined run
    came from)."""
    from .summary import summarise

    summary = summarise(done, budget, taste)
    summary["per_seed"] = [asdict(r) for r in done]
    summary["command"] = command
    summary["extra"] = list(extra)
    summary["code"] = versions(r.code for r in done)
    summary["complete"] = all(any(r.seed == s for r in done) for s in wanted)
    summary.update(note or {})
    atomic_write_text(path, json.dumps(summary, indent=1) + "\n")


CARRIED = ("combined_from",)
"""``taste.json`` keys a summary carries over as they are (see :func:`write_taste_json`'s ``note``)."""


def reload(out: Path) -> dict[str, Any]:
    """``out/taste.json`` summarised again from its per-seed values (with this version's figures)."""
    from .summary import summarise

    data = json.loads((out / "taste.json").read_text(encoding="utf-8"))
    budget = stored_budget(data)
    results = seed_results(data)
    summary = summarise(results, budget, data["taste"])
    summary["per_seed"] = [asdict(r) for r in results]
    summary["command"] = data.get("command", "")
    summary["extra"] = data.get("extra", [])
    summary["code"] = versions(r.code for r in results)
    summary["complete"] = data.get("complete", True)
    summary.update({k: data[k] for k in CARRIED if k in data})
    return summary
