"""``treerpo bench ablate``: the paper's knobs one at a time, each on the same training-time budget.

Every variant changes one option of the config (or one pair: depth with branching) from the
default and trains Dynamic-TreeRPO for the same seconds as the default does; the table gives the
final held-out reward and its change against the default, so a knob's effect is read off one row.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config.files import load_config
from ..config.schema import TrainConfig
from ..utils.atomic import atomic_write_text
from .benchmark import train_for


@dataclass(frozen=True)
class Variant:
    knob: str
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return ", ".join(self.overrides) or "default"


VARIANTS = (
    Variant("default", ()),
    Variant("noise growth beta", ("tree.noise_growth=0.0",)),
    Variant("noise growth beta", ("tree.noise_growth=1.0",)),
    Variant("depth and branching", ("tree.depth=2",)),
    Variant("depth and branching", ("tree.depth=4",)),
    Variant("depth and branching", ("tree.depth=2", "tree.branching=3")),
    Variant("LayerTuning weight lambda", ("loss.prm_lambda=0.0",)),
    Variant("LayerTuning weight lambda", ("loss.prm_lambda=0.1",)),
    Variant("reward sensitivity eta", ("loss.clip.eta=0.5",)),
    Variant("reward sensitivity eta", ("loss.clip.eta=2.0",)),
    Variant("dynamic clipping", ("loss.clip.mode=fixed",)),
    Variant("node value", ("loss.node_value=mean",)),
    Variant("PRM target", ("loss.prm_target=path",)),
)


def ablate(config_path: str | None, overrides: list[str], budget_s: float, seeds: int, out: Path,
           eval_every: int = 4, variants: tuple[Variant, ...] = VARIANTS) -> list[dict[str, Any]]:
    """Train every variant for ``budget_s`` training seconds per seed; write ``ablate.json``."""
    if budget_s <= 0 or seeds < 1:
        raise ValueError("--budget-seconds must be > 0 and --seeds >= 1")
    rows = []
    for variant in variants:
        finals, gains, iterations = [], [], []
        config = load_config(TrainConfig, config_path, [*overrides, *variant.overrides])
        for k in range(seeds):
            curve = train_for(replace(config, seed=config.seed + k), budget_s, eval_every)
            finals.append(curve.final)
            gains.append(curve.final - curve.points[0][1])
            iterations.append(len(curve.iteration_s))
        rows.append({"knob": variant.knob, "variant": variant.name, "seeds": seeds,
                     "final_eval_reward": statistics.fmean(finals),
                     "final_eval_reward_std": statistics.pstdev(finals),
                     "gain": statistics.fmean(gains), "iterations": statistics.fmean(iterations)})
    base = next((r for r in rows if r["variant"] == "default"), None)
    for row in rows:
        row["vs_default"] = row["final_eval_reward"] - base["final_eval_reward"] if base else None
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "ablate.json", json.dumps(rows, indent=2) + "\n")
    return rows


def format_ablation(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'knob':<27}{'variant':<40}{'iters':>6}{'final reward':>16}{'gain':>9}{'vs default':>11}"]
    for r in rows:
        vs = r["vs_default"]
        lines.append(f"{r['knob']:<27}{r['variant']:<40}{r['iterations']:>6.1f}"
                     f"{r['final_eval_reward']:>9.4f}±{r['final_eval_reward_std']:.4f}{r['gain']:>+9.4f}"
                     f"{'' if vs is None else f'{vs:+.4f}':>11}")
    return "\n".join(lines)
