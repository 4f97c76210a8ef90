"""docs/results.md and the README's verdict table: the protocol as run, its tables and the claims,
from ``protocol.json`` alone.

The page states every rule a reader needs to judge a verdict (paired seeds, the t test and the
exact sign-flip test of every comparison, claims tested against every baseline, Holm within three
families, verdicts only where both adjusted tests agree, what the exact test can reach with the
seeds run, the fixed checkpoints, the target fixed from validation data, censored times to target
resolved per iteration, the clip treatments) next to the numbers, and which test made each figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..common.marked import replace_marked
from ..common.stats import ALPHA, Comparison, claimed_side, exact_floor, mean_ci95, seeds_for_exact
from .arms import LIKE_FOR_LIKE, TREE
from .claims import (
    BUDGETS,
    CLAIM_ABLATIONS,
    EFFICIENCY_AT_MOST,
    EFFICIENCY_HALF,
    FAMILIES,
    FAMILY_NAMES,
    Test,
    capped_times,
    clock_label,
    family_size,
    resolved_per_iteration,
    time_where,
)
from .results import PRIMARY_CLAIMS, ProtocolResult


def _p(p: float | None) -> str:
    return "n/a" if p is None or math.isnan(p) else f"{p:.3g}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _num(value: float, spec: str) -> str:
    return "n/a" if math.isnan(value) else format(value, spec)


TEST_HEADER = ("difference (95% CI) | seeds | p, t test | p, exact | Holm p, t test | Holm p, exact | "
               "verdict")
TEST_RULE = "---|---|---|---|---|---|---"


def _test_cells(t: Test) -> str:
    """``difference (95% CI) | seeds | p t | p exact | Holm t | Holm exact | verdict``."""
    c = t.comparison
    if c is None:
        return f"{t.value_text()} | | | | | | **{t.verdict}**"
    p_t = f"{_p(t.p_value)} (no spread: the exact test's)" if c.no_spread else _p(t.p_value)
    verdict = "no verdict (a measurement: see below)" if t.verdict == "descriptive" else t.verdict
    return (f"{t.value_text()} | {c.n} | {p_t} | {_p(t.p_exact)} | {_p(t.p_adjusted)} | "
            f"{_p(t.p_exact_adjusted)} | **{verdict}**")


def reach_text(tests: Sequence[Test], seeds: int) -> str:
    """What the exact test can establish with ``seeds`` seeds in each family: its smallest raw and
    Holm-adjusted p-values, whether a verdict is reachable, and the seeds one needs."""
    floor = exact_floor(seeds)
    parts = []
    for family in FAMILIES:
        m = family_size(tests, family)
        if m:
            smallest = min(1.0, m * floor)
            reach_one = ("a verdict is reachable" if smallest < ALPHA else
                         f"no verdict is reachable (that needs at least {seeds_for_exact(m)} seeds)")
            parts.append(f"in the {FAMILY_NAMES[family]} family ({_plural(m, 'test')}) its smallest "
                         f"Holm-adjusted p-value is {smallest:.3g}: {reach_one}")
    reach = ", so no comparison on this page can be met or not met" if floor >= ALPHA else ""
    return (f"With {seeds} seeds the exact test's smallest p-value is 2/2^{seeds} = {floor:.3g}{reach}"
            + (": " + "; ".join(parts) if parts else "") + ".")


def _clock_words(result: ProtocolResult) -> str:
    env = result.environment
    threads = env.get("threads", 1)
    passive = str(env.get("omp_wait_policy", "")).upper() == "PASSIVE"
    if result.clock == "cpu":
        how = ("one thread" if threads == 1 else f"{threads} threads with OMP_WAIT_POLICY=PASSIVE" if passive
               else f"{threads} threads with OpenMP's default spin-waiting, which counts as CPU time when "
                    "another process competes for the cores")
        return ("CPU seconds of the training process (`time.process_time` around each iteration, all its "
                f"threads; here {how}), which time taken by other processes on the machine does not "
                "inflate; wall seconds are in `protocol.json` too")
    return ("wall seconds (the model runs on a GPU, whose work the host's CPU time does not measure); CPU "
            "seconds are in `protocol.json` too")


def _sweep_table(result: ProtocolResult) -> list[str]:
    lines = ["| arm | rates swept: validation reward (chosen in bold) | chosen | inside the swept range |",
             "|---|---|---|---|"]
    for arm, g in result.grid.items():
        rows = sorted((r for r in result.sweep if r["arm"] == arm), key=lambda r: r["lr"])
        cells = ", ".join(f"**{r['lr']:g}: {r['validation_reward']:.4f}**" if r["lr"] == g["chosen"]
                          else f"{r['lr']:g}: {r['validation_reward']:.4f}" for r in rows)
        inside = "yes" if g["inside"] else "**no: the extension limit was hit**"
        lines.append(f"| {arm} | {cells} | {g['chosen']:g} | {inside} |")
    return lines


SEPARATION = 3.0  # the default's gain must be this many 95% half-widths for the budget to separate recipes


def budget_check(result: ProtocolResult) -> str:
    """Whether the image budget lets the default tree's gain stand out of its own seeds' noise: its
    mean held-out gain against the 95% half-width of its per-seed gains."""
    runs = result.runs_of(TREE, "published")
    if len(runs) < 2:
        return "fewer than two seeds of the default tree: no interval, so no budget check."
    gains = mean_ci95([r.at_images - r.base for r in runs])
    ratio = gains.mean / gains.ci95 if gains.ci95 > 0 else math.inf
    verdict = (f"at least {SEPARATION:g}x: the check passes, on the t interval; an exact test of this gain "
               f"cannot go below p = {exact_floor(len(runs)):.3g} with {len(runs)} seeds"
               if ratio >= SEPARATION else
               f"less than {SEPARATION:g}x: at this budget the run exercises the harness more than it "
               "ranks the recipes")
    return (f"the default tree gains {gains.mean:+.4f} ± {gains.ci95:.4f} (95%) held-out reward at the "
            f"image budget, {ratio:.1f} times its half-width ({verdict}).")


def _parts_words(result: ProtocolResult) -> str:
    """Which parts of the protocol ran, in the reader's words."""
    if "all" in result.parts:
        return "One command ran every part: the sweep, the main arms, the ablations and the clip treatments."
    if "ablations" in result.parts:
        return ("The main part (`--part main`) ran the sweep and the main arms; the ablation part (`--part "
                "ablations`, continuing the same `protocol.json` at the rates the sweep fixed) the ablation "
                "arms and the clip treatments.")
    return ("Only the main part has run (the sweep and the main arms): the ablation claims, the other "
            "ablations and the clip treatments follow with `--part ablations` and the same `--out`.")


