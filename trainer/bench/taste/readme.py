"""The short form of the taste table, between ``<!-- bench taste summary -->`` markers: the README's taste
block (``--readme``) and the same block on another page (``--summary PAGE``, the short results page).

The README is the front door: one row per taste (the share of the oracle frontier at each labelled-tree
count, with the target's reading), every run pooled, the risk count and one line per ablation arm, all
rendered from the same ``taste.json`` files as docs/results-taste.md, so the two never disagree. Why a
marked block and not prose: hand-copied figures drift when a run is redone. Its link to the taste page is
relative to the page the block is written into, so one block serves the README and any page in docs/.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...utils.atomic import atomic_write_text
from ..common.marked import replace_marked
from .ablation import ablation_rows, method_weights, pooled_share, risk_count, verdict
from .page import ABLATION_TREES, AGAINST_PROMPT

BEGIN = "<!-- bench taste summary: begin -->"
END = "<!-- bench taste summary: end -->"
TASTE_PAGE = Path("docs/results-taste.md")
"""The published taste page, relative to the repository root (where the commands are run)."""
EVERY_TASTE = "every-taste-learning-from-picks-under-the-guard"
"""The anchor of the page's section of one ``bench taste`` run and its arms."""
ASSEMBLED_DEFAULT = "050s-default-two-trainings-the-guard-keeps-one"
"""The anchor of the page's section of 0.5.0's default, assembled (the guard chooses the weight)."""


def _pct_ci(e: dict[str, Any]) -> str:
    if not math.isfinite(e["ci95"]):
        return f"{e['mean']:.0%}"
    return f"{e['mean']:.0%} ({e['mean'] - e['ci95']:.0%} to {e['mean'] + e['ci95']:.0%})"


def _points(e: dict[str, Any]) -> str:
    """A difference of shares in percentage points, with its 95% interval."""
    mean, half = 100 * e["mean"], 100 * e["ci95"]
    if not math.isfinite(half):
        return f"{mean:+.0f} points"
    return f"{mean:+.0f} points ({mean - half:+.0f} to {mean + half:+.0f})"


def share_cell(row: dict[str, Any]) -> str:
    """A taste's share of its frontier at one tree count, and the target's word where there is one."""
    share = row["share_of_frontier"]
    text = f"{share:.0%}" if math.isfinite(share) else "n/a"
    target = row.get("target")
    return text + (f" ({target['reading']})" if target else "")


def taste_line(summary: dict[str, Any], counts: Sequence[str]) -> str:
    """One taste's row: its share of the frontier at each count, and the prompt-following change at the
    ablation's count (or the last)."""
    name = summary["taste"] + (" (against the prompt)" if summary["taste"] in AGAINST_PROMPT else "")
    rows = summary["by_trees"]
    cells = [share_cell(rows[n]) if n in rows else "not run" for n in counts]
    at = ABLATION_TREES if ABLATION_TREES in rows else list(rows)[-1]
    guard = rows[at]["guard_change"]
    return (f"| {name} | {summary['frontier']['gain']['mean']:+.3f} | " + " | ".join(cells)
            + f" | {guard['mean']:+.3f} |")


def trained_at(budget: dict[str, Any]) -> str:
    """The picks weights the table's method trained at, in a few words."""
    weights = method_weights(budget)
    if len(weights) == 1:
        return f"at a fixed picks weight of {weights[0]:g}"
    return "at picks weights " + " and ".join(f"{w:g}" for w in weights) + " (the guard keeps one run)"


