"""Whether a saved protocol may continue: the same budget, bed, arms and part, and one code version.

A published protocol's figures come from one code version on one kind of numerics; a resume that would
mix two is refused in one line before anything trains.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..common.provenance import check_resume
from .arms import ALL_ARMS, BEST_FIXED_CLIP, TREE, Arm
from .results import Budget, Part, ProtocolResult


def check_setup(previous: ProtocolResult, budget: Budget, base: Sequence[str],
                config_path: str | None) -> None:
    """A saved protocol continues only under the same budget, bed and config (one line otherwise)."""
    def plain(budget: Budget) -> Any:  # as protocol.json holds it (tuples as lists)
        return json.loads(json.dumps(asdict(budget)))

    for what, old, new in (("budget", plain(previous.budget), plain(budget)),
                           ("test bed overrides", list(previous.base_overrides), list(base)),
                           ("config", previous.config, config_path)):
        if old != new:
            raise ValueError(f"cannot resume: the {what} differs from the saved protocol.json's "
                             f"({old} there, {new} now); give the same options or a new --out")


def _role(name: str) -> str:
    return next((a.role for a in ALL_ARMS if a.name == name), "main")


def check_arms(previous: ProtocolResult, arms: Sequence[Arm], roles: Collection[str]) -> None:
    """The saved arms of ``roles`` (run or skipped) are the ones chosen now."""
    saved = {a.name for a in previous.arms if a.role in roles and a.name != BEST_FIXED_CLIP}  # derived
    saved |= {name for name in previous.skipped if _role(name) in roles}
    chosen = {a.name for a in arms if a.role in roles}
    if "main" in roles and any(a.role == "ablation" for a in arms if a.role in roles):
        chosen.add(TREE)  # run_protocol adds it for the ablations
    if saved != chosen:
        raise ValueError(f"cannot resume: the arms differ from the saved protocol.json's ({sorted(saved)})")


def main_part(result: ProtocolResult) -> Part:
    """How the saved protocol ran its main arms: ``all`` (in one command with the ablations) or ``main``."""
    return "all" if "all" in result.parts else "main"


def check_resumable(previous: ProtocolResult, budget: Budget, base: Sequence[str], config_path: str | None,
                    arms: Sequence[Arm], part: Part = "all") -> None:
    """A saved protocol continues only under the same budget, bed, arms and part (one line otherwise)."""
    if previous.stage == "sweep" and not previous.lrs:
        raise ValueError("the saved protocol.json has no finished sweep: start again without --resume")
    check_setup(previous, budget, base, config_path)
    if part != main_part(previous):
        raise ValueError(f"cannot resume: the saved protocol.json ran --part {main_part(previous)}; resume "
                         "it with that")
    if "ablations" in previous.parts:
        raise ValueError("cannot resume the main part: it is finished and the ablation part has started; "
                         "continue that one with --part ablations --resume")
    check_arms(previous, arms, ("main",) if part == "main" else ("main", "ablation"))



def stamp_code(result: ProtocolResult, part: str, code: dict[str, Any], fresh: bool = False) -> None:
    """Record the code version ``part`` runs with, refused (one line) when it differs from the version
    that made the parts already in ``result``, or when those recorded none: a published protocol comes from
    one code version. ``fresh``: ``result`` was made by this command."""
    if not fresh and not result.code:
        raise ValueError("the saved protocol.json recorded no code version (it was made before 0.3.1): a "
                         "published protocol comes from one code version, so start again without --resume")
    check_resume(result.code, code, Path("protocol.json"))
    if not any(c.get("part") == part and c["code"] == code["code"] and c.get("machine") == code.get("machine")
               for c in result.code):  # a part resumed on another kind of machine records that one too
        result.code.append({"part": part, **code})
