"""The protocol's figures: ``bench.json``, the two plots, docs/results-protocol.md, the short verdict
blocks (README.md's, the short results page's) and the console summary.

Everything here is computed from a :class:`~.results.ProtocolResult` (``protocol.json``) alone,
so the report can be rebuilt without training again (``treerpo bench report``).
"""

from __future__ import annotations

import io
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...utils.atomic import atomic_write_bytes, atomic_write_text
from ..common.stats import mean_ci95
from .claims import Test, all_tests, capped_times, clock_label, horizon, median_iteration_s
from .claims_block import PROTOCOL_PAGE, link_to, page_with_block, readme_claims
from .page import markdown, with_hand_written
from .results import FORMAT, ProtocolResult, Run
from .survival import reached, restricted_mean


def time_summary(result: ProtocolResult, runs: Sequence[Run], axis: str) -> dict[str, Any]:
    """Time to target on ``axis``: the restricted mean (area under the Kaplan-Meier curve up to the
    budget) and how many seeds reached the target within it."""
    if not result.target["usable"]:
        return {"restricted_mean": math.nan, "reached": 0, "seeds": len(runs)}
    gain = result.target["gain"]
    limit = horizon(result, axis)
    events = reached([r.time_to(gain, axis, result.clock) for r in runs], limit)  # within the budget
    times = capped_times(result, runs, axis)
    return {"restricted_mean": restricted_mean(times, events, limit), "reached": sum(events),
            "seeds": len(runs), "per_seed": times}


def checkpoint_curve(result: ProtocolResult, runs: Sequence[Run], axis: str) -> dict[str, list[float]]:
    """Mean spent (images or seconds) and mean reward with its 95% half-width at the base and at each
    checkpoint of ``axis``, over seeds."""
    key = "images" if axis == "images" else f"{result.clock}_s"
    xs, ys, bands = [0.0], [], []
    rewards = [[r.base for r in runs]]
    for k in range(result.budget.checkpoints):
        xs.append(statistics.fmean(r.points[r.marks(axis)[k]][key] for r in runs))
        rewards.append([r.reward_at(axis, k) for r in runs])
    for values in rewards:
        e = mean_ci95(values)
        ys.append(e.mean)
        bands.append(e.ci95)
    return {"x": xs, "reward": ys, "ci95": bands}


def _times_to(result: ProtocolResult, runs: list, name: str) -> dict[str, Any]:
    """The ``bench.json`` fields of the runs' times to ``result``'s target, named after ``name``
    (``target``: the first gain; ``convergence``: the convergence target)."""
    images, seconds = time_summary(result, runs, "images"), time_summary(result, runs, "seconds")
    return {f"{name}_gain": result.target["gain"],
            f"samples_to_{name}": images["restricted_mean"],
            f"samples_to_{name}_reached": images["reached"],
            f"seconds_to_{name}": seconds["restricted_mean"],
            f"seconds_to_{name}_reached": seconds["reached"]}