def per_iteration_times(result: ProtocolResult) -> bool:
    """Whether the main arms' runs were evaluated every iteration until the target (so their times get
    verdicts)."""
    runs = [r for a in result.arms if a.role == "main" for r in result.runs_of(a.name)]
    return result.target["usable"] and resolved_per_iteration(result, runs)


CENSORING = ("A seed that has not reached the target within the budget is censored at the budget. Per "
             "arm: the restricted mean time (the area under the Kaplan-Meier curve up to the budget; with "
             "censoring only at the budget it equals the mean of min(time, budget)) and how many seeds "
             "reached the target. Two arms are compared by the tests below on min(time, budget) per seed.")


def _time_words(result: ProtocolResult) -> str:
    if per_iteration_times(result):
        return ("each main arm's run (as published) is evaluated after every iteration until its test "
                "reward has reached the target, then at the checkpoints only, so its time is the images or "
                "seconds spent at the first iteration at the target, not at the first checkpoint: the "
                "checkpoint grid does not decide a comparison (the evaluations are not charged). "
                f"{CENSORING} The tree's times are compared with every baseline's, and get verdicts like "
                "the rewards.")
    return ("these runs were evaluated at the checkpoints only, so a time is the images or seconds spent at "
            "the first checkpoint that reached the target: times are resolved to the checkpoint grid (a seed "
            f"that reached it at the first one may have needed fewer). {CENSORING} The time comparisons are "
            "therefore reported as measurements, not verdicts (a protocol run since evaluates the main arms "
            "every iteration until the target, and its times get verdicts).")


def _ablation_rates(result: ProtocolResult) -> str:
    """How the ablation arms got their rates: swept like the main arms (this version), or the tree's."""
    swept = {r["arm"] for r in result.sweep}
    ablations = [a.name for a in result.arms if a.role == "ablation"]
    if not ablations or not any(name in swept for name in ablations):
        return "Ablations use the default tree's rate, the clip treatments each arm's own."
    text = ("Each ablation arm is swept the same way after the main arms (the fixed clip takes the dynamic "
            "clip's rate, so that the two are compared at the same rate); the clip treatments use each "
            "arm's own rate.")
    if result.clip_sweep:
        bounds = ", ".join(f"{r['clip']:g}: {r['validation_reward']:.4f}" for r in result.clip_sweep)
        text += (f" The fixed clip's bound was swept on validation at that rate ({bounds}); the best is the "
                 "arm `capping best fixed clip`.")
    return text


def _convergence_words(result: ProtocolResult) -> str:
    """The second target, or why this run has none."""
    c = result.convergence
    if c is None:
        return ("This run fixed one target only: most arms reach it in one to three iterations, so its "
                "time per second mostly measures the cost of an iteration; the claims read \"faster to a "
                "first gain\" for that reason (runs since fix a convergence target too).")
    return (f"A second target, the **convergence target**, was fixed with it: {c['gain']:+.4f} ("
            f"{c['fraction']:g} x the same median), which most arms need several iterations for. The paper's "
            "\"faster convergence\" claims are tested on the time to it; the times to the first gain are "
            "in the secondary family, named \"faster to a first gain\".")


