"""The short verdict block of the paper's claims, which a page keeps between its markers (README.md's,
the short results page's): per claim the figure, both Holm p-values and the verdict, with a link to the
protocol's page for what each rests on."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from ..common.marked import replace_marked
from .claims import Test
from .page_cells import short_value, verdict_word
from .results import ProtocolResult

README_BEGIN = "<!-- bench protocol claims: begin -->"
README_END = "<!-- bench protocol claims: end -->"
PROTOCOL_PAGE = "docs/results-protocol.md"
"""The protocol's page as the README links to it (from the repository's root)."""


def _p_text(p: float) -> str:
    return "n/a" if math.isnan(p) else f"{p:.2g}"


def link_to(target: Path, page: Path) -> str:
    """``target`` as a link written on ``page``: relative to the page's folder, with forward slashes."""
    return Path(os.path.relpath(target.resolve(), page.resolve().parent)).as_posix()


def readme_claims(result: ProtocolResult, tests: Sequence[Test], link: str = PROTOCOL_PAGE,
                  option: str = "--readme") -> str:
    """The short verdict table, between its markers: per claim of the primary and ablation-claims
    families, the figure with its 95% interval and the verdict ("met" and "not met" only where the t
    test and the exact test both give it after Holm; everything else "inconclusive"). The p-values and
    what each verdict rests on are on the protocol's page, ``link`` (relative to the page the block is
    on); ``option``: the report's option that writes the block there."""
    lines = [README_BEGIN,
             f"| the paper's claim | on the CPU test bed, {result.budget.seeds} paired seeds: mean (95% CI) "
             "| Holm p: t test, exact | verdict |", "|---|---|---|---|"]
    for t in tests:
        if t.family not in ("primary", "ablation"):
            continue
        verdict = t.verdict if t.verdict in ("met", "not met") else "inconclusive"
        ps = f"{_p_text(t.p_adjusted)}, {_p_text(t.p_exact_adjusted)}"
        lines.append(f"| {t.group} | {short_value(t)} | {ps} | {verdict} |")
    commands = " then ".join(f"`{c}`" for c in result.command.splitlines())
    lines += ["", f"From {commands}; rendered by `treerpo bench report {option}`. A verdict needs a paired t "
              "test and an exact sign-flip test to agree after Holm's correction, against every baseline "
              "at once (the figure is against the one that decides); both p-values of every comparison: "
              f"[{link}]({link})."]
    lines += _readme_disturbed(result, tests, link)
    if not any(t.family == "ablation" for t in tests):
        lines += ["The paper's ablation claims (LayerTuning-RL, dynamic clipping) are untested at this "
                  "number of seeds, not inconclusive: this run holds no ablation part (`--part ablations`)."]
    return "\n".join([*lines, README_END])


def _readme_disturbed(result: ProtocolResult, tests: Sequence[Test], link: str) -> list[str]:
    """One line when leaving out the runs another process disturbed changes a verdict in seconds."""
    from .claims import all_tests
    from .disturbed import disturbed_runs, without

    runs = disturbed_runs(result)
    if not runs:
        return []
    clean = {t.key: t for t in all_tests(without(result, runs))}
    changed = [f"{t.group} reads {verdict_word(clean[t.key])}" for t in tests
               if t.family == "primary" and t.key in clean and verdict_word(clean[t.key]) != verdict_word(t)]
    if not changed:
        return []
    return [f"Without the {len(runs)} runs another process disturbed (wall/CPU ratio; {link}, "
            f"\"Clean seconds\"): {'; '.join(changed)}."]


def with_readme_claims(text: str, table: str) -> str:
    """``text`` (the README, or the short results page) with the block between its markers replaced by
    ``table``."""
    return replace_marked(text, README_BEGIN, README_END, table, "verdict table")


def page_with_block(page: Path, table: str) -> str:
    """The text of the file ``page`` with its block replaced by ``table``; refused in one line naming
    ``page`` when it has no markers (before anything is written)."""
    try:
        return with_readme_claims(page.read_text(encoding="utf-8"), table)
    except ValueError as err:
        raise ValueError(f"{page}: {err}; add them where the verdict table goes") from None
