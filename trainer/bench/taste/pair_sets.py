"""``treerpo bench taste-sets``: one template run measured on more seed sets than the two it was judged on.

Why: every run of the template row validates on the same pairs (the template's 3 prompts at the guard's
fixed seeds) and is tested on the same pairs (the row's fixed test seeds), so whatever separates those two
sets is one draw that every run carries. Measuring one run's kept model and the base on several more seed
sets of the same prompts says which set is the unusual one, and whether the spread between sets is the
one the guard's standard error states.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...training.evaluate import EvalPair, pairs_from_prompts

VALIDATION, TEST = "validation", "test"
FIRST_EXTRA_SEED = 4001  # the further sets' seeds: far from the guard's (777 + 1e6) and the test's (12345)


def extra_sets(prompts: Sequence[str], count: int, sets: int, first: int = FIRST_EXTRA_SEED
               ) -> dict[str, list[EvalPair]]:
    """``sets`` further pair sets of ``prompts`` (``count`` pairs each, cycling the prompts as the guard's
    and the test's sets do), named by their seed."""
    if sets < 1:
        raise ValueError(f"--sets must be at least 1, got {sets}")
    return {f"seed set {first + k}": pairs_from_prompts(list(prompts), count, first + k) for k in range(sets)}


def between_sets(falls: dict[str, float], stated_se: float) -> dict[str, float]:
    """Where the validation and test sets' falls lie among the further sets': each one's distance from
    the further sets' mean in units of their standard deviation, and that deviation beside the standard
    error the guard stated for the kept point's fall (about equal when the stated error is right)."""
    others = [v for k, v in falls.items() if k not in (VALIDATION, TEST)]
    if len(others) < 2:
        raise ValueError(f"need at least 2 further sets to compare with, got {len(others)}")
    mean, sd = statistics.fmean(others), statistics.stdev(others)

    def away(key: str) -> float:
        return (falls[key] - mean) / sd if sd > 0 else math.nan

    return {"others_mean": mean, "others_sd": sd, "stated_se": stated_se, "validation_away": away(VALIDATION),
            "test_away": away(TEST)}


def sets_line(falls: dict[str, float], summary: dict[str, float]) -> str:
    """The run's finding in one line."""
    return (f"fall of prompt-following on the validation set {falls[VALIDATION]:+.4f} "
            f"({summary['validation_away']:+.1f} sd from the further sets' mean "
            f"{summary['others_mean']:+.4f}), on the test set {falls[TEST]:+.4f} "
            f"({summary['test_away']:+.1f} sd); the further sets' standard deviation "
            f"{summary['others_sd']:.4f} against the guard's stated standard error "
            f"{summary['stated_se']:.4f}")


def run_sets(taste_spec: str, seed: int, sets: int, out: Path, extra: Sequence[str] = (),
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the template row's run of ``taste_spec`` at ``seed`` as the node does (the row's code path:
    same trees, same choice), then measure the base and the kept model on the guard's validation pairs,
    the row's test pairs and ``sets`` further seed sets; ``out/<taste>_seed<seed>.json``."""
    from ...embedded.policy import EmbeddedPolicy
    from ...rewards.registry import get_reward
    from ...training.guarded import same_prompt_pairs
    from ...training.loop import Trainer
    from ..common.provenance import provenance
    from .as_node import folder_prompts, folder_with, measure_pairs, train_as_node
    from .budget import bench_config, template_budget
    from .measure import test_bed
    from .person import SimulatedPerson, load_taste
    from .trees import template_trees

    name, taste = load_taste(taste_spec)
    scene, budget, code = get_reward("scene"), template_budget(), provenance()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        work = Path(tmp)
        probe = Trainer(bench_config(budget, seed, "scene", {}, extra), evaluation=False)
        bed = test_bed(budget, probe, work)
        shift, batch = probe.config.sampling.shift, probe.config.max_batch
        del probe
        person = SimulatedPerson(taste, budget.likes, budget.dislikes, budget.mistakes)
        store, ids = template_trees(seed, work / "trees", person, shift)
        folder = folder_with(store, ids, work / "folder")
        policy, state, _ = train_as_node(budget.picks_budget(), folder, seed, work, budget.keep, extra)
        point = state.guard.choice.point
        log(f"{name} seed {seed}: kept iteration {point.iteration} at strength {point.strength:g}")
        prompts = folder_prompts(folder)
        sets = {VALIDATION: same_prompt_pairs(prompts, state.config), TEST: bed.pairs,
                **extra_sets(prompts, len(bed.pairs), sets)}
        base = EmbeddedPolicy.from_pretrained()
        measured: dict[str, dict[str, float]] = {}
        for key, pairs in sets.items():
            before = measure_pairs(base, pairs, bed.sigmas, batch, taste, scene)
            after = measure_pairs(policy, pairs, bed.sigmas, batch, taste, scene)
            measured[key] = {"base": before["scene"], "kept": after["scene"],
                             "fall": before["scene"] - after["scene"],
                             "taste_gain": after["taste"] - before["taste"]}
            log(f"  {key}: prompt-following {before['scene']:.4f} -> {after['scene']:.4f} "
                f"(fall {measured[key]['fall']:+.4f})")
    falls = {k: v["fall"] for k, v in measured.items()}
    summary = between_sets(falls, float(point.guard_se))
    log(f"{name} seed {seed}: {sets_line(falls, summary)}")
    record = {"taste": name, "seed": seed, "kept": {"iteration": point.iteration, "strength": point.strength},
              "sets": measured, "summary": summary, "extra": list(extra), "code": code}
    path = out / f"{name}_seed{seed}.json"
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record
