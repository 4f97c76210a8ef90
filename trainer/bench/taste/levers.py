"""``treerpo bench taste-levers``: what each lever of learning a taste from picks gives, on the same seeds
and the same picks: the first version's guard (128 validation pairs, strengths guessed on a straight
line), the default (512 pairs, strengths by bisection), the default with the guard steering the picks
weight, and the default at a higher fixed weight, each against the oracle frontier of ``treerpo bench
taste`` (the best of the fixed weights and the steered oracle). Every figure is on held-out test pairs,
per seed, and the comparison is printed as means with 95% t intervals, paired per seed against the
default.

    treerpo bench taste-levers --tastes lower_objects,warm_shades,larger_objects --seeds 2 \
        --trees 50 --out runs/levers

``--out/<taste>_<seed>.json`` is written after every arm, so a stopped run resumes where it stopped;
``--report`` prints the table from those files without training. Why it stays beside the table: 0.3.0's
comparison of the levers was made with it, and docs/picks.md reads its stored runs.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...rewards.registry import get_reward
from ...training.loop import Trainer
from ..common.stats import mean_ci95
from .budget import SeedResult, TasteBudget, bench_config
from .frontier import frontier_runs
from .measure import measure
from .person import SimulatedPerson, load_taste
from .run import one_round, two_rounds
from .trees import person_trees

FIRST_VERSION = ["guard.pairs=128", "guard.search=line", "guard.strength_tries=2"]
ARMS: dict[str, tuple[list[str], float | None]] = {
    "first version (128 pairs, line)": (FIRST_VERSION, None),
    "default (512 pairs, bisect)": ([], None),
    "default + guard.steer": (["experimental.guard.steer=true"], None),
    "default at picks weight 0.6": ([], 0.6),
    "default, two rounds of picks": ([], None),
}
"""Each arm: config lines after the budget's, and a picks weight other than the budget's (None: its own)."""
TWO_ROUNDS = "default, two rounds of picks"
"""Half the trees on the base model, half on the first round's chosen model, the same clicks in all."""
DEFAULT = "default (512 pairs, bisect)"
PERSON_PAIRS = 128
"""The validation pairs whose prompts the person's trees avoid (the stored runs' budget)."""


