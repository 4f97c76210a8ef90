"""The protocol's tables, claims and plots: ``bench.json`` rows and docs/results.md.

Everything here is computed from a :class:`~.protocol.ProtocolResult` (``protocol.json``), so the
report can be rebuilt without training again (``treerpo bench report``).
"""

from __future__ import annotations

import io
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.atomic import atomic_write_bytes, atomic_write_text
from .protocol import LIKE_FOR_LIKE, TREE, ProtocolResult, Run
from .stats import Verdict, mean_ci95, ratio_verdict, verdict, welch

EFFICIENCY_AT_MOST = 0.6  # "about 50% training efficiency": iteration time at most ~0.5-0.6x


def _by_arm(runs: Sequence[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.arm, []).append(r)
    return out


def _target(result: ProtocolResult) -> tuple[str, float]:
    """The best baseline (by mean held-out reward at equal images) and that mean."""
    runs = _by_arm(result.runs)
    baselines = [a.name for a in result.arms if a.role == "main" and not a.is_tree and a.name in runs]
    if not baselines:
        raise ValueError("the protocol ran no baseline: there is no target")
    means = {b: statistics.fmean(r.at_images for r in runs[b]) for b in baselines}
    best = max(means, key=means.__getitem__)
    return best, means[best]


def _images_limit(result: ProtocolResult) -> float:
    return float(-(-result.budget.images // result.images_per_iteration) * result.images_per_iteration)


def summary_rows(result: ProtocolResult) -> list[dict[str, Any]]:
    """One ``bench.json`` row per arm (the fields of docs/results.md's tables)."""
    runs = _by_arm(result.runs)
    best, target = _target(result)
    rows = []
    for arm in result.arms:
        rs = runs.get(arm.name, [])
        if not rs:
            continue
        images = mean_ci95([r.at_images for r in rs])
        seconds = mean_ci95([r.at_seconds for r in rs])
        to_images = [r.first_reaching(target, "images", _images_limit(result)) for r in rs]
        to_seconds = [r.first_reaching(target, "seconds", result.seconds) for r in rs]
        rows.append({
            "arm": arm.name, "strategy": arm.strategy, "tail": arm.tail, "role": arm.role,
            "knob": arm.knob, "overrides": list(arm.overrides), "lr": result.lrs[arm.name],
            "seeds": [r.seed for r in rs],
            "base_eval_reward": statistics.fmean(r.points[0]["reward"] for r in rs),
            "final_eval_reward_mean": images.mean, "final_eval_reward_ci95": images.ci95,
            "final_eval_reward_per_seed": [r.at_images for r in rs],
            "equal_seconds_reward_mean": seconds.mean, "equal_seconds_reward_ci95": seconds.ci95,
            "equal_seconds_reward_per_seed": [r.at_seconds for r in rs],
            "equal_seconds_budget_reached": all(r.seconds_reached for r in rs),
            "target": target, "target_arm": best,
            "samples_to_target": statistics.fmean(to_images),
            "samples_to_target_reached": sum(r.reaching(target, "images", _images_limit(result))
                                             is not None for r in rs),
            "seconds_to_target": statistics.fmean(to_seconds),
            "seconds_to_target_reached": sum(r.reaching(target, "seconds", result.seconds) is not None
                                             for r in rs),
            "rollout_nfe_per_image": statistics.fmean(
                sum(r.rollout_nfe) / (len(r.rollout_nfe) * r.images_per_iteration) for r in rs),
            "median_iteration_s": statistics.fmean(statistics.median(r.iteration_s) for r in rs),
            "iterations_equal_images": int(_images_limit(result)) // result.images_per_iteration,
            "iterations_equal_seconds": statistics.fmean(
                next((p["iteration"] for p in r.points if p["seconds"] >= result.seconds),
                     r.points[-1]["iteration"]) for r in rs),
        })
    return rows


@dataclass(frozen=True)
class Claim:
    claim: str
    measure: str
    value: str
    verdict: Verdict


def _per_seed(runs: dict[str, list[Run]], arm: str, key: str) -> list[float]:
    return [getattr(r, key) for r in sorted(runs[arm], key=lambda r: r.seed)]


def _diff_text(c: Any, unit: str = "") -> str:
    return f"{c.difference:+.4g}{unit} (95% CI {c.low:+.4g} .. {c.high:+.4g}, Welch p = {c.p_value:.3g})"


def claims(result: ProtocolResult) -> list[Claim]:
    """The paper's abstract claims, each with its measure, interval and verdict on this test bed."""
    runs = _by_arm(result.runs)
    best, target = _target(result)
    out: list[Claim] = []
    limit = _images_limit(result)
    tree_images = [r.first_reaching(target, "images", limit) for r in runs[TREE]]
    base_images = [r.first_reaching(target, "images", limit) for r in runs[best]]
    c = welch(tree_images, base_images)
    out.append(Claim("faster convergence per sample",
                     f"scored images until the held-out reward reaches {target:.4f} (the best baseline, "
                     f"{best}, at equal images; censored at {limit:.0f}), {TREE} minus {best}",
                     _diff_text(c), verdict(c, higher_is_better=False)))
    tree_s = [r.first_reaching(target, "seconds", result.seconds) for r in runs[TREE]]
    base_s = [r.first_reaching(target, "seconds", result.seconds) for r in runs[best]]
    c = welch(tree_s, base_s)
    out.append(Claim("faster convergence per second",
                     f"training seconds until the reward reaches {target:.4f} (censored at "
                     f"{result.seconds:.0f} s), {TREE} minus {best}", _diff_text(c, " s"),
                     verdict(c, higher_is_better=False)))
    for key, budget in (("at_images", "equal images"), ("at_seconds", "equal seconds")):
        c = welch(_per_seed(runs, TREE, key), _per_seed(runs, best, key))
        out.append(Claim("higher final reward", f"held-out reward at {budget}, {TREE} minus {best}",
                         _diff_text(c), verdict(c)))
    for tree, base in LIKE_FOR_LIKE:
        if tree in runs and base in runs:
            ratios = [statistics.median(a.iteration_s) / statistics.median(b.iteration_s)
                      for a, b in zip(sorted(runs[tree], key=lambda r: r.seed),
                                      sorted(runs[base], key=lambda r: r.seed), strict=True)]
            est = mean_ci95(ratios)
            out.append(Claim("about 50% training efficiency",
                             f"median iteration time, {tree} / {base} (same tail); claim read as <= "
                             f"{EFFICIENCY_AT_MOST}x", f"{est}x", ratio_verdict(est, EFFICIENCY_AT_MOST)))
    for claim, on, off in (("LayerTuning-RL helps", TREE, "no LayerTuning"),
                           ("dynamic clipping helps (dynamic vs fixed bounds that bind)",
                            "capping dynamic clip", "capping fixed clip"),
                           ("dynamic clipping helps (the default clip vs none)", TREE, "no clip")):
        if on not in runs or off not in runs:
            continue
        for key, budget in (("at_images", "equal images"), ("at_seconds", "equal seconds")):
            c = welch(_per_seed(runs, on, key), _per_seed(runs, off, key))
            out.append(Claim(claim, f"held-out reward at {budget}, {on} minus {off}",
                             _diff_text(c), verdict(c)))
    return out


def ablation_rows(result: ProtocolResult) -> list[dict[str, Any]]:
    """Each ablation against the default tree: difference at equal images, interval, verdict."""
    runs = _by_arm(result.runs)
    rows = []
    for arm in result.arms:
        if arm.role != "ablation" or arm.name not in runs:
            continue
        c = welch(_per_seed(runs, arm.name, "at_images"), _per_seed(runs, TREE, "at_images"))
        rows.append({"knob": arm.knob, "arm": arm.name, "overrides": list(arm.overrides),
                     "reward": mean_ci95(_per_seed(runs, arm.name, "at_images")),
                     "vs_default": c, "verdict": verdict(c)})
    return rows


def _mean_curve(rs: Sequence[Run], x: str, limit: float) -> tuple[list[float], list[float]]:
    """Mean reward (and mean ``x``) at each evaluated iteration every seed reached within ``limit``."""
    common = set.intersection(*({p["iteration"] for p in r.points} for r in rs))
    xs, ys = [], []
    for it in sorted(common):
        pts = [next(p for p in r.points if p["iteration"] == it) for r in rs]
        mean_x = statistics.fmean(p[x] for p in pts)
        if mean_x <= limit * 1.05:
            xs.append(mean_x)
            ys.append(statistics.fmean(p["reward"] for p in pts))
    return xs, ys


def plot(result: ProtocolResult, x: str, out_png: Path, roles: tuple[str, ...] = ("main",)) -> None:
    """Mean held-out reward over seeds against scored images or training seconds, one line per arm
    (at the evaluations every seed made; the seconds curve ends with the equal-seconds measurement)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = _by_arm(result.runs)
    limit = _images_limit(result) if x == "images" else result.seconds
    fig = Figure(figsize=(8.0, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for arm in result.arms:
        if arm.role in roles and arm.name in runs:
            xs, ys = _mean_curve(runs[arm.name], x, limit)
            if x == "seconds":  # end at the budget, where each seed was measured on crossing it
                xs.append(result.seconds)
                ys.append(statistics.fmean(r.at_seconds for r in runs[arm.name]))
            ax.plot(xs, ys, marker="o", ms=3, lw=2.2 if arm.is_tree else 1.2,
                    ls="-" if arm.is_tree else "--", label=arm.name)
    ax.set_xlabel("scored images" if x == "images" else "training seconds")
    ax.set_ylabel(f"held-out reward (mean of {result.budget.seeds} seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(out_png, buf.getvalue())


SCOPE = (
    "## Scope",
    "",
    "- This is the embedded 1.85M-parameter model on CPU with the scene reward, not FLUX on GPUs. "
    "Forward counts are properties of the plans and carry over (`treerpo nfe`, README); seconds and "
    "rewards are this model's.",
    "- The budgets are small (a few thousand scored images per run): the embedded test bed gains about "
    "+0.002 to +0.004 held-out reward per thousand images (docs/algorithm.md), so differences between "
    "recipes of that order need more images or seeds than this page spends to leave \"inconclusive\".",
    "- Not measured here: the iteration time of each strategy at the paper's setting on FLUX-size "
    "weights, beside the paper's Table 1. It needs a GPU (`scripts/gpu_smoke.sh`); none was lent "
    "when this page was made.",
    "- Seconds are wall-clock training seconds of one process on a shared 2-core machine. Seeds are "
    "the outer loop, so a slow period hits the arms of one seed, not one arm; the per-seed iteration "
    "times are in `protocol.json`.",
    "- Each held-out measurement is 64 prompt/seed pairs; between two measurements of one run the "
    "reward moves by about ±0.01, the size of most differences here.",
    "- The sampler's own overhead and memory: [sampler.md](sampler.md).",
)


def markdown(result: ProtocolResult, image_dir: str) -> str:
    """docs/results.md: the protocol, its tables, plots and the claims table."""
    b = result.budget
    rows = summary_rows(result)
    best, target = _target(result)
    lines = [
        "# Results: the paper's claims on the embedded test bed",
        "",
        "Generated by one command (it trains everything below; wall time "
        f"{result.wall_s / 60:.0f} min on the development machine, 2 CPU cores):",
        "",
        "```bash",
        result.command,
        "```",
        "",
        "## Protocol",
        "",
        f"- **Test bed:** the embedded default model and scene reward (`configs/default.yaml`), with "
        f"`{' '.join(result.base_overrides) or 'no overrides'}`: {result.images_per_iteration} scored "
        "images per iteration for every arm (8 per prompt).",
        f"- **Budgets:** equal scored images ({b.images} per run, "
        f"{-(-b.images // result.images_per_iteration)} iterations) and equal training seconds "
        f"({result.seconds:.1f} s: MixGRPO's time for the image budget); each run trains until it has "
        "met both. Evaluation time is not charged.",
        f"- **Learning rates:** the grid {', '.join(f'{lr:g}' for lr in b.lrs)} for every main arm, "
        f"{b.sweep_iterations} iterations, seed {b.sweep_seed}, picked on validation pairs (eval seed "
        f"{b.validation_seed}), apart from the test pairs of every figure below. Ablations use the "
        "default tree's rate.",
        f"- **Seeds:** {b.seeds} per arm ({b.first_seed}..{b.first_seed + b.seeds - 1}). ± is the "
        "half-width of the 95% t interval of the mean; comparisons are Welch tests. A verdict is "
        "\"met\" or \"not met\" only when the 95% interval of the difference excludes 0; otherwise "
        "\"inconclusive\".",
        f"- **Target** for time-to-reward: the best baseline's mean held-out reward at equal images "
        f"({best}, {target:.4f}). A seed that never reaches it counts as the whole budget.",
        "",
        "## Learning-rate sweep (validation pairs)",
        "",
        "| arm | " + " | ".join(f"lr {lr:g}" for lr in b.lrs) + " | chosen |",
        "|---|" + "---|" * (len(b.lrs) + 1),
    ]
    for arm in [a for a in result.arms if a.role == "main"]:
        cells = {r["lr"]: r["validation_reward"] for r in result.sweep if r["arm"] == arm.name}
        lines.append(f"| {arm.name} | " + " | ".join(f"{cells.get(lr, float('nan')):.4f}" for lr in b.lrs)
                     + f" | {result.lrs[arm.name]:g} |")
    lines += [
        "",
        "## The recipes side by side",
        "",
        "| arm | tail | lr | forwards / image | median iteration | reward at equal images | "
        "reward at equal seconds (iterations) | images to target | seconds to target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = statistics.fmean(r["base_eval_reward"] for r in rows)
    for r in rows:
        if r["role"] != "main":
            continue
        lines.append(
            f"| {r['arm']} | {r['tail']} | {r['lr']:g} | {r['rollout_nfe_per_image']:.2f} | "
            f"{r['median_iteration_s']:.2f} s | {r['final_eval_reward_mean']:.4f} ± "
            f"{r['final_eval_reward_ci95']:.4f} | {r['equal_seconds_reward_mean']:.4f} ± "
            f"{r['equal_seconds_reward_ci95']:.4f} ({r['iterations_equal_seconds']:.0f}"
            f"{'' if r['equal_seconds_budget_reached'] else ', capped'}) | {r['samples_to_target']:.0f} "
            f"({r['samples_to_target_reached']}/{len(r['seeds'])}) | {r['seconds_to_target']:.1f} "
            f"({r['seconds_to_target_reached']}/{len(r['seeds'])}) |")
    lines += [
        "",
        f"Held-out reward before training: {base:.4f}. \"images / seconds to target\": mean over "
        "seeds, censored at the budget, (seeds that reached it within the budget).",
        "",
        "### Like for like",
        "",
        "| pair (same tail) | forwards / image | iteration time | reward at equal images "
        "| at equal seconds |",
        "|---|---|---|---|---|",
    ]
    runs = _by_arm(result.runs)
    by = {r["arm"]: r for r in rows}
    for tree, other in LIKE_FOR_LIKE:
        if tree not in by or other not in by:
            continue
        ci = welch(_per_seed(runs, tree, "at_images"), _per_seed(runs, other, "at_images"))
        cs = welch(_per_seed(runs, tree, "at_seconds"), _per_seed(runs, other, "at_seconds"))
        nfe = by[tree]["rollout_nfe_per_image"] / by[other]["rollout_nfe_per_image"]
        lines.append(
            f"| {tree} vs {other} | {nfe:.2f}x"
            f" | {by[tree]['median_iteration_s'] / by[other]['median_iteration_s']:.2f}x | "
            f"{_diff_text(ci)}: {verdict(ci)} | {_diff_text(cs)}: {verdict(cs)} |")
    lines += [
        "",
        f"![held-out reward against scored images]({image_dir}/protocol_reward_vs_images.png)",
        "",
        f"![held-out reward against training seconds]({image_dir}/protocol_reward_vs_seconds.png)",
        "",
        "## The paper's dynamic parts, one at a time (equal images, against the default tree)",
        "",
        "| part | variant | overrides | reward at equal images | vs default | verdict |",
        "|---|---|---|---|---|---|",
        f"| (default) | {TREE} | | {by[TREE]['final_eval_reward_mean']:.4f} ± "
        f"{by[TREE]['final_eval_reward_ci95']:.4f} | | |",
    ]
    for a in ablation_rows(result):
        lines.append(f"| {a['knob']} | {a['arm']} | `{' '.join(a['overrides'])}` | {a['reward']} | "
                     f"{_diff_text(a['vs_default'])} | {a['verdict']} |")
    lines += [
        "",
        "## The paper's claims on this test bed",
        "",
        "| claim | measure | value | verdict |",
        "|---|---|---|---|",
    ]
    for c in claims(result):
        lines.append(f"| {c.claim} | {c.measure} | {c.value} | **{c.verdict}** |")
    lines += ["", *SCOPE, ""]
    return "\n".join(lines)


def write_report(result: ProtocolResult, out: Path, docs: Path | None = None) -> list[dict[str, Any]]:
    """``bench.json``, the two plots and ``results.md`` under ``out`` (and docs/results.md with its
    images when ``docs`` is given); returns the rows."""
    rows = summary_rows(result)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench.json", json.dumps(rows, indent=2) + "\n")
    targets = [(out, ".")]
    if docs is not None:
        targets.append((docs.parent / "images", "images"))
    for folder, image_dir in targets:
        folder.mkdir(parents=True, exist_ok=True)
        plot(result, "images", folder / "protocol_reward_vs_images.png")
        plot(result, "seconds", folder / "protocol_reward_vs_seconds.png")
        text = markdown(result, image_dir)
        atomic_write_text((out / "results.md") if folder == out else docs, text)
    return rows


def format_summary(rows: Sequence[dict[str, Any]], result: ProtocolResult) -> str:
    """The console table and the claims."""
    head = f"{'arm':<26}{'lr':>8}{'nfe/img':>9}{'iter s':>8}{'equal images':>20}{'equal seconds':>20}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['arm']:<26}{r['lr']:>8g}{r['rollout_nfe_per_image']:>9.2f}"
                     f"{r['median_iteration_s']:>8.2f}{r['final_eval_reward_mean']:>11.4f} ± "
                     f"{r['final_eval_reward_ci95']:.4f}{r['equal_seconds_reward_mean']:>11.4f} ± "
                     f"{r['equal_seconds_reward_ci95']:.4f}")
    lines.append("")
    lines += [f"{c.claim}: {c.verdict} ({c.value})" for c in claims(result)]
    return "\n".join(lines)

