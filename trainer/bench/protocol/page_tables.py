"""The page's tables of figures: the learning-rate sweep, the recipes side by side, each term of a
reward mix, the like-for-like pairs (and under each clip treatment, with the plots), and the paper's
parts switched off one at a time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..common.stats import Comparison
from .arms import LIKE_FOR_LIKE, TREE
from .claims import BUDGETS, CLAIM_ABLATIONS, Test, clock_label
from .page_cells import TEST_HEADER, TEST_RULE, comparison_cells
from .results import ProtocolResult


def _num(value: float, spec: str) -> str:
    """``value`` formatted, or "n/a" where no seed measured it."""
    return "n/a" if math.isnan(value) else format(value, spec)


def sweep_table(result: ProtocolResult) -> list[str]:
    """Each main arm's swept rates with their validation rewards, and whether the chosen one is inside."""
    lines = ["| arm | rates swept: validation reward (chosen in bold) | chosen | inside the swept range |",
             "|---|---|---|---|"]
    for arm, g in result.grid.items():
        rows = sorted((r for r in result.sweep if r["arm"] == arm), key=lambda r: r["lr"])
        cells = ", ".join(f"**{r['lr']:g}: {r['validation_reward']:.4f}**" if r["lr"] == g["chosen"]
                          else f"{r['lr']:g}: {r['validation_reward']:.4f}" for r in rows)
        inside = "yes" if g["inside"] else "**no: the extension limit was hit**"
        lines.append(f"| {arm} | {cells} | {g['chosen']:g} | {inside} |")
    return lines


def recipes_table(result: ProtocolResult, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The main arms as published side by side: cost, reward at both budgets and times to target."""
    c = clock_label(result.clock)
    main = [r for r in rows if r["role"] == "main" and r["treatment"] == "published"]
    converged = bool(main) and "samples_to_convergence" in main[0]
    targets = [("target", "target")] if not converged else [
        ("target", "the first gain"), ("convergence", "convergence")]
    header = "".join(f" images to {name} | {c} seconds to {name} |" for _, name in targets)
    lines = ["## The recipes side by side (as published)", "",
             f"| arm | tail | lr | forwards / image | median iteration ({c} s) | clip fraction | reward at "
             f"equal images | reward at equal seconds (iterations) |{header}",
             "|---|---|---|---|---|---|---|---|" + "---|---|" * len(targets)]
    for r in main:
        n = len(r["seeds"])
        capped = "" if r["equal_seconds_budget_reached"] else ", capped"
        times = "".join(f" {_num(r[f'samples_to_{key}'], '.0f')} ({r[f'samples_to_{key}_reached']}/{n}) | "
                        f"{_num(r[f'seconds_to_{key}'], '.3g')} ({r[f'seconds_to_{key}_reached']}/{n}) |"
                        for key, _ in targets)
        lines.append(
            f"| {r['arm']} | {r['tail']} | {r['lr']:g} | {r['rollout_nfe_per_image']:.2f} | "
            f"{r['median_iteration_s']:.2f} | {r['clip_frac_mean']:.3f} | {r['final_eval_reward_mean']:.4f} "
            f"± {r['final_eval_reward_ci95']:.4f} | {r['equal_seconds_reward_mean']:.4f} ± "
            f"{r['equal_seconds_reward_ci95']:.4f} ({r['iterations_equal_seconds']:.0f}{capped}) |{times}")
    base = sum(r["base_eval_reward"] for r in main) / max(1, len(main))
    reached = ("\"to the first gain\" and \"to convergence\": to the targets below (the first gain, "
               f"{main[0]['target_gain']:+.4f}; convergence, {main[0]['convergence_gain']:+.4f})"
               if converged else "\"to target\"")
    note = (f"Held-out (test) reward before training: {base:.4f}. {reached}: restricted mean over "
            "seeds (censored at the budget) and (seeds that reached the target). \"clip fraction\": the "
            "share of ratios outside their clip bounds, mean over iterations. Every arm is measured on its "
            "live weights.")
    averaged = [r for r in main if r.get("final_eval_reward_ema_mean") is not None]
    if averaged:
        note += (" Recipes that publish an evaluation with an average of the weights (EMA), at equal "
                 "images: " + "; ".join(f"{r['arm']} {r['final_eval_reward_ema_mean']:.4f} (live "
                                        f"{r['final_eval_reward_mean']:.4f}){_unmoved(result, r['arm'])}"
                                        for r in averaged) + ".")
    lines += ["", note, ""]
    return lines


def _unmoved(result: ProtocolResult, arm: str) -> str:
    """A remark when an arm's average still holds the starting weights on every seed (its reward is then
    the one before training, bit for bit): its schedule had not averaged yet within the image budget."""
    runs = result.runs_of(arm, "published")
    averages = [next((p["reward_ema"] for p in reversed(r.points) if "reward_ema" in p), None) for r in runs]
    if not runs or any(a != r.points[0]["reward"] for a, r in zip(averages, runs, strict=True)):
        return ""
    return (", the reward before training on every seed: its schedule had not averaged yet, so the average "
            "is the starting weights (docs/algorithm.md, Baselines)")


def terms_table(result: ProtocolResult) -> list[str]:
    """With a reward mix: each term's held-out mean before training and at both budgets, per main arm,
    so a gain won at one term's expense shows (at equal seconds a cheap iteration trains longer)."""
    first = result.runs[0].points[0] if result.runs else {}
    terms = sorted(k for k in first if k.startswith("reward_") and k != "reward_ema")
    if not terms:
        return []
    names = [t.removeprefix("reward_") for t in terms]
    lines = ["### Each term of the reward (as published)", "",
             "| arm | " + " | ".join(f"{n}: before | at equal images | at equal seconds" for n in names)
             + " |", "|---|" + "---|---|---|" * len(names)]
    for arm in (a for a in result.arms if a.role == "main"):
        runs = result.runs_of(arm.name, "published")
        if not runs:
            continue
        cells = []
        for term in terms:
            before = sum(r.points[0][term] for r in runs) / len(runs)
            cells.append(f"{before:.4f}")
            for marks in ("image_marks", "second_marks"):
                after = sum(r.points[getattr(r, marks)[-1]][term] for r in runs) / len(runs)
                cells.append(f"{after:.4f} ({after - before:+.4f})")
        lines.append(f"| {arm.name} | " + " | ".join(cells) + " |")
    return [*lines, "", "Means over seeds; the `function` term is the taste. A recipe that raises the "
            "mixed reward while the scene term falls is trading prompt-following for the taste.", ""]