def summary_rows(result: ProtocolResult) -> list[dict[str, Any]]:
    """One ``bench.json`` row per arm and treatment that ran."""
    rows = []
    converged = result.at_convergence()
    treatments = ["published", *(t["name"] for t in result.treatments)]
    for treatment in treatments:
        for arm in result.arms:
            rs = result.runs_of(arm.name, treatment)
            trained = treatment == "published" or result.treatment_status(treatment, arm.name) == "trained"
            if not rs or not trained:
                continue
            images, seconds = mean_ci95([r.at_images for r in rs]), mean_ci95([r.at_seconds for r in rs])
            rows.append({
                "arm": arm.name, "treatment": treatment, "strategy": arm.strategy, "tail": arm.tail,
                "role": arm.role, "knob": arm.knob, "overrides": list(arm.overrides),
                "lr": result.lrs[arm.name],
                "seeds": [r.seed for r in rs], "base_eval_reward": statistics.fmean(r.base for r in rs),
                "final_eval_reward_mean": images.mean, "final_eval_reward_ci95": images.ci95,
                "final_eval_reward_per_seed": [r.at_images for r in rs],
                "final_eval_reward_ema_mean": (statistics.fmean(r.ema_at_images for r in rs)
                                               if all(r.ema_at_images is not None for r in rs) else None),
                "equal_seconds_reward_mean": seconds.mean, "equal_seconds_reward_ci95": seconds.ci95,
                "equal_seconds_reward_per_seed": [r.at_seconds for r in rs],
                "equal_seconds_budget_reached": all(r.seconds_reached for r in rs),
                **_times_to(result, rs, "target"),
                **(_times_to(converged, rs, "convergence") if converged is not None else {}),
                "rollout_nfe_per_image": statistics.fmean(
                    sum(r.rollout_nfe) / (len(r.rollout_nfe) * r.images_per_iteration) for r in rs),
                "median_iteration_s": statistics.fmean(median_iteration_s(r, result.clock) for r in rs),
                "median_iteration_wall_s": statistics.fmean(median_iteration_s(r, "wall") for r in rs),
                "median_iteration_cpu_s": statistics.fmean(median_iteration_s(r, "cpu") for r in rs),
                "clip_frac_mean": statistics.fmean(statistics.fmean(r.clip_frac or [0.0]) for r in rs),
                "iterations_equal_images": int(rs[0].points[rs[0].image_marks[-1]]["iteration"]),
                "iterations_equal_seconds": statistics.fmean(
                    r.points[r.second_marks[-1]]["iteration"] for r in rs),
                "evaluations": statistics.fmean(len(r.points) for r in rs),
                "images_curve": checkpoint_curve(result, rs, "images"),
                "seconds_curve": checkpoint_curve(result, rs, "seconds"),
            })
    return rows


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def test_row(t: Test) -> dict[str, Any]:
    """One test for ``bench.json``: its figures and raw p-values, and (a family's row) the Holm ones,
    the verdict and, for a claim against several comparators, each comparison (raw only)."""
    c = t.comparison
    row: dict[str, Any] = {
        "family": t.family, "group": t.group, "key": t.key, "measure": t.measure,
        "difference": None if c is None else c.difference, "ci95_low": None if c is None else c.low,
        "ci95_high": None if c is None else c.high, "seeds": t.seeds,
        "p_value": _number(t.p_value), "p_exact": _number(t.p_exact)}
    if t.against:
        row["against"] = t.against
    if t.union is not None:
        row["intersection_union"] = {"for_claim": t.union.for_claim, "comparisons": t.union.size}
    if t.components:
        row["components"] = [test_row(part) for part in t.components]
    return row


def test_rows(tests: Sequence[Test]) -> list[dict[str, Any]]:
    """``bench.json``'s tests: every comparison with the raw and Holm-adjusted p-values of its t test
    (``p_value``, ``p_holm``) and of its exact sign-flip test (``p_exact``, ``p_holm_exact``), and its
    verdict (``descriptive``: why it is read as no verdict); a claim against several comparators has
    their intersection-union p-values and lists each comparison under ``components``."""
    return [{**test_row(t), "p_holm": _number(t.p_adjusted), "p_holm_exact": _number(t.p_exact_adjusted),
             "verdict": t.verdict, "note": t.note, "descriptive": t.descriptive} for t in tests]


