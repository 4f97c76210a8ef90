"""``treerpo bench compare``: the paper's recipes trained side by side on the same budget.

Why wall-clock budgets of *training* time: the paper's claims are about compute (forwards per image,
time to a reward). Each strategy trains on the embedded default with the same config, seeds, prompts
per iteration and scored images per iteration, one after the other in this process (on a shared
machine, interleaving would mix their timings); held-out evaluation is timed apart and not charged to
the budget. Each strategy's curve is its held-out reward against its own training seconds.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config.schema import TrainConfig
from ..core.flow import make_sigmas
from ..core.strategies import STRATEGIES
from ..training.loop import Trainer, iteration_plan
from ..utils.atomic import atomic_write_text

BASELINES = ("mixgrpo", "mixgrpo_flash", "dancegrpo")


@dataclass
class Curve:
    """One strategy and seed: ``(training seconds, held-out reward)`` points and per-iteration costs."""

    strategy: str
    seed: int
    points: list[tuple[float, float]] = field(default_factory=list)
    iteration_s: list[float] = field(default_factory=list)
    rollout_nfe: list[int] = field(default_factory=list)
    scored_images: list[int] = field(default_factory=list)

    @property
    def final(self) -> float:
        return self.points[-1][1]

    def time_to(self, reward: float) -> float | None:
        """Training seconds until the held-out reward first reached ``reward`` (None: never)."""
        return next((t for t, r in self.points if r >= reward), None)


def check_same_images(config: TrainConfig) -> int:
    """Leaves per prompt of every strategy; different counts would not be a fair comparison."""
    counts = {}
    for strategy in STRATEGIES:
        trial = replace(config, strategy=strategy)
        sigmas = make_sigmas(trial.sampling.schedule, trial.strategy_config.steps, trial.sampling.shift)
        counts[strategy] = iteration_plan(trial, sigmas, 0).leaves_per_prompt
    if len(set(counts.values())) != 1:
        listed = ", ".join(f"{k} {v}" for k, v in counts.items())
        raise ValueError(f"the strategies score different numbers of images per prompt ({listed}): set "
                         "mixgrpo.group_size and dancegrpo.group_size to the tree's leaves")
    return next(iter(counts.values()))


def train_for(config: TrainConfig, budget_s: float, eval_every: int) -> Curve:
    """Train ``config`` until ``budget_s`` seconds of training, evaluating every ``eval_every``
    iterations (and at the start and the end)."""
    trainer = Trainer(config)
    curve = Curve(config.strategy, config.seed)
    curve.points.append((0.0, trainer.evaluate()[0]["eval_reward"]))
    spent, iteration = 0.0, 0
    while spent < budget_s:
        row = trainer.step(iteration)
        iteration += 1
        spent += row["iteration_s"]
        curve.iteration_s.append(row["iteration_s"])
        curve.rollout_nfe.append(int(row["nfe_rollout"]))
        curve.scored_images.append(int(row["scored_images"]))
        if iteration % eval_every == 0 or spent >= budget_s:
            curve.points.append((spent, trainer.evaluate()[0]["eval_reward"]))
    return curve


def summarise(curves: list[Curve]) -> list[dict[str, Any]]:
    """One row per strategy: means (and spread) over seeds, time to the best baseline's final reward,
    and ratios against MixGRPO and DanceGRPO."""
    by: dict[str, list[Curve]] = {}
    for c in curves:
        by.setdefault(c.strategy, []).append(c)
    finals = {s: statistics.fmean(c.final for c in cs) for s, cs in by.items()}
    baselines = [s for s in BASELINES if s in finals]
    target = max(finals[s] for s in baselines) if baselines else None
    rows = []
    for strategy, cs in by.items():
        times = [c.time_to(target) for c in cs] if target is not None else []
        reached = [t for t in times if t is not None]
        rows.append({
            "strategy": strategy, "seeds": len(cs),
            "rollout_nfe_per_image": statistics.fmean(
                sum(c.rollout_nfe) / max(1, sum(c.scored_images)) for c in cs),
            "median_iteration_s": statistics.fmean(statistics.median(c.iteration_s) for c in cs),
            "iterations": statistics.fmean(len(c.iteration_s) for c in cs),
            "final_eval_reward": finals[strategy],
            "final_eval_reward_std": statistics.pstdev(c.final for c in cs),
            "base_eval_reward": statistics.fmean(c.points[0][1] for c in cs),
            "time_to_best_baseline_s": statistics.fmean(reached) if len(reached) == len(cs) and cs else None,
            "seeds_reaching_best_baseline": len(reached),
        })
    for row in rows:
        for ref in ("mixgrpo", "dancegrpo"):
            other = next((r for r in rows if r["strategy"] == ref), None)
            if other is None:
                continue
            row[f"nfe_vs_{ref}"] = row["rollout_nfe_per_image"] / other["rollout_nfe_per_image"]
            row[f"iteration_s_vs_{ref}"] = row["median_iteration_s"] / other["median_iteration_s"]
    return rows


def format_rows(rows: list[dict[str, Any]], best_baseline: float | None) -> str:
    head = (f"{'strategy':<16}{'nfe/img':>9}{'vs mix':>8}{'vs dance':>9}{'iter s':>8}{'vs mix':>8}"
            f"{'iters':>7}{'final reward':>15}{'t to best base':>16}")
    lines = [head]
    for r in rows:
        t = r["time_to_best_baseline_s"]
        nan = float("nan")
        lines.append(
            f"{r['strategy']:<16}{r['rollout_nfe_per_image']:>9.2f}{r.get('nfe_vs_mixgrpo', nan):>7.2f}x"
            f"{r.get('nfe_vs_dancegrpo', nan):>8.2f}x{r['median_iteration_s']:>8.2f}"
            f"{r.get('iteration_s_vs_mixgrpo', nan):>7.2f}x{r['iterations']:>7.1f}"
            f"{r['final_eval_reward']:>9.4f}±{r['final_eval_reward_std']:.4f}"
            f"{'never' if t is None else f'{t:.0f} s':>16}")
    if best_baseline is not None:
        lines.append(f"best baseline's final held-out reward: {best_baseline:.4f}")
    return "\n".join(lines)


def plot(curves: list[Curve], out_png: Path) -> None:
    """Held-out reward against training seconds, one line per strategy and seed."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..utils.atomic import atomic_write_bytes

    fig = Figure(figsize=(8.0, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colours = dict(zip(STRATEGIES, ("tab:red", "tab:blue", "tab:cyan", "tab:gray"), strict=True))
    labelled: set[str] = set()
    for c in curves:
        xs, ys = zip(*c.points, strict=True)
        ax.plot(xs, ys, marker="o", ms=3, color=colours.get(c.strategy),
                label=None if c.strategy in labelled else c.strategy)
        labelled.add(c.strategy)
    ax.set_xlabel("training seconds")
    ax.set_ylabel("held-out reward")
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(out_png, buf.getvalue())


def compare(config: TrainConfig, budget_s: float, seeds: int, out: Path, eval_every: int = 4,
            strategies: tuple[str, ...] = STRATEGIES) -> list[dict[str, Any]]:
    """Train every strategy for ``budget_s`` seconds per seed; write ``bench.json``, ``curves.json``
    and ``reward_vs_time.png`` under ``out``; return the summary rows."""
    if budget_s <= 0 or seeds < 1 or eval_every < 1:
        raise ValueError("--budget-seconds must be > 0, --seeds and --eval-every >= 1")
    check_same_images(config)
    curves = [train_for(replace(config, strategy=s, seed=config.seed + k), budget_s, eval_every)
              for k in range(seeds) for s in strategies]
    rows = summarise(curves)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench.json", json.dumps(rows, indent=2) + "\n")
    atomic_write_text(out / "curves.json", json.dumps([c.__dict__ for c in curves], indent=1) + "\n")
    plot(curves, out / "reward_vs_time.png")
    return rows