def readme_block(summaries: Sequence[dict[str, Any]], arms: dict[str, list[dict[str, Any]]] | None = None,
                 page: str = f"{TASTE_PAGE.as_posix()}#{EVERY_TASTE}",
                 note: str = "") -> str:
    """The block, markers included; ``note``: a sentence after the arms' lines (what they are measured
    against, when the table is not the run the arms were paired with)."""
    first = summaries[0]
    b = first["budget"]
    counts = list(first["by_trees"])
    seeds = len(first["seeds"])
    at = ABLATION_TREES if ABLATION_TREES in counts else counts[-1]
    lines = [
        BEGIN,
        f"From your picks: a simulated person ({b['mistakes']:.0%} of its marks mistakes) labels trees of "
        f"the embedded model for a hidden taste, the method trains {trained_at(b)}, and the guard keeps "
        f"prompt-following at `{b['keep']}` "
        f"(a fall of at most {first['by_trees'][at]['guard_limit']:.2f}). The share of the **oracle "
        "frontier** the taste reached (the frontier trains the hidden taste itself as the reward and "
        f"chooses on the test pairs: a ceiling), from mean gains over {seeds} seeds, on "
        f"{b['eval_pairs']} held-out test pairs, with the target's reading (50% at 25 trees, 80% at 50):",
        "",
        "| taste | oracle frontier | " + " | ".join(f"{n} trees" for n in counts)
        + f" | prompt-following change at {at} |",
        "|---|---|" + "---|" * len(counts) + "---|",
        *[taste_line(s, counts) for s in summaries],
        "",
    ]
    pooled = [(n, pooled_share(summaries, n)) for n in counts]
    risk = risk_count(summaries)
    lines.append("Every taste and seed, each run's share of its own frontier: "
                 + "; ".join(f"{n} trees {_pct_ci(e)}" for n, e in pooled if e["n"])
                 + f". Runs whose held-out fall went past the limit: {risk['past']} of {risk['runs']}.")
    for name, row in ablation_rows(summaries, arms or {}, at).items():
        if row["runs"]:
            lines.append(f"- {name}, at {at} trees against the default on the same {row['runs']} runs: "
                         f"{_points(row['difference'])}, {verdict(row)}.")
    if note:
        lines += ["", note]
    lines += ["", "Every figure with its interval, the ablations and where the rest goes: "
                  f"[{page.split('#')[0]}]({page}).", END]
    return "\n".join(lines)


def with_readme_block(text: str, block: str) -> str:
    """``text`` (the README) with its taste block replaced; a README without the markers is refused."""
    return replace_marked(text, BEGIN, END, block, "taste block")


def page_link(target: Path, anchor: str, docs: Path | None = None) -> str:
    """The link from the page ``target`` to ``anchor`` of the taste page (``docs``, or the published
    one), relative to ``target``'s folder as markdown resolves it."""
    where = Path(os.path.relpath(docs or TASTE_PAGE, target.parent)).as_posix()
    return f"{where}#{anchor}"


def check_summary_page(path: Path, option: str) -> None:
    """Refuse in one line, before anything runs, a page the block cannot go into (``option`` names it)."""
    if not path.is_file():
        raise ValueError(f"{option} {path}: no such file")
    try:
        with_readme_block(path.read_text(encoding="utf-8"), "")
    except ValueError as err:
        raise ValueError(f"{option} {path}: {err}") from None


def write_summary_block(path: Path, block: str) -> None:
    """The taste block into the page ``path`` between its markers (refused in one line without them)."""
    try:
        text = with_readme_block(path.read_text(encoding="utf-8"), block)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    atomic_write_text(path, text)


def assembled_readme_block(summaries: Sequence[dict[str, Any]], fixed: Sequence[dict[str, Any]],
                           target: Path = Path("README.md"), docs: Path | None = None) -> str:
    """The short block for the default that chooses the picks weight (assembled by ``treerpo bench
    taste-assemble``), with one line against ``fixed``: the same picks and seeds at the first weight alone,
    the run every other lever was measured against; its link goes from ``target`` to the taste page
    (``docs``, or the published one). Why this and not the fixed run's table: the block shows what a
    person gets from the shipped default."""
    weight = method_weights(fixed[0]["budget"])[0]
    arm = f"a fixed picks weight of {weight:g} (0.4.x's method)"
    note = ("The other levers (the features, error-free picks, the guard's measurement, two rounds, "
            f"steering, pessimism) were each measured against that fixed weight of {weight:g}: the results "
            "page lists them.")
    return readme_block(summaries, {arm: list(fixed)}, page_link(target, ASSEMBLED_DEFAULT, docs), note)