def plot(result: ProtocolResult, axis: str, out_png: Path, roles: tuple[str, ...] = ("main",)) -> None:
    """Held-out reward against scored images or training seconds at the fixed checkpoints: the mean
    over seeds and its 95% band, one line per arm (as published)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for arm in result.arms:
        runs = result.runs_of(arm.name)
        if arm.role not in roles or not runs:
            continue
        curve = checkpoint_curve(result, runs, axis)
        line, = ax.plot(curve["x"], curve["reward"], marker="o", ms=3, lw=2.2 if arm.is_tree else 1.2,
                        ls="-" if arm.is_tree else "--", label=arm.name)
        half = [b if math.isfinite(b) else 0.0 for b in curve["ci95"]]
        low = [y - h for y, h in zip(curve["reward"], half, strict=True)]
        high = [y + h for y, h in zip(curve["reward"], half, strict=True)]
        ax.fill_between(curve["x"], low, high, color=line.get_color(), alpha=0.12, lw=0)
    ax.axvline(horizon(result, axis), color="0.5", ls=":", lw=1.0, label="budget")
    what = f"training {clock_label(result.clock)} seconds" if axis == "seconds" else "scored images"
    ax.set_xlabel(f"{what} (measured at the {result.budget.checkpoints} fixed checkpoints)")
    ax.set_ylabel(f"held-out reward (mean and 95% band, {result.budget.seeds} seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(out_png, buf.getvalue())


def with_claims_block(page: Path, result: ProtocolResult, tests: Sequence[Test], docs: Path | None,
                      option: str) -> str:
    """``page``'s text with its verdict block rewritten, linking to the protocol's page (``docs``, else
    docs/results-protocol.md) relative to ``page``; refused in one line naming ``page`` when it has no
    markers."""
    link = link_to(docs if docs is not None else Path(PROTOCOL_PAGE), page)
    return page_with_block(page, readme_claims(result, tests, link, option))


def write_report(result: ProtocolResult, out: Path, docs: Path | None = None, readme: Path | None = None,
                 summary: Path | None = None) -> dict[str, Any]:
    """``bench.json``, the two plots and ``results.md`` under ``out`` (and ``docs`` with its images in
    ``images/`` beside it when given; the verdict block between the markers of ``readme`` and of
    ``summary``, the short results page); returns what ``bench.json`` holds. A page keeps what is
    written by hand below its marker (:data:`.page.HAND_WRITTEN`)."""
    tests = all_tests(result)
    # made first: a page without the block's markers stops the report before any file is written
    blocks = [(page, with_claims_block(page, result, tests, docs, option))
              for page, option in ((readme, "--readme"), (summary, "--summary")) if page is not None]
    data = {"format": FORMAT, "arms": summary_rows(result), "tests": test_rows(tests)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench.json", json.dumps(data, indent=2) + "\n")
    targets = [(out, ".", out / "results.md")]
    if docs is not None:
        targets.append((docs.parent / "images", "images", docs))
    for folder, image_dir, page in targets:
        folder.mkdir(parents=True, exist_ok=True)
        plot(result, "images", folder / "protocol_reward_vs_images.png")
        plot(result, "seconds", folder / "protocol_reward_vs_seconds.png")
        old = page.read_text(encoding="utf-8") if page.exists() else None
        atomic_write_text(page, with_hand_written(markdown(result, tests, data["arms"], image_dir), old))
    for page, text in blocks:
        atomic_write_text(page, text)
    return data


def format_summary(data: dict[str, Any]) -> str:
    """The console table and the claims."""
    head = f"{'arm':<26}{'lr':>8}{'nfe/img':>9}{'iter s':>8}{'equal images':>20}{'equal seconds':>20}"
    lines = [head]
    for r in data["arms"]:
        if r["treatment"] != "published":
            continue
        lines.append(f"{r['arm']:<26}{r['lr']:>8g}{r['rollout_nfe_per_image']:>9.2f}"
                     f"{r['median_iteration_s']:>8.2f}{r['final_eval_reward_mean']:>11.4f} ± "
                     f"{r['final_eval_reward_ci95']:.4f}{r['equal_seconds_reward_mean']:>11.4f} ± "
                     f"{r['equal_seconds_reward_ci95']:.4f}")
    lines.append("")
    for t in data["tests"]:
        if t["family"] in ("primary", "ablation"):
            p = ("" if t["p_holm"] is None else
                 f", Holm p = {t['p_holm']:.3g} (t test), {t['p_holm_exact']:.3g} (exact sign-flip)")
            verdict = "no verdict (a measurement)" if t["verdict"] == "descriptive" else t["verdict"]
            seeds = "" if t["seeds"] is None else f", {t['seeds']} seeds"
            lines.append(f"{t['group']}: {verdict} ({t['measure']}{seeds}{p})")
    return "\n".join(lines)