def _protocol(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    b, target, cps = result.budget, result.target, result.checkpoints
    label = clock_label(result.clock)
    iterations = int(result.images_limit) // result.images_per_iteration
    outside = [arm for arm, g in result.grid.items() if not g["inside"]]
    shared = max((r["test_prompts_in_validation"] for r in result.sweep), default=0)
    taste = any(o.startswith("reward=scene:0.5,function") for o in result.base_overrides)
    # runs timed per iteration were made after each recipe got its anchor's rule for a reward mix
    mix = ("each recipe combining the two as its anchor does (Flow-GRPO, DiffusionNFT, AWM and DGPO: their "
           "raw weighted sum; the others: each normalised within its prompt's images, then weighted)"
           if per_iteration_times(result) else "each normalised within its prompt's images (for every "
           "recipe: these runs predate each recipe's own rule, docs/algorithm.md)")
    bed = (f"`{result.config}`" if result.config is not None
           else "the embedded default model (`configs/default.yaml`) with the taste task: the scene reward "
                f"mixed half and half with a taste for larger objects (`trainer/bench/tastes.py`), {mix}; "
                "the held-out reward is their weighted sum"
           if taste else "the embedded default model and scene reward (`configs/default.yaml`)")
    overrides = " ".join(result.base_overrides) or "no overrides"
    skipped = "; ".join(f"{k} ({v})" for k, v in result.skipped.items())
    gains = ", ".join(f"{k} {v:+.4f}" for k, v in target["validation_gains"].items())
    seconds_rule = ("MixGRPO's median sweep iteration times the image budget's iterations"
                    if b.seconds is None else "as given")
    image_cps = ", ".join(f"{c:.0f}" for c in cps["images"])
    second_cps = ", ".join(f"{c:.3g}" for c in cps["seconds"])
    grid = ", ".join(f"{lr:g}" for lr in b.lrs)
    edges = ("Every chosen rate is inside its range." if not outside else
             f"The extension limit was hit for {', '.join(outside)}: the chosen rate is at an edge.")
    no_target = "" if target["usable"] else " It is not positive, so times to target are not measured."
    baselines = ", ".join(result.baselines) or "none ran"
    needed = seeds_for_exact(PRIMARY_CLAIMS)
    treated = "the like-for-like pairs" if result.treatments else "the like-for-like pairs (not run yet)"
    bullets = {
        "Test bed":
            f"{bed}, with `{overrides}`: {result.images_per_iteration} scored images per iteration "
            "for every arm.",
        "Arms":
            "each recipe as published (its own sampler, loss, updates per rollout and evaluation), "
            "Dynamic-TreeRPO with each tail, and the paper's parts switched off one at a time; run here: "
            f"{', '.join(a.name for a in result.arms)}." + (f" Not run: {skipped}." if skipped else "")
            + f" {_parts_words(result)}",
        "Budgets":
            f"equal scored images ({b.images} per run, {iterations} iterations) and equal training "
            f"seconds ({result.seconds:.3g} {label} seconds: {seconds_rule}); each run trains until it "
            "has met both (an arm still short of the seconds budget after "
            f"{b.max_iterations_factor}x the image budget's iterations stops there, marked "
            f"\"capped\"). Seconds are {_clock_words(result)}. Evaluation time is not charged.",
        "Budget check": budget_check(result),
        "Checkpoints":
            f"every arm is measured at the same {b.checkpoints} checkpoints of each budget, "
            f"k/{b.checkpoints} of it: images {image_cps}; {label} seconds {second_cps}. A run is "
            "measured at its first iteration at or past each (and once before training); the "
            "images and seconds it had actually spent then are what the plots use. Every arm's rewards "
            f"are compared at these checkpoints (at most {2 * b.checkpoints + 1} evaluations at them).",
        "Learning rates":
            f"each main arm is swept over {grid} ({_plural(b.sweep_iterations, 'iteration')}, seed "
            f"{b.sweep_seed}) and its rate chosen on validation pairs; when the best rate was the "
            "lowest (highest) swept, the arm was swept again at half (double) it, up to "
            f"{_plural(b.max_extensions, 'more rate')}, so that the chosen rate lies inside the swept range. "
            f"{edges} " + _ablation_rates(result),
        "Validation and test pairs":
            f"the sweep measures on validation pairs (eval seed {b.validation_seed}) "
            "drawn from the training prompts and sharing no prompt with the test "
            f"pairs of every figure below ({shared} shared, counted in every sweep "
            "run); the sweep's training leaves out both sets.",
        "Target":
            f"fixed from the sweep before any test run: {target['rule']}. Validation gains: {gains}; "
            f"target gain {target['gain']:+.4f}.{no_target} " + _convergence_words(result),
        "Time to target": _time_words(result),
        "Seeds and tests":
            f"{b.seeds} per arm ({b.first_seed}..{b.first_seed + b.seeds - 1}); the protocol's default is "
            "the fewest with which the exact test below can reach the primary family's threshold after "
            f"Holm: 2/2^n x {PRIMARY_CLAIMS} claims below {ALPHA} needs n = {needed}. A seed gives "
            "every arm the same prompts and LoRA initialisation, so two arms are compared by their "
            "per-seed differences, with two tests: the paired t test (scipy's `ttest_rel`; a ratio "
            "against a threshold: `ttest_1samp`), which assumes the differences are normal and has "
            f"{b.seeds - 1} degrees of freedom here, and the exact sign-flip (permutation) test, which "
            "assumes only that each difference is as likely positive as negative when the arms do not "
            "differ: of the 2^n ways to flip the differences' signs, p is the share whose mean is at "
            "least as far from 0 as the observed one. ± and the intervals are unadjusted 95% t "
            "intervals. When every seed gives the same difference the t test is undefined (no spread) "
            "and its column shows the exact test's p. What the exact test can reach with this many "
            "seeds is said at the top of the page.",
        "Against every baseline":
            "each primary claim about the tree is tested against every main baseline that ran "
            f"({baselines}), none picked on validation, and is met only when it is met against each one: an "
            "intersection-union test (Berger 1982, Technometrics 24: 295-300), whose p-value is the largest "
            "of its comparisons' raw p-values (the t tests' and the exact tests' apart), with no adjustment "
            "for their number. It is not met when the tree is worse than at least one baseline: its p-value "
            "is then k times the smallest raw p-value among the k comparisons against the claim "
            "(Bonferroni). \"About 50% training efficiency\" is the same over the two like-for-like pairs. "
            "The claim's p-values then enter the primary family's Holm adjustment. Each comparison is "
            "listed under the claims with its raw p-values and direction; none is adjusted or read as a "
            "verdict of its own.",
        "Multiple comparisons":
            "three families, each Holm-adjusted on its own: the primary family, the paper's claims about "
            f"the main arms ({_plural(family_size(tests, 'primary'), 'test')}); the ablation-claims family, "
            "the paper's claims that LayerTuning-RL and dynamic clipping help "
            f"({_plural(family_size(tests, 'ablation'), 'test')}; run by the ablation part); and the "
            "secondary family, every other comparison: like for like, the other ablations, the clip "
            f"treatments ({_plural(family_size(tests, 'secondary'), 'test')}). Each test's p-values are "
            "Holm-adjusted within its family; raw and adjusted are shown for both tests. A verdict "
            f"is **met** only when both adjusted p-values are below {ALPHA} and the difference lies on "
            f"the claimed side, **not met** only when both are below {ALPHA} on the other side, and "
            "**inconclusive** otherwise: a verdict that one test gives and the other does not is not "
            "printed. Rows marked \"no verdict\" are measurements (times to target on the checkpoint "
            "grid); they still count in their family's adjustment.",
        "Clip treatments":
            "as published, only the tree rescales its ratio clip to the measured ratio spread; "
            "the baselines keep their fixed bounds, which were measured not to bind on the embedded test "
            f"bed (the clip fraction below says how often each arm's did here). {treated[0].upper()}"
            f"{treated[1:]} are also run with the rescale on every arm (`rescale-all`) and on none (`none`); "
            "an arm that a treatment does not change keeps its published runs.",
    }
    return ["## Protocol", "", *(f"- **{k}:** {v}" for k, v in bullets.items()), ""]


def _recipes(result: ProtocolResult, rows: Sequence[dict[str, Any]]) -> list[str]:
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


def _terms(result: ProtocolResult) -> list[str]:
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


def _pairs_tables(result: ProtocolResult, tests: dict[str, Test], rows: Sequence[dict[str, Any]],
                  image_dir: str) -> list[str]:
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
                lines.append(f"| {tree} vs {base} | {nfe:.2f}x | {speed:.2f}x | {label} | {_test_cells(t)} |")
    lines.append("")
    if result.treatments:
        lines += ["### The like-for-like pairs under each clip treatment (secondary family)", "",
                  f"| pair | treatment | budget | {TEST_HEADER} |", f"|---|---|---|{TEST_RULE}|"]
        for a, b in LIKE_FOR_LIKE:
            for record in result.treatments:
                for axis, label in BUDGETS:
                    t = tests.get(f"reward:{axis}:{a}:{b}:{record['name']}")
                    if t is not None:
                        lines.append(f"| {a} vs {b} | {record['name']} | {label} | {_test_cells(t)} |")
        lines.append("")
        for record in result.treatments:
            status = "; ".join(f"{arm} {s}" for arm, s in record["arms"].items())
            status = status or "no like-for-like arm ran"
            lines.append(f"- `{record['name']}` ({record['description']}): {status}.")
        lines += ["", "The same pairs as published are the like-for-like rows above.", ""]
    lines += [f"![held-out reward against scored images]({image_dir}/protocol_reward_vs_images.png)", "",
              f"![held-out reward against training seconds]({image_dir}/protocol_reward_vs_seconds.png)", ""]
    return lines


def _ablations(result: ProtocolResult, tests: dict[str, Test], rows: Sequence[dict[str, Any]]) -> list[str]:
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
                cells = None if t is None else _test_cells(_flipped(t))
            else:
                t = tests.get(f"reward:{axis}:{arm.name}:{TREE}:published")
                note, cells = "secondary", None if t is None else _test_cells(t)
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


def _direction(t: Test) -> str:
    """A component's side: for the claim, against it, or none (a difference of 0)."""
    c = t.comparison
    if c is None:
        return "not measured"
    if c.difference == 0:
        return "none (0)"
    return "for the claim" if claimed_side(c, t.higher_is_better) else "against the claim"


def _components(tests: Sequence[Test]) -> list[str]:
    """Every comparison of the claims tested against several: raw p-values and side, nothing adjusted."""
    rows = [(t, c) for t in tests for c in t.components]
    if not rows:
        return []
    lines = ["### Each comparison of the claims", "",
             "The comparisons each claim above is tested on, one per baseline (or like-for-like pair): raw "
             "p-values, with no adjustment and no verdict of their own (the intersection-union test needs "
             "none; picking one out as a verdict would need a correction over all of them).", "",
             "| claim | against | difference (95% CI) | seeds | p, t test | p, exact | side |",
             "|---|---|---|---|---|---|---|"]
    for t, c in rows:
        seeds = "" if c.seeds is None else str(c.seeds)
        lines.append(f"| {t.group} | {c.against} | {c.value_text()} | {seeds} | {_p(c.p_value)} | "
                     f"{_p(c.p_exact)} | {_direction(c)} |")
    return [*lines, ""]


def _claims(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    lines = ["## The paper's claims on this test bed (primary family)", "",
             f"| claim | measure | {TEST_HEADER} |", f"|---|---|{TEST_RULE}|"]
    primary = [t for t in tests if t.family == "primary"]
    for t in primary:
        lines.append(f"| {t.group} | {t.measure} | {_test_cells(t)} |")
    lines += ["", "Each row is one claim against every comparator in its measure (an intersection-union "
              "test: above). Its difference is the comparison that sets its t-test p-value: the weakest "
              "win when every comparison lies on the claimed side, otherwise the strongest loss; its "
              "p-values are the intersection-union ones (or, against the claim, the Bonferroni ones).", "",
              f"\"about 50% training efficiency\" is tested twice on the per-seed ratios of median "
              f"iteration times: against {EFFICIENCY_AT_MOST}x (a generous reading, \"at most 0.6x\") and "
              f"against {EFFICIENCY_HALF}x (\"at most half\"), each with the one-sample t test and the exact "
              "sign-flip test of ratio minus threshold, for both like-for-like pairs; the claim is the ratio "
              "below the threshold. The ratio itself, with its 95% t interval, is a measurement whatever the "
              "verdict.", ""]
    reasons = list(dict.fromkeys(t.descriptive for t in primary if t.descriptive))
    if reasons:
        lines += [f"Time-to-target rows (\"no verdict\"): {'; '.join(reasons)}.", ""]
    lines += _components(primary)
    first = [t for t in tests if t.family == "secondary" and t.key.startswith("time:") and
             t.key.endswith(":every")]
    if first:
        lines += ["### Time to a first gain (secondary family)", "",
                  "The times to the first target (half the median gain), which most arms reach in one to "
                  "three iterations: per second they mostly measure what an iteration costs.", "",
                  f"| measure | what | {TEST_HEADER} |", f"|---|---|{TEST_RULE}|",
                  *(f"| {t.group} | {t.measure} | {_test_cells(t)} |" for t in first), ""]
    lines += _time_per_seed(result)
    lines += clean_seconds(result, tests)
    return lines


def clean_seconds(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    """The runs another process disturbed (wall/CPU ratio), and the claims in seconds without them."""
    from .claims import all_tests
    from .disturbed import SECONDS_GROUPS, TOLERANCE, disturbed_runs, without

    runs = disturbed_runs(result)
    lines = ["### Clean seconds", "",
             "A run is marked disturbed when its wall seconds per CPU second exceed its arm's median by "
             f"more than {TOLERANCE - 1:.0%} (another process on the same cores: its wall time rises, and "
             "its CPU seconds per iteration often with it, as waiting threads spin)."]
    if not runs:
        return [*lines[:-1], lines[-1] + " None was.", ""]
    load = any(d.load for d in runs)
    lines += ["", "| arm | seed | wall / CPU | its arm's median | CPU s per iteration / arm's median |"
              + (" load at start, end |" if load else ""),
              "|---|---|---|---|---|" + ("---|" if load else "")]
    for d in runs:
        cells = f"| {d.arm} | {d.seed} | {d.ratio:.2f} | {d.arm_ratio:.2f} | {d.cpu_per_iteration:.2f}x |"
        if load:
            cells += " " + (", ".join(f"{v:.1f}" for v in d.load) if d.load else "not recorded") + " |"
        lines.append(cells)
    clean = {t.key: t for t in all_tests(without(result, runs))}
    these = "this one (its seed leaves the pairs it was in)" if len(runs) == 1 else \
        f"these {len(runs)} (their seeds leave the pairs they were in)"
    lines += ["", f"The claims in seconds with every run, and without {these}:", "",
              "| claim | every run | verdict | without the disturbed runs | verdict |",
              "|---|---|---|---|---|"]
    for t in tests:
        if t.family != "primary" or not t.group.startswith(SECONDS_GROUPS) or t.key not in clean:
            continue
        c = clean[t.key]
        lines.append(f"| {t.group} | {_short_value(t)} | {_word(t)} | {_short_value(c)} | {_word(c)} |")
    return [*lines, ""]


def _word(t: Test) -> str:
    return t.verdict if t.verdict in ("met", "not met") else "inconclusive"


def _ablation_claims(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    rows = [t for t in tests if t.family == "ablation"]
    lines = ["## The paper's ablation claims (ablation-claims family)", ""]
    if not rows:
        return [*lines, "The ablation arms have not run here (`treerpo bench protocol --part ablations` with "
                "the same `--out`), so these claims are not tested on this page.", ""]
    lines += _group_table("claim", rows)
    rival = [t for t in tests if t.group == "dynamic clipping vs the best fixed clip"]
    if rival:  # the fixed clip whose bound the ablation part swept on validation, at the same rate
        lines += ["", "The dynamic clip against its best fixed clip (the bound the ablation part swept on "
                  "validation at the dynamic clip's rate; secondary family):", "",
                  *_group_table("comparison", rival)]
    return [*lines, ""]


def _group_table(first: str, tests: Sequence[Test]) -> list[str]:
    """A table of tests, one row each: its group, what it measures, and its test cells."""
    return [f"| {first} | measure | {TEST_HEADER} |", f"|---|---|{TEST_RULE}|",
            *(f"| {t.group} | {t.measure} | {_test_cells(t)} |" for t in tests)]


def _time_per_seed(result: ProtocolResult, name: str = "target") -> list[str]:
    """Per main arm and seed: min(time to target, budget) and where it was timed (the iteration, or the
    checkpoint on runs evaluated at the checkpoints only), so a reader sees what decided each time;
    followed by the same for the convergence target where there is one."""
    view = result.at_convergence() if name == "target" else None
    after = _time_per_seed(view, "the convergence target") if view is not None else []
    if not result.target["usable"] or TREE not in {a.name for a in result.arms}:
        return after
    arms = [TREE, *result.baselines]
    seeds = sorted({r.seed for name in arms for r in result.runs_of(name)})
    if not seeds:
        return []
    title = "the first gain" if view is not None else name
    lines = [f"### Time to {title} per seed", "",
             f"min(time to {title} ({result.target['gain']:+.4f}), budget) per seed, and where each run was "
             "timed: " +
             ("the first iteration at the target (every iteration was evaluated until then)."
              if per_iteration_times(result) else "the first checkpoint at the target (these runs were "
                                                   "evaluated at the checkpoints only)."), ""]
    for axis, _ in BUDGETS:
        unit = "scored images" if axis == "images" else f"{clock_label(result.clock)} seconds"
        lines += [f"| {unit} to target | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                  "|---|" + "---|" * len(seeds)]
        for arm in arms:
            runs = {r.seed: r for r in result.runs_of(arm)}
            cells = []
            for seed in seeds:
                run = runs.get(seed)
                if run is None:
                    cells.append("")
                    continue
                time = capped_times(result, [run], axis)[0]
                cells.append(f"{time:.4g} ({time_where(result, run, axis)})")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines.append("")
    return [*lines, *after]


GPU = (
    "## On a GPU: FLUX or SD3 with a model reward",
    "",
    "The same command takes a FLUX or SD3 config: every arm trains on top of it (the file as written, then "
    "`--set`), each baseline samples with the tree's number of steps and scores the tree's images per "
    "prompt (its group size; BranchGRPO's number of splits), and with the model on CUDA the seconds are wall "
    "seconds (`--clock auto`). For example, the paper's setting on FLUX.1-dev with HPS-v2.1 (docs/models.md "
    "says where each file comes from):",
    "",
    "```bash",
    "treerpo bench protocol configs/flux_dev_paper.yaml \\",
    "  --set model.path=/models/FLUX.1-dev \\",
    "  --set data.prompts=hpdv2_train.txt --set data.eval_prompts=hpdv2_test.txt \\",
    "  --set \"reward_weights={hps-v2.1: /models/HPS_v2.1_compressed.pt}\" \\",
    "  --set data.eval_pairs=64 \\",
    "  --arms dynamic_treerpo_euler,mixgrpo,flow_grpo_fast,diffusionnft --images 1024 \\",
    "  --out runs/protocol_flux --docs runs/protocol_flux/results.md",
    "```",
    "",
    "- **Cost.** Before training the command prints its plan (runs x iterations) and, after the sweep, the "
    "wall time the sweep's iteration and evaluation times predict for the part (with a warning when the "
    "main part is expected past 150 min). Every main arm and ablation at the default seeds is days of FLUX "
    "training: choose arms (`--arms`; MixGRPO sets the equal-seconds budget, else give `--seconds`), "
    "seeds (`--seeds`, at least 2 for the paired tests; a verdict needs the exact test too, which in a "
    "family of m tests needs 2m/2^seeds below 0.05: the default, "
    f"{seeds_for_exact(PRIMARY_CLAIMS)} seeds for the primary family's {PRIMARY_CLAIMS} claims), images "
    "(`--images`), checkpoints (`--checkpoints`), rates (`--lrs`, `--max-extensions`, `--sweep-iterations`) "
    "and parts (`--part main`, the default: the sweep and the main arms; `--part ablations` with the same "
    "`--out` afterwards: the ablation arms and the clip treatments). `--quick` is a smoke run of the same "
    "pipeline, every part in one command (2 seeds, one prompt per iteration, 16 scored images per run).",
    "- **Stopped runs.** `protocol.json` is saved after the sweep and after every test run; the same "
    "command with `--resume` keeps the sweep's rates and target and runs only what is missing (a different "
    "budget, bed or set of arms is refused in one line).",
    "- **Evaluation** is not charged to the budgets but takes time: `data.eval_pairs` images of "
    "`sampling.eval_steps` steps at each of up to 2 x 8 + 1 checkpoints per run, and after every iteration "
    "of a main arm's run until it reaches the target. The paper's 400 HPDv2 test prompts at 25 steps, 17 "
    "times a run, would outlast the training: set `data.eval_pairs` (64 above).",
    "- **Validation pairs** are drawn from the training prompt file (never from `data.eval_prompts`) with "
    "eval seed 777, leaving out every test prompt, so the training file must hold more distinct prompts "
    "than `data.eval_pairs`.",
    "- **Memory.** Runs follow each other in one process; each loads the model afresh and the previous one "
    "is freed first, so the GPU needs room for one run, as `treerpo train` does.",
    "",
)


SCOPE = (
    "## Scope",
    "",
    "- On the embedded default this is a 1.85M-parameter model on CPU with the task of the test bed above, "
    "not FLUX on GPUs. Forward counts are properties of the plans and carry over (`treerpo nfe`, "
    "training.md); seconds and rewards are the test bed's. The same command runs on a FLUX or SD3 config "
    "with a model reward (above).",
    "- Whether the budget separates gains from seed noise at all is the budget check above; differences "
    "between recipes much smaller than the default's own 95% half-width need more images or seeds than "
    "this page spends to leave \"inconclusive\".",
    "- Equal seconds give an arm with a cheaper iteration more iterations on the same prompts: a recipe "
    "that overshoots the reward's optimum with more updates loses there what it won at equal images. The "
    "curves show both.",
    "- Seeds are the outer loop, so a slow period hits the arms of one seed, not one arm; the per-iteration "
    "CPU and wall seconds of every run are in `protocol.json`.",
    "- Each held-out measurement is one fixed set of test prompt/seed pairs, the same for every arm, so its "
    "sampling noise is shared by the pairs compared but not removed from each arm's own figure.",
    "- The sampler's own overhead and memory: [sampler.md](sampler.md).",
)


def _header(result: ProtocolResult) -> list[str]:
    """The commands that made the page's protocol.json, with the wall time of each part."""
    commands = result.command.splitlines() or ["treerpo bench protocol"]
    times = {"main": "main part", "ablations": "ablation part", "all": "every part"}
    parts = "; ".join(f"{times.get(k, k)} {v / 60:.0f} min" for k, v in result.part_wall_s.items())
    wall = f"wall time {result.wall_s / 60:.0f} min" + (f": {parts}" if len(result.part_wall_s) > 1 else "")
    how = "one command" if len(commands) == 1 else f"{len(commands)} commands, in order"
    return [f"Generated by {how} (it trains everything below; {wall}):", "", "```bash", *commands, "```", "",
            code_text(result.code)]


def code_text(code: Sequence[dict[str, Any]]) -> str:
    """Which code version made the runs: one for a published protocol."""
    from ..common.provenance import distinct, machines_line
    from ..common.provenance import version_name as name

    unique = distinct(code)
    if not unique:
        return "This protocol.json recorded no code version (it was made before 0.3.1)."

    parts = ", ".join(dict.fromkeys(c["part"] for c in code))
    where = machines_line(code)
    where = f" {where}" if where else ""
    if len(unique) == 1:
        return f"Every part ({parts}) ran at one code version: {name(unique[0])}.{where}"
    return "The parts ran at **more than one code version**: " + ", ".join(map(name, unique)) + f".{where}"



def markdown(result: ProtocolResult, tests: Sequence[Test], rows: Sequence[dict[str, Any]],
             image_dir: str) -> str:
    """docs/results.md: the protocol, its tables, plots and the claims tables."""
    by_key = {t.key: t for t in tests}
    where = "the embedded test bed" if result.config is None else f"`{result.config}`"
    lines = [
        f"# Results: the paper's claims on {where}",
        "",
        *_header(result),
        "",
        "Every figure below is computed from that run's `protocol.json` alone: `treerpo bench report --out "
        "<its --out folder> --docs <this page>` rebuilds the page without training. Each comparison shows "
        "the number of paired seeds and two tests, the paired t test and the exact sign-flip test, raw and "
        "Holm-adjusted; a verdict is printed only where both agree (the rules are below). "
        + reach_text(tests, result.budget.seeds),
        "",
        *_protocol(result, tests),
        "## Learning-rate sweep (validation pairs)",
        "",
        *_sweep_table(result),
        "",
        *_recipes(result, rows),
        *_terms(result),
        *_pairs_tables(result, by_key, rows, image_dir),
        *_ablations(result, by_key, rows),
        *_claims(result, tests),
        *_ablation_claims(result, tests),
        *GPU,
        *SCOPE,
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the README's verdict table
README_BEGIN = "<!-- bench protocol claims: begin -->"
README_END = "<!-- bench protocol claims: end -->"


def _short_value(t: Test) -> str:
    """A claim's figure in two significant digits, its 95% interval and the comparator it is against:
    the README's short form of ``Test.value_text`` (the page keeps four digits)."""
    c = t.comparison
    if c is None:
        return t.note
    sign = "" if t.offset else "+"
    d, lo, hi = (v + t.offset for v in (c.difference, c.low, c.high))
    unit = " images" if t.key.startswith(("time:images", "convergence:images")) else t.unit  # as measured
    text = f"{d:{sign}.2g}{unit} ({lo:{sign}.2g} .. {hi:{sign}.2g})"
    if t.binding is not None and t.union is not None:
        text += f" vs {t.binding.against}"
    return text


def _p_text(p: float) -> str:
    return "n/a" if math.isnan(p) else f"{p:.2g}"


def readme_claims(result: ProtocolResult, tests: Sequence[Test]) -> str:
    """The README's short verdict table, between its markers: per claim of the primary and
    ablation-claims families, the figure with its 95% interval and the verdict ("met" and "not met" only
    where the t test and the exact test both give it after Holm; everything else "inconclusive"). The
    p-values and what each verdict rests on are on the results page it links to."""
    lines = [README_BEGIN,
             f"| the paper's claim | on the CPU test bed, {result.budget.seeds} paired seeds: mean (95% CI) "
             "| Holm p: t test, exact | verdict |", "|---|---|---|---|"]
    for t in tests:
        if t.family not in ("primary", "ablation"):
            continue
        verdict = t.verdict if t.verdict in ("met", "not met") else "inconclusive"
        ps = f"{_p_text(t.p_adjusted)}, {_p_text(t.p_exact_adjusted)}"
        lines.append(f"| {t.group} | {_short_value(t)} | {ps} | {verdict} |")
    commands = " then ".join(f"`{c}`" for c in result.command.splitlines())
    lines += ["", f"From {commands}; rendered by `treerpo bench report --readme`. A verdict needs a paired t "
              "test and an exact sign-flip test to agree after Holm's correction, against every baseline "
              "at once (the figure is against the one that decides); both p-values of every comparison: "
              "[docs/results.md](docs/results.md)."]
    lines += _readme_disturbed(result, tests)
    if not any(t.family == "ablation" for t in tests):
        lines += ["The paper's ablation claims (LayerTuning-RL, dynamic clipping) are untested at this "
                  "number of seeds, not inconclusive: this run holds no ablation part (`--part ablations`)."]
    return "\n".join([*lines, README_END])


def _readme_disturbed(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    """One line when leaving out the runs another process disturbed changes a verdict in seconds."""
    from .claims import all_tests
    from .disturbed import disturbed_runs, without

    runs = disturbed_runs(result)
    if not runs:
        return []
    clean = {t.key: t for t in all_tests(without(result, runs))}
    changed = [f"{t.group} reads {_word(clean[t.key])}" for t in tests
               if t.family == "primary" and t.key in clean and _word(clean[t.key]) != _word(t)]
    if not changed:
        return []
    return [f"Without the {len(runs)} runs another process disturbed (wall/CPU ratio; docs/results.md, "
            f"\"Clean seconds\"): {'; '.join(changed)}."]


def with_readme_claims(text: str, table: str) -> str:
    """``text`` (the README) with the block between its markers replaced by ``table``."""
    return replace_marked(text, README_BEGIN, README_END, table, "verdict table")
