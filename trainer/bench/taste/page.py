"""``treerpo bench taste --docs``: the taste page, docs/results-taste.md, a section per ``bench taste`` run.

The taste benchmark owns its page: each command replaces (or appends) its marked section and leaves the
text around it, the hand-written reading of the figures included. ``treerpo bench taste-assemble --docs``
writes the assembled default's block on the same page. Why a page of its own: the protocol's page
(docs/results.md) is rebuilt whole from one run, while these figures come from other runs and commands.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...utils.atomic import atomic_write_text
from .ablation import (
    ablation_rows,
    arm_lines,
    decomposition,
    decomposition_lines,
    fall_gap_lines,
    method_weights,
    pooled_share,
    risk_count,
    stated_risk,
    verdict,
)
from .frontier import frontier_name
from .page_parts import calibration_words, code_line, marks, run_commands, with_ci, with_space

TABLE_HEAD = ("| taste | labelled trees | taste gain | oracle frontier | share of the frontier | target | "
              "prompt-following change | limit: held? | runs past the limit | held-out pair accuracy |",
              "|---|---|---|---|---|---|---|---|---|---|")
"""The head of the table of every taste (the main section's and the assembled default's)."""

ABLATION_TREES = "50"
"""The labelled-tree count of the ablation and the decomposition (the issue's main target)."""

SECTION = "every taste"
FIXED_SECTION = "fixed 0.3"
SECTIONS = (SECTION, FIXED_SECTION, "family", "template")
"""The sections the taste page holds; an older version's other sections are dropped when one is written."""
TABLE_TITLES = {SECTION: "Every taste: learning from picks under the guard",
                FIXED_SECTION: "0.4.x's table: every taste at a fixed picks weight of 0.3, and the levers "
                               "measured on it"}
"""The heading of each table section: the shipped default's, and 0.4.x's table at the fixed weight 0.3,
kept rendered from its runs because every lever of its time was measured paired with it."""
AGAINST_PROMPT = ("lower_objects", "warm_shades")
"""Tastes written to pull against the prompt (their oracle's scene reward falls as the taste rises)."""


def method_weights_words(budget: dict[str, Any]) -> str:
    """How the method weighs the picks, in words: at one fixed weight, or once at each weight the guard
    tries, keeping the run whose choice gained the most personal reward on the validation pairs."""
    weights = method_weights(budget)
    if len(weights) == 1:
        return f"x 8 leaves at `picks:{weights[0]:g},scene:{1 - weights[0]:g}`"
    return ("x 8 leaves once at each picks weight " + " and ".join(f"{w:g}" for w in weights)
            + " (`picks:w,scene:1-w`, one training each; the guard keeps the run whose choice gained the "
              "most personal reward on the validation pairs)")


def sections_of(page: str, key: str | None = None) -> list[str]:
    """The marked taste sections of ``page`` (markers included): every one, or ``key``'s."""
    if key is None:
        pattern = r"<!-- bench taste (?P<key>[^>]*?): begin -->.*?<!-- bench taste (?P=key): end -->"
    else:
        begin, end = marks(key)
        pattern = re.escape(begin) + r".*?" + re.escape(end)
    return [m.group(0) for m in re.finditer(pattern, page, flags=re.S)]


def put_section(path: Path, key: str, section: str, drop_others: bool = False) -> None:
    """Replace the section of ``key`` in the page at ``path`` (or append it; or write a new page);
    ``drop_others``: remove the taste sections of an older version of the benchmark (a key other than
    this one and those of :data:`SECTIONS`)."""
    page = path.read_text(encoding="utf-8") if path.exists() else "# Results\n"
    if drop_others:
        keep = [marks(k)[0] for k in {key, *SECTIONS}]
        for old in sections_of(page):
            if not any(old.startswith(begin) for begin in keep):
                page = page.replace(old, "").replace("\n\n\n\n", "\n\n")
    old = sections_of(page, key)
    page = page.replace(old[0], section) if old else page.rstrip("\n") + "\n\n" + section + "\n"
    atomic_write_text(path, page)


def taste_rows(summary: dict[str, Any]) -> list[str]:
    """One table row per tree count of one taste."""
    rows = []
    name = summary["taste"] + (" (against the prompt)" if summary["taste"] in AGAINST_PROMPT else "")
    for n, row in summary["by_trees"].items():
        target = row.get("target")
        verdict = f"{target['share']:.0%}: {target['reading']}" if target else ""
        guard = row["guard_held"]
        rows.append(
            f"| {name} | {n} | {with_ci(row['taste_gain'])} | {with_ci(row['frontier_gain'])} | "
            f"{row['share_of_frontier']:.0%} | {verdict} | {with_ci(row['guard_change'])} | "
            f"-{row['guard_limit']:.2f}: {guard['reading']} ({guard['interval']}) | "
            f"{row['past_limit']['runs']} of {row['past_limit']['of']} | "
            f"{row['held_out_pair_accuracy']:.2f} |")
        name = ""
    return rows


def margin_rows(summary: dict[str, Any]) -> list[str]:
    """One row per tree count: what each margin would have given (the same runs, another choice)."""
    rows = []
    name = summary["taste"]
    for n, row in summary["by_trees"].items():
        margins = row.get("margins")
        if not margins:
            continue
        cells = [f"{m['share_of_frontier']:.0%}, {with_ci(m['guard_change'])}" for m in margins.values()]
        rows.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
        name = ""
    return rows


def chosen_line(summary: dict[str, Any]) -> str:
    """Which checkpoints the guard chose at each tree count, over the seeds."""
    parts = []
    for n, row in summary["by_trees"].items():
        picks = [f"{c['iteration']}" + (f"@{c['strength']:g}" if c["strength"] not in (0.0, 1.0) else "")
                 if c["iteration"] else "base" for c in row["chosen"]]
        parts.append(f"{n} trees: {', '.join(picks)}")
    weights = ", ".join(f"{w}: {with_ci(e)}" for w, e in summary["frontier"]["by_weight"].items())
    return (f"- **{summary['taste']}**: chosen (iteration@strength, per seed) {'; '.join(parts)}. "
            f"Frontier by weight: {weights}; its point per seed: {frontier_points(summary)}.")


def frontier_points(summary: dict[str, Any]) -> str:
    """The frontier's best point per seed (weight, iteration@strength), or that none was within the limit."""
    out = []
    for seed in summary["per_seed"]:
        best = max(seed["frontier"].values(), key=lambda r: r["gain"])
        strength = best.get("strength", 1.0)
        at = f"{best['iteration']}" + (f"@{strength:g}" if strength != 1.0 else "")
        weight = frontier_name(best["weight"])
        out.append("none within the limit" if best["gain"] <= 0 else f"{weight} at {at}")
    return ", ".join(out)


def pooled_words(n: str, e: dict[str, Any]) -> str:
    """Every run's share of its frontier at ``n`` trees, pooled: the mean, its 95% interval and the runs."""
    return f"{n} trees {e['mean']:.0%}" + (f" ({e['mean'] - e['ci95']:.0%} to {e['mean'] + e['ci95']:.0%}, "
                                           f"{e['n']} runs)" if math.isfinite(e["ci95"]) else "")


def overall_lines(summaries: Sequence[dict[str, Any]], arms: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every taste and seed pooled: the share of the frontier per tree count, the risk count, the
    decomposition at 50 trees and the ablation table (``arms``: name -> the arm's summaries)."""
    counts = list(summaries[0]["by_trees"])
    pooled = [(n, pooled_share(summaries, n)) for n in counts]
    risk = risk_count(summaries)
    lines = ["", "Over every taste and seed, each run's gain as a share of its own frontier: " + "; ".join(
        pooled_words(n, e) for n, e in pooled) + ". Runs whose held-out fall of prompt-following went past "
        "the limit: "
        f"**{risk['past']} of {risk['runs']}** (every taste, seed and tree count)."]
    stated = stated_risk(summaries)
    if stated["runs"]:
        lines += [
            "", f"The risk the node states expects {stated['expected']:.1f} of those {stated['runs']} runs "
            f"past the limit (the sum of each chosen checkpoint's chance); {stated['past']} went past on the "
            "test pairs. The guard measures on validation pairs and the table on test pairs, two fixed sets "
            "that every seed shares, so a difference between the sets is one draw that every run carries."
            + with_space(calibration_words(stated["calibration"]))
            + " Every checkpoint measured on both sets, per taste:", "", *fall_gap_lines(summaries)]
    n = ABLATION_TREES
    if all(n in s["by_trees"] for s in summaries):
        clean = next((arm for arm in arms.values() if arm and arm[0]["budget"].get("mistakes") == 0), [])
        by_taste = {s["taste"]: s for s in clean}
        parts = [decomposition(s, n, by_taste.get(s["taste"])) for s in summaries]
        lines += ["", f"Where the rest goes, at {n} labelled trees (means over seeds; in brackets the share "
                      "of that taste's frontier). The oracle at the method's weight trains the hidden taste "
                      "at the method's fixed picks weight; the method with margin 0 chooses with no margin "
                      "(the same runs); error-free picks is the method on picks without the person's "
                      "mistakes (`--mistakes 0`); the reward's pair accuracy is on held-out base-model "
                      "trees and on trees the chosen model sampled, labelled by the same person.", "",
                  *decomposition_lines(parts)]
    if arms:
        at = n if all(n in s["by_trees"] for s in summaries) else counts[-1]  # the template's 12 trees
        rows = ablation_rows(summaries, arms, at, pilot=True)
        lines += ["", "Each lever off (or changed) in turn, on the same tastes and seeds and the same "
                      "frontier, paired per run with the default: the difference of the shares with its "
                      "95% t interval and exact sign-flip p (a difference whose interval holds 0 is "
                      "inconclusive).", "", *arm_lines(rows, at), *pilot_lines(rows)]
    return lines


def pilot_lines(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Below the ablation table: the pilot's row against the guard choosing from whole runs, which is
    the comparison that says whether the pilot could replace the second training."""
    row = next((r for r in rows.values() if "against_whole_runs" in r and r["runs"]), None)
    if row is None:
        return []
    w, d = row["against_whole_runs"], row["against_whole_runs"]["difference"]
    return ["", "The pilot (`trainer/bench/taste/pilot.py`: the first checkpoint, after "
                f"{row['at']} iterations, of each weight's run, each projected on a straight line to its "
                "end or to the limit less the margin, the weight with the most projected personal reward "
                "trained on) against the guard choosing from whole runs, on the same "
                f"{w['runs']} runs: {w['share']['mean']:.0%} against {w['default_share']['mean']:.0%} of "
                f"the frontier, {d['mean']:+.1%} ({d['mean'] - d['ci95']:+.1%} to "
                f"{d['mean'] + d['ci95']:+.1%}), exact p = {w['exact_p']:.2g}: {verdict(w)}. It kept the "
                f"weight whole runs kept in {row['agree']} of {w['runs']} runs, at {row['cost']:.3g}x one "
                f"training's iterations against 2x. Runs past the limit: {w['past_limit']} against "
                f"{w['default_past_limit']}."]


def what_was_run(first: dict[str, Any]) -> str:
    """The paragraph that says what the run did: the person, the method, the frontier and the pairs."""
    b = first["budget"]
    seeds = len(first["seeds"])
    counts = ", ".join(first["by_trees"])
    return (
        "A scripted person with a hidden taste that no shipped reward measures labels trees of 8 leaves "
        f"of the embedded model: likes {b['likes']}, dislikes {b['dislikes']}, {b['mistakes']:.0%} of its "
        f"marks random mistakes. From the first {counts} labelled trees the method fits the "
        f"personal reward and trains {b['iterations']} iterations of {b['prompts_per_iteration']} prompts "
        + method_weights_words(b) + " with the guard at its default "
        f"(`{b['keep']}`: prompt-following, the scene reward, may fall by at most the limit): "
        + ("in two rounds of picks (half the trees on the base model, half on the first round's chosen "
           "model; the second round fits on every pick and trains again from the base model): "
           if b.get("rounds", 1) == 2 else "")
        + f"{b['checkpoints']} checkpoints and lower LoRA strengths measured on {b['validation_pairs']} "
        "validation pairs, the choice made from the personal reward and the scene reward, never from the "
        f"hidden taste, with a margin of {b['margin']:g} standard error. The **oracle frontier** trains the "
        "hidden taste itself as the reward at weights "
        + ", ".join(f"{w:g}" for w in b["frontier_weights"])
        + (f" and with the guard steering the weight from {b['picks_weight']:g}"
           if b.get("frontier_steer") else "")
        + " over the same budget, and per run takes the best checkpoint"
        + (f", or lower LoRA strength ({b.get('frontier_strengths', 0)} halving toward the limit on its "
           "tastiest checkpoint past it, as the guard searches),"
           if b.get("frontier_strengths", 0) else " (at full LoRA strength only)")
        + " whose scene fall on the test pairs stays within the limit (0 where none does); the frontier is "
        "the largest of those gains. It reads the hidden "
        "taste and chooses on the test figures themselves, so it is an optimistic ceiling. Every figure "
        f"is on {b['eval_pairs']} held-out test prompt/seed pairs that neither training nor the guard saw: "
        f"means over {seeds} seeds with 95% t intervals (paired per seed where a difference is shown).")


def markdown(summaries: Sequence[dict[str, Any]], image: str | None, command: str,
             arms: dict[str, list[dict[str, Any]]] | None = None, key: str = SECTION) -> str:
    """The section of ``key`` (:data:`TABLE_TITLES`): what was run, the table of every taste, the pooled
    figures, the decomposition and the ablations, the costs and where the gain went (runs that hold them),
    the choices, the grid."""
    from .family_page import extra_tables

    first = summaries[0]
    b = first["budget"]
    seeds = len(first["seeds"])
    begin, end = marks(key)
    lines = [
        begin,
        f"## {TABLE_TITLES[key]}",
        "",
        "Generated by `treerpo bench taste` ([picks.md](picks.md)); this section is rewritten by",
        "",
        "```bash",
        *run_commands(summaries, command),
        "```",
        "",
        code_line(summaries),
        "",
        what_was_run(first),
        "",
        *TABLE_HEAD,
    ]
    for summary in summaries:
        lines += taste_rows(summary)
    lines += [
        "",
        "Target: at least 50% of the frontier at 25 trees and 80% at 50 (its margin, gain minus that share "
        "of the frontier, paired per seed: **met** when its 95% interval lies above 0, **not met** when "
        "below, otherwise met or short on the mean). Prompt-following is held when its mean change is above "
        "minus the limit (the interval in brackets says whether the 95% interval clears it). With "
        f"{seeds} seeds the exact sign-flip test of a margin cannot go below p = {2 / 2 ** seeds:.4g}, above "
        "0.05: these readings rest on t intervals, as stated, not on an exact test.",
        *overall_lines(summaries, arms or {}),
        *extra_tables(summaries),
    ]
    sensitivity = [row for summary in summaries for row in margin_rows(summary)]
    if sensitivity:
        margins = list(next(iter(summaries[0]["by_trees"].values()))["margins"])
        lines += [
            "",
            "Had the guard chosen with another margin (the same runs: every checkpoint and strength it "
            "chose among was also measured on the test pairs, so this table shows what each margin "
            f"gives, not a new run; the default is {b['margin']:g}): share of the frontier, and the "
            "change of prompt-following (95% CI).",
            "",
            "| taste | labelled trees | " + " | ".join(f"margin {m}" for m in margins) + " |",
            "|---|---|" + "---|" * len(margins),
            *sensitivity,
        ]
    lines += ["", "Which checkpoint the guard took (the training iteration, and the LoRA strength when "
                  "below 1):", ""]
    lines += [chosen_line(s) for s in summaries]
    if image:
        lines += ["", "Held-out test prompts and seeds of a taste that pulls against the prompt (first "
                      "seed): before training, from the picks (the guard's choice), and the frontier's "
                      "best checkpoint:", "", f"![before and after]({image})"]
    lines.append(end)
    return "\n".join(lines)


def grid_name(docs: Path, taste: str, key: str = SECTION) -> str:
    """The file name of a section's grid in ``images/`` beside the page: named after the page and the
    taste, and for a section other than the shipped table's also after the section (so that two tables
    of the same taste keep their own grids)."""
    tag = "" if key == SECTION else "_" + key.replace(" ", "-")
    return f"{docs.stem}{tag}_{taste}.png"


def write_docs(summaries: Sequence[dict[str, Any]], outs: Sequence[Path], docs: Path, command: str,
               arms: dict[str, list[dict[str, Any]]] | None = None, key: str = SECTION) -> Path:
    """The section of ``key`` in ``docs``, and the grid of the first taste that pulls against the prompt
    copied into ``images/`` beside it (:func:`grid_name`; an older version's taste sections are
    replaced)."""
    if key not in TABLE_TITLES:
        raise ValueError(f"no table section {key!r}: one of {', '.join(TABLE_TITLES)}")
    image = None
    for summary, out in zip(summaries, outs, strict=True):
        grid = out / "before_after.png"
        if summary["taste"] in AGAINST_PROMPT and grid.exists():
            target = docs.parent / "images" / grid_name(docs, summary["taste"], key)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(grid.read_bytes())
            image = f"images/{target.name}"
            break
    put_section(docs, key, markdown(summaries, image, command, arms, key), drop_others=True)
    return docs


ASSEMBLED = ("<!-- assembled taste default: begin -->", "<!-- assembled taste default: end -->")
"""The markers of the block ``treerpo bench taste-assemble --docs`` writes into docs/results-taste.md."""


def assembled_block(summaries: Sequence[dict[str, Any]], command: str) -> str:
    """The default that chooses the picks weight, assembled from fixed-weight runs
    (``combine.py``): its table, pooled share, risk count and decomposition, markers
    included. Why a block of its own: the page's main section is one ``bench taste`` run and its arms,
    while this one is derived from two of them until the default's every tree count is assembled."""
    first = summaries[0]
    counts = list(first["by_trees"])
    tried = [f"{w:g}" for w in method_weights(first["budget"])]
    weights, better = " or ".join(tried), ", ".join(tried[:-1]) + " and " + tried[-1]
    pooled = [(n, pooled_share(summaries, n)) for n in counts]
    risk = risk_count(summaries)
    lines = [ASSEMBLED[0], "",
             f"The default that chooses the weight (the guard keeps the run at {weights}), at "
             f"{', '.join(counts)} labelled trees, assembled per seed and tree count from the runs at each "
             f"weight by `{command}`; the frontier, seeds and picks are those of the table of the fixed "
             f"weight {tried[0]} (below):", "",
             *TABLE_HEAD]
    for summary in summaries:
        lines += taste_rows(summary)
    lines += ["", "Over every taste and seed, each run's share of its own frontier: " + "; ".join(
        pooled_words(n, e) for n, e in pooled if e["n"] > 1) + f". Runs past the limit: **{risk['past']} of "
        f"{risk['runs']}**."]
    n = ABLATION_TREES
    if all(n in s["by_trees"] for s in summaries):
        lines += ["", f"Where the rest goes at {n} trees (each column as in the fixed weight's table "
                      f"below); the oracle at the method's weights takes, per seed, the better of {better}, "
                      "as the guard may:", "",
                  *decomposition_lines([decomposition(s, n) for s in summaries])]
    return "\n".join([*lines, "", ASSEMBLED[1]])
