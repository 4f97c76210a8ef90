"""Sections of docs/results-taste.md beside the table of the named tastes: the generated family's
distribution of shares (``--section family``), the template as it opens (``--section template``), and two
tables the main section adds when its runs hold the figures: what each run cost, and where a run's gain
went (what the reward led training to, against what the guard's choice kept).

Why apart from ``page.py``: these read figures only runs since 0.6 store (costs, every point measured), and
the family is summarised as a distribution over tastes rather than taste by taste.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from .ablation import ablation_rows, arm_lines, pooled_share, risk_count, stated_risk
from .page_parts import as_loop, calibration_words, code_line, marks, run_commands, with_ci, with_space

FAMILY_SECTION = "family"
TEMPLATE_SECTION = "template"
FAMILY_TARGETS = {"median": 0.75, "10th percentile": 0.40}
"""The issue's targets for the generated family at 50 labelled trees."""
BOOTSTRAP = 4000


def taste_share(summary: dict[str, Any], n: str) -> float:
    """A taste's share of its frontier at ``n`` trees, from its mean gains over seeds."""
    return summary["by_trees"][n]["share_of_frontier"]


def distribution(shares: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """The median, the 10th percentile (linear interpolation) and the worst of the tastes' shares, each with
    a 95% percentile-bootstrap interval over tastes (resampled with replacement, a fixed seed)."""
    values = np.asarray([s for s in shares if math.isfinite(s)], dtype=float)
    rng = np.random.default_rng(seed)
    draws = values[rng.integers(0, len(values), size=(BOOTSTRAP, len(values)))]
    out = {}
    def tenth(x: np.ndarray, axis: int | None = None) -> np.ndarray:
        return np.percentile(x, 10, axis=axis)

    for name, fn in (("median", np.median), ("10th percentile", tenth), ("worst", np.min)):
        boot = fn(draws, axis=1)
        out[name] = {"value": float(fn(values)), "low": float(np.percentile(boot, 2.5)),
                     "high": float(np.percentile(boot, 97.5))}
    return out


def _reading(value: float, low: float, high: float, target: float) -> str:
    if low >= target:
        return "met"
    if high < target:
        return "not met"
    return "met on the estimate" if value >= target else "short on the estimate"


def seeds_words(k: int) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{k} seed" + ("" if k == 1 else "s")


def risk_words(stated: dict[str, float]) -> str:
    """What the node's stated risk expects of the runs past the limit, and the chance of as many if it
    were right: of the true falls, and of falls measured on the test pairs (their own noise added)."""
    return (f", where the risk the node states expected {stated['expected']:.1f} (the chance of "
            f"{stated['past']} or more if it were right: {stated['p_at_least']:.2g}); counting the test "
            f"pairs' own measurement noise, {stated['expected_on_test']:.1f} (chance "
            f"{stated['p_at_least_on_test']:.2g})")


def family_rows(summaries: Sequence[dict[str, Any]], n: str, describe: Any) -> list[str]:
    rows = []
    for s in summaries:
        row = s["by_trees"][n]
        rows.append(f"| {s['taste']} | {describe(s['taste'])} | {with_ci(row['frontier_gain'])} | "
                    f"{with_ci(row['taste_gain'])} | {row['share_of_frontier']:.0%} | "
                    f"{with_ci(row['guard_change'])} | "
                    f"{row['past_limit']['runs']} of {row['past_limit']['of']} |")
    return rows


def arms_lines(summaries: Sequence[dict[str, Any]], arms: dict[str, list[dict[str, Any]]], n: str
               ) -> list[str]:
    """Below a section's summary: each ``--arm`` (the same tastes, seeds, picks and frontier under another
    method) paired per run with these runs, with the images each run scored; nothing without arms."""
    if not arms:
        return []
    return ["", "The same picks and frontier under another method (`--arm`), paired per run with the runs "
                "above: the difference of the shares with its 95% t interval and exact sign-flip p (a "
                "difference whose interval holds 0 is inconclusive).", "",
            *arm_lines(ablation_rows(summaries, arms, n), n)]


def made_by(summaries: Sequence[dict[str, Any]], command: str, arms: dict[str, list[dict[str, Any]]]
            ) -> list[str]:
    """The commands block and the code line of a section: each arm's runs first (an arm of a weight study
    is the run whose frontier these runs borrow), then these runs and the report; the code line covers
    the arms too, so a section that mixes code versions says so."""
    arm_runs = [list(dict.fromkeys(s["command"] for s in arm if s.get("command"))) for arm in arms.values()]
    every = [*summaries, *(s for arm in arms.values() for s in arm)]
    return ["```bash", *(line for runs in arm_runs for line in as_loop(runs)),
            *run_commands(summaries, command), "```", "", code_line(every)]


def family_markdown(summaries: Sequence[dict[str, Any]], command: str,
                    named: Sequence[dict[str, Any]] = (),
                    arms: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The family's section: what was run, every taste's row, the distribution against its targets, the
    runs past the limit, and the named tastes' shares beside it (``named``: the main table's runs)."""
    from .family import FAMILY, FAMILY_SEED, describe

    n = list(summaries[0]["by_trees"])[-1]
    b = summaries[0]["budget"]
    dist = distribution([taste_share(s, n) for s in summaries])
    pooled = pooled_share(summaries, n)
    risk, stated = risk_count(summaries), stated_risk(summaries)
    begin, end = marks(FAMILY_SECTION)
    lines = [begin, "## Tastes nobody chose: the generated family", "",
             "Generated by (each taste's run, then the report):", "",
             *made_by(summaries, command, arms or {}), "",
             f"{len(summaries)} hidden tastes drawn by `trainer/bench/taste/family.py` (seed {FAMILY_SEED}): "
             "a liking for one statistic near a drawn value, a random direction in three statistics, a mix "
             "of two named tastes (some reversed, some against the prompt), or the product of two; the "
             "statistics are ones the personal reward does not compute (symmetry, edges, counts, "
             "compactness, colour variety, saturation, background, texture, scatter, closeness to a drawn "
             f"point or hue, the share in a drawn box). {seeds_words(len(summaries[0]['seeds']))} per taste, "
             f"{n} labelled trees, the method as in the main table; the oracle frontier trains the hidden "
             "taste at " + ", ".join(f"{w:g}" for w in b["frontier_weights"])
             + (" and steered by the guard" if b.get("frontier_steer") else "") + ".", "",
             "| taste | what it likes | oracle frontier | taste gain | share of the frontier | "
             "prompt-following change | runs past the limit |", "|---|---|---|---|---|---|---|",
             *family_rows(summaries, n, describe), ""]
    parts = []
    whole = len(summaries) >= len(FAMILY)
    for name, target in FAMILY_TARGETS.items():
        d = dist[name]
        word = (_reading(d["value"], d["low"], d["high"], target) if whole
                else f"no verdict on {len(summaries)} of the family's {len(FAMILY)} tastes")
        parts.append(f"{name} {d['value']:.0%} ({d['low']:.0%} to {d['high']:.0%}): target {target:.0%} "
                     f"**{word}**")
    worst = dist["worst"]
    lines.append(f"The tastes' shares at {n} trees (each taste's from its mean gains; in brackets a 95% "
                 "bootstrap interval over tastes): " + "; ".join(parts)
                 + f"; worst {worst['value']:.0%}. Every run pooled: {pooled['mean']:.0%} "
                 f"({pooled['mean'] - pooled['ci95']:.0%} to {pooled['mean'] + pooled['ci95']:.0%}, "
                 f"{pooled['n']} runs). Runs whose held-out fall went past the limit: {risk['past']} of "
                 f"{risk['runs']}" + (risk_words(stated) if stated["runs"] else "") + "."
                 + with_space(calibration_words(stated["calibration"])))
    if named:
        shares = [taste_share(s, n) for s in named if n in s["by_trees"]]
        if shares:
            lines += ["", f"Beside them, the five named tastes at {n} trees: median "
                          f"{statistics.median(shares):.0%}, lowest {min(shares):.0%} (the main table)."]
    lines += arms_lines(summaries, arms or {}, n)
    lines.append(end)
    return "\n".join(lines)


def cost_rows(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """What each tree count's run cost on average: seconds (the guard's measurements among them), images."""
    rows = []
    for s in summaries:
        for n, row in s["by_trees"].items():
            c = row.get("costs")
            if c:
                guard = c.get("guard_seconds", math.nan)
                rows.append(f"| {s['taste']} | {n} | {c['seconds']:.0f} | {guard:.0f} | "
                            f"{c['training_images']:.0f} | {c['guard_images']:.0f} |")
    return rows


def where_it_ran(summaries: Sequence[dict[str, Any]]) -> str:
    """Where the seconds were spent, from the runs' own thread setting: a run limited to one thread was
    run beside others (the benchmark's way of using every core), so its seconds are not one person's
    wait; ``bench taste-cost`` times the default alone."""
    threads = {e.partition("=")[2].strip() for s in summaries for e in s.get("extra", [])
               if e.partition("=")[0].strip() == "threads"}
    if threads == {"1"}:
        return ("on one CPU thread each, with other runs beside it on the machine (`bench taste-cost` "
                "times a run alone)")
    return "on this machine's CPU cores"


def split_rows(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """Where the gain went, per tree count measured at every point: the frontier, what the run offered at
    its best test point within the limit, what the choice kept, and taste per unit of fall."""
    rows = []
    for s in summaries:
        for n, row in s["by_trees"].items():
            sp = row.get("split")
            if not sp:
                continue
            rate = ("n/a" if not sp.get("method_rate") else
                    f"{sp['method_rate']['mean']:.1f} / {sp['oracle_rate']['mean']:.1f}")
            rows.append(f"| {s['taste']} | {n} | {row['frontier_gain']['mean']:+.3f} | "
                        f"{sp['offered']['mean']:+.3f} ({sp['offered_share']:.0%}) | "
                        f"{sp['chosen']['mean']:+.3f} ({sp['chosen_share']:.0%}) | "
                        f"{1 - sp['offered_share']:.0%} | {sp['offered_share'] - sp['chosen_share']:.0%} | "
                        f"{rate} |")
    return rows


def extra_tables(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """The cost and split tables, for the runs that hold their figures."""
    lines: list[str] = []
    costs = cost_rows(summaries)
    if costs:
        lines += ["", f"What each run cost {where_it_ran(summaries)} (means over seeds; a benchmark's own "
                      "test measurements are not counted): wall seconds, of them the guard's measurements on "
                      "the validation pairs, and the images training and the guard drew.", "",
                  "| taste | labelled trees | seconds | the guard's seconds | training images | "
                  "guard images |",
                  "|---|---|---|---|---|---|", *costs]
    split = split_rows(summaries)
    if split:
        lines += ["", "Where the gain went (every checkpoint and strength of each run also measured on the "
                      "test pairs): what the run offered at its best test point within the limit (what the "
                      "personal reward led training to), what the guard's choice on the validation pairs "
                      "kept, the frontier's share each lost, and the taste gained per unit of "
                      "prompt-following lost along the run against along the frontier's best run (the "
                      "slope through the origin of gain against fall on the test pairs; a reward that leads "
                      "training where the taste lies gains more for the same fall).", "",
                  "| taste | labelled trees | frontier | offered by the run | kept by the choice | lost to "
                  "the reward | lost to the choice | taste per unit fall: run / frontier |",
                  "|---|---|---|---|---|---|---|---|", *split]
    return lines


def template_rows(summaries: Sequence[dict[str, Any]], against: dict[str, dict[str, Any]]) -> list[str]:
    """One row per taste: the shipped template's gain and share (its own frontier), its prompt-following
    change and cost, and 0.5.0's template budget on the same picks (``against``: its runs by taste)."""
    rows = []
    for s in summaries:
        n = list(s["by_trees"])[-1]
        row = s["by_trees"][n]
        seconds = row.get("costs", {}).get("seconds", math.nan)
        old = against.get(s["taste"], {}).get("by_trees", {}).get(n)
        then = "not run" if old is None else (
            f"{with_ci(old['taste_gain'])}, {old['share_of_frontier']:.0%} of its own frontier "
            f"{old['frontier_gain']['mean']:+.3f}, {old.get('costs', {}).get('seconds', math.nan):.0f} s")
        rows.append(f"| {s['taste']} | {with_ci(row['frontier_gain'])} | {with_ci(row['taste_gain'])} | "
                    f"{row['share_of_frontier']:.0%} | {with_ci(row['guard_change'])} | "
                    f"{row['past_limit']['runs']} of {row['past_limit']['of']} | {seconds:.0f} |"
                    + (f" {then} |" if against else ""))
    return rows


def picks_weight_words(budget: dict[str, Any]) -> str:
    """'0.3' for one fixed weight; '0.3 and 0.5 (one training each, the guard keeping one)' for several."""
    weights = [f"{w:g}" for w in (budget.get("picks_weights") or [budget["picks_weight"]])]
    if len(weights) == 1:
        return weights[0]
    return f"{', '.join(weights[:-1])} and {weights[-1]} (one training each, the guard keeping one)"


def template_markdown(summaries: Sequence[dict[str, Any]], command: str,
                      against: Sequence[dict[str, Any]] = (),
                      arms: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The template row: what a person who opens the template, picks every tree and presses run gets,
    against the oracle frontier of the same budget, beside 0.5.0's template budget (``against``)."""
    b = summaries[0]["budget"]
    n = list(summaries[0]["by_trees"])[-1]
    pooled = pooled_share(summaries, n)
    risk, stated = risk_count(summaries), stated_risk(summaries)
    begin, end = marks(TEMPLATE_SECTION)
    old = {s["taste"]: s for s in against}
    lines = [begin, "## The template as it opens", "",
             "Generated by (each taste's run, then the report):", "",
             *made_by(summaries, command, arms or {}), "",
             f"The pick-and-train template's own trees ({n}: its 3 prompts, 4 trees each, its tree shape and "
             "seed widget set to the benchmark's seed), every one labelled by the simulated person, trained "
             f"as the node trains them ({b['iterations']} rounds of {b['prompts_per_iteration']} prompts at "
             f"learning rate {b['lr']:g}, picks weight " + picks_weight_words(b)
             + ", the guard at `closely` on the template's prompts at seeds training "
             "never draws) and measured on the template's prompts at other unseen seeds: a person judges "
             f"the images of their own prompts. {len(summaries[0]['seeds'])} seeds per taste; the frontier "
             "trains the hidden taste on the same prompts with the same budget. No target: what a person "
             "gets.", "",
             "| taste | oracle frontier | taste gain | share of the frontier | prompt-following change | "
             "runs past the limit | seconds |"
             + (" 0.5.0's template budget: gain, share, seconds |" if old else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if old else ""), *template_rows(summaries, old), "",
             f"Every taste and seed pooled: {pooled['mean']:.0%} of the frontier "
             f"({pooled['mean'] - pooled['ci95']:.0%} to {pooled['mean'] + pooled['ci95']:.0%}, "
             f"{pooled['n']} runs); runs past the limit: {risk['past']} of {risk['runs']}"
             + (risk_words(stated) if stated["runs"] else "") + "."
             + with_space(calibration_words(stated["calibration"])),
             *arms_lines(summaries, arms or {}, n), end]
    return "\n".join(lines)