def pairs_tables(result: ProtocolResult, tests: dict[str, Test], rows: Sequence[dict[str, Any]],
                 image_dir: str) -> list[str]:
    """The like-for-like pairs (same tail) as published and under each clip treatment, then the two
    plots (``image_dir``: where they lie, relative to the page)."""
    by = {r["arm"]: r for r in rows if r["treatment"] == "published"}
    lines = ["### Like for like (secondary family)", "",
             f"| pair (same tail) | forwards / image | iteration time | budget | {TEST_HEADER} |",
             f"|---|---|---|---|{TEST_RULE}|"]
    for tree, base in LIKE_FOR_LIKE:
        if tree not in by or base not in by:
            continue
        nfe = by[tree]["rollout_nfe_per_image"] / by[base]["rollout_nfe_per_image"]
        speed = by[tree]["median_iteration_s"] / by[base]["median_iteration_s"]
        for axis, label in BUDGETS:
            t = tests.get(f"reward:{axis}:{tree}:{base}:published")
            if t is not None:
                lines.append(f"| {tree} vs {base} | {nfe:.2f}x | {speed:.2f}x | {label} | "
                             f"{comparison_cells(t)} |")
    lines.append("")
    if result.treatments:
        lines += ["### The like-for-like pairs under each clip treatment (secondary family)", "",
                  f"| pair | treatment | budget | {TEST_HEADER} |", f"|---|---|---|{TEST_RULE}|"]
        for a, b in LIKE_FOR_LIKE:
            for record in result.treatments:
                for axis, label in BUDGETS:
                    t = tests.get(f"reward:{axis}:{a}:{b}:{record['name']}")
                    if t is not None:
                        lines.append(f"| {a} vs {b} | {record['name']} | {label} | {comparison_cells(t)} |")
        lines.append("")
        for record in result.treatments:
            status = "; ".join(f"{arm} {s}" for arm, s in record["arms"].items())
            status = status or "no like-for-like arm ran"
            lines.append(f"- `{record['name']}` ({record['description']}): {status}.")
        lines += ["", "The same pairs as published are the like-for-like rows above.", ""]
    lines += [f"![held-out reward against scored images]({image_dir}/protocol_reward_vs_images.png)", "",
              f"![held-out reward against training seconds]({image_dir}/protocol_reward_vs_seconds.png)", ""]
    return lines


def ablations_table(result: ProtocolResult, tests: dict[str, Test],
                    rows: Sequence[dict[str, Any]]) -> list[str]:
    """The paper's dynamic parts switched off one at a time, each against the default tree."""
    by = {r["arm"]: r for r in rows if r["treatment"] == "published"}
    if TREE not in by or not any(a.role == "ablation" for a in result.arms):
        return []
    lines = ["## The paper's dynamic parts, one at a time (against the default tree)", "",
             "| part | variant | overrides | reward at equal images | budget | variant minus default (95% "
             "CI) | seeds | p, t test | p, exact | Holm p, t test | Holm p, exact | verdict (the default is "
             "better) | family |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
             f"| (default) | {TREE} | | {by[TREE]['final_eval_reward_mean']:.4f} ± "
             f"{by[TREE]['final_eval_reward_ci95']:.4f} | | | | | | | | | |"]
    in_claims = {off for _, on, off in CLAIM_ABLATIONS if on == TREE}
    for arm in result.arms:
        if arm.role != "ablation" or arm.name not in by:
            continue
        r = by[arm.name]
        for axis, label in BUDGETS:
            if arm.name in in_claims:  # the claim's test, default minus variant: read with the sign flipped
                t = tests.get(f"reward:{axis}:{TREE}:{arm.name}:published")
                note = "ablation claims (the claim's test, read the other way round)"
                cells = None if t is None else comparison_cells(_flipped(t))
            else:
                t = tests.get(f"reward:{axis}:{arm.name}:{TREE}:published")
                note, cells = "secondary", None if t is None else comparison_cells(t)
            if cells is not None:
                lines.append(f"| {arm.knob} | {arm.name} | `{' '.join(arm.overrides)}` | "
                             f"{r['final_eval_reward_mean']:.4f} ± {r['final_eval_reward_ci95']:.4f} | "
                             f"{label} | {cells} | {note} |")
    return [*lines, ""]


def _flipped(t: Test) -> Test:
    """``t`` read the other way round (``b - a``): the same test, p-values and verdict."""
    c = t.comparison
    if c is None:
        return t
    flipped = Comparison(-c.difference, -c.high, -c.low, c.p_value, c.n, c.p_exact)
    return replace(t, comparison=flipped, higher_is_better=not t.higher_is_better)