def levers_seed(taste: str, seed: int, budget: TasteBudget, path: Path, log: Callable[[str], None] = print,
                wanted: Sequence[str] | None = None) -> dict[str, Any]:
    """One taste and seed: the frontier, the person's trees, then every arm (of ``wanted``) on the same
    trees."""
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def save() -> None:
        path.write_text(json.dumps(data, indent=1))

    name, hidden = load_taste(taste)
    scene = get_reward("scene")
    if "before" not in data:
        data["before"] = measure(Trainer(bench_config(budget, seed, "scene", {}, [])), hidden, scene)
        save()
    before = data["before"]
    if "frontier" not in data:
        result = SeedResult(seed, before["taste"], before["scene"])
        frontier_runs(budget, result, taste, [], log)
        data["frontier"] = {k: {"gain": v["gain"], "scene_change": v["scene_change"], "weight": v["weight"],
                                "iteration": v["iteration"], "strength": v["strength"]}
                            for k, v in result.frontier.items()}
        save()
    person = SimulatedPerson(hidden, budget.likes, budget.dislikes, budget.mistakes)
    # the person's prompts avoid the first version's 128 validation pairs, as in the stored runs (the
    # benchmark now avoids its 512: other prompts, other picks)
    store, ids = person_trees(replace(budget, validation_pairs=PERSON_PAIRS), seed,
                              path.parent / f".picks_{path.stem}", person, [])
    for arm, (extra, weight) in ARMS.items():
        if arm in data.get("arms", {}) or (wanted is not None and arm not in wanted):
            continue
        arm_budget = budget if weight is None else replace(budget, picks_weight=weight)
        if arm == TWO_ROUNDS:
            out = two_rounds(arm_budget, seed, store, ids, budget.trees, hidden, scene, extra, person, before)
        else:
            out, _ = one_round(arm_budget, seed, store, ids[: budget.trees], hidden, scene, extra,
                               before=before)
        data.setdefault("arms", {})[arm] = {
            "taste_gain": out["taste"] - before["taste"], "scene_change": out["scene"] - before["scene"],
            "limit": out["limit"], "chosen": out["chosen"], "picks_weights": out["picks_weights"],
            **({"rounds": out["rounds"]} if "rounds" in out else {})}
        save()
        log(f"{name} seed {seed}, {arm}: taste {out['taste'] - before['taste']:+.4f}, scene "
            f"{out['scene'] - before['scene']:+.4f}; {out['chosen']['reason']}")
    return data


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Per taste and arm: the taste gain, its share of the frontier, the gain's difference from the default
    (paired per seed), the change of prompt-following and the runs past the limit."""
    lines = ["| taste | arm | seeds | taste gain (95% CI) | share of the frontier | against the default "
             "(95% CI) | prompt-following change | runs past the limit |",
             "|---|---|---|---|---|---|---|---|"]
    for taste, runs in results.items():
        frontier = [max(f["gain"] for f in r["frontier"].values()) for r in runs]
        for arm in ARMS:
            done = [r for r in runs if arm in r.get("arms", {})]
            if not done:
                continue
            gains = [r["arms"][arm]["taste_gain"] for r in done]
            scene = [r["arms"][arm]["scene_change"] for r in done]
            front = statistics.fmean(max(f["gain"] for f in r["frontier"].values()) for r in done)
            paired = [r["arms"][arm]["taste_gain"] - r["arms"][DEFAULT]["taste_gain"] for r in done
                      if DEFAULT in r["arms"]]
            past = sum(r["arms"][arm]["scene_change"] < -r["arms"][arm]["limit"] for r in done)
            versus = "" if arm == DEFAULT or not paired else _ci(paired)
            share = statistics.fmean(gains) / front
            lines.append(f"| {taste} | {arm} | {len(done)} | {_ci(gains)} | {share:.0%} | {versus} | "
                         f"{_ci(scene, 4)} | {past} of {len(done)} |")
        lines.append(f"| {taste} | oracle frontier | {len(runs)} | {_ci(frontier)} | 100% | | | |")
    lines += ["", "Over every taste and seed, each run's gain as a share of its own frontier:", "",
              "| arm | runs | share of the frontier (95% CI) | against the default (95% CI) | runs past the "
              "limit |", "|---|---|---|---|---|"]
    runs = [r for rs in results.values() for r in rs]
    for arm in ARMS:
        done = [r for r in runs if arm in r.get("arms", {})]
        if not done:
            continue
        shares = [_share(r, arm) for r in done]
        paired = [_share(r, arm) - _share(r, DEFAULT) for r in done if DEFAULT in r["arms"]]
        past = sum(r["arms"][arm]["scene_change"] < -r["arms"][arm]["limit"] for r in done)
        versus = "" if arm == DEFAULT or not paired else _ci(paired, percent=True)
        lines.append(f"| {arm} | {len(done)} | {_ci(shares, percent=True)} | {versus} | "
                     f"{past} of {len(done)} |")
    second = [(taste, r["arms"][TWO_ROUNDS]["rounds"][1]) for taste, rs in results.items() for r in rs
              if TWO_ROUNDS in r.get("arms", {})]
    if second:
        on = statistics.fmean(s["first_reward_accuracy"] for _, s in second)
        base = statistics.fmean(s["first_reward_accuracy_on_base_trees"] for _, s in second)
        each = ", ".join(f"{t} {a['first_reward_accuracy']:.2f} / "
                         f"{a['first_reward_accuracy_on_base_trees']:.2f}" for t, a in second)
        lines += ["", f"Two rounds: the first round's personal reward ordered the person's pairs on the "
                      f"trained model's trees at {on:.2f}, on more of the base model's trees at {base:.2f} "
                      f"(mean of {len(second)} runs; per run: {each})."]
    return "\n".join(lines)


def _share(run: dict[str, Any], arm: str) -> float:
    return run["arms"][arm]["taste_gain"] / max(f["gain"] for f in run["frontier"].values())


def _ci(values: list[float], digits: int = 3, percent: bool = False) -> str:
    e = mean_ci95(values)

    def num(x: float) -> str:
        return f"{x:+.0%}" if percent else f"{x:+.{digits}f}"

    if len(values) < 2:
        return num(e.mean)
    return f"{num(e.mean)} ({num(e.mean - e.ci95)} to {num(e.mean + e.ci95)})"


def levers_budget(trees: int, seeds: int) -> TasteBudget:
    """The published budget at one tree count and ``seeds`` seeds (what the stored lever runs used)."""
    return replace(TasteBudget(), trees=trees, at=(trees,), seeds=seeds)


def check_arms(names: Sequence[str]) -> None:
    """Refuse in one line an arm that is not one of ``ARMS``."""
    unknown = [a for a in names if a and a not in ARMS]
    if unknown:
        raise ValueError(f"no arm {unknown[0]!r}; the arms are: {'; '.join(ARMS)}")


def run_levers(tastes: Sequence[str], seeds: int, trees: int, out: Path, report: bool,
               wanted: Sequence[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per taste, the runs of every seed in ``out`` (``report``: only those already there; otherwise the
    arms of ``wanted``, or every arm, run where missing)."""
    budget = levers_budget(trees, seeds)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {}
    for taste in tastes:
        for seed in range(seeds):
            path = out / f"{taste}_{seed}.json"
            if report:
                if path.exists():
                    results.setdefault(taste, []).append(json.loads(path.read_text()))
                continue
            chosen = list(wanted) if wanted else list(ARMS)
            results.setdefault(taste, []).append(levers_seed(taste, seed, budget, path, wanted=chosen))
    return results
