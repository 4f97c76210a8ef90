"""The page's opening sections: what the exact test can reach with the seeds run, and the protocol as
run (test bed, arms, budgets, checkpoints, rates, target, tests), every rule a reader needs to judge a
verdict, stated next to the figures it made."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..common.stats import ALPHA, exact_floor, mean_ci95, seeds_for_exact
from .arms import TREE
from .claims import FAMILIES, FAMILY_NAMES, Test, clock_label, family_size, resolved_per_iteration
from .results import PRIMARY_CLAIMS, ProtocolResult


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


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


def _bed_text(result: ProtocolResult) -> str:
    """The test bed in the reader's words: a given config, or the embedded default with its task."""
    taste = any(o.startswith("reward=scene:0.5,function") for o in result.base_overrides)
    # runs timed per iteration were made after each recipe got its anchor's rule for a reward mix
    mix = ("each recipe combining the two as its anchor does (Flow-GRPO, DiffusionNFT, AWM and DGPO: their "
           "raw weighted sum; the others: each normalised within its prompt's images, then weighted)"
           if per_iteration_times(result) else "each normalised within its prompt's images (for every "
           "recipe: these runs predate each recipe's own rule, docs/algorithm.md)")
    return (f"`{result.config}`" if result.config is not None
            else "the embedded default model (`configs/default.yaml`) with the taste task: the scene reward "
                 "mixed half and half with a taste for larger objects "
                 f"(`trainer/bench/taste/hidden_tastes.py`), {mix}; "
                 "the held-out reward is their weighted sum"
            if taste else "the embedded default model and scene reward (`configs/default.yaml`)")


def _run_bullets(result: ProtocolResult) -> dict[str, str]:
    """The protocol's bullets on what ran: the bed, the arms, the budgets and the checkpoints."""
    b, cps = result.budget, result.checkpoints
    label = clock_label(result.clock)
    iterations = int(result.images_limit) // result.images_per_iteration
    overrides = " ".join(result.base_overrides) or "no overrides"
    skipped = "; ".join(f"{k} ({v})" for k, v in result.skipped.items())
    seconds_rule = ("MixGRPO's median sweep iteration times the image budget's iterations"
                    if b.seconds is None else "as given")
    image_cps = ", ".join(f"{c:.0f}" for c in cps["images"])
    second_cps = ", ".join(f"{c:.3g}" for c in cps["seconds"])
    return {
        "Test bed":
            f"{_bed_text(result)}, with `{overrides}`: {result.images_per_iteration} scored images per "
            "iteration for every arm.",
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
    }


def _rate_bullets(result: ProtocolResult) -> dict[str, str]:
    """The protocol's bullets on what the sweep fixed before any test run: the rates and the target."""
    b, target = result.budget, result.target
    outside = [arm for arm, g in result.grid.items() if not g["inside"]]
    shared = max((r["test_prompts_in_validation"] for r in result.sweep), default=0)
    gains = ", ".join(f"{k} {v:+.4f}" for k, v in target["validation_gains"].items())
    grid = ", ".join(f"{lr:g}" for lr in b.lrs)
    edges = ("Every chosen rate is inside its range." if not outside else
             f"The extension limit was hit for {', '.join(outside)}: the chosen rate is at an edge.")
    no_target = "" if target["usable"] else " It is not positive, so times to target are not measured."
    return {
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
    }


def _seeds_bullet(result: ProtocolResult) -> str:
    """How two arms are compared over their paired seeds, and with which two tests."""
    b = result.budget
    needed = seeds_for_exact(PRIMARY_CLAIMS)
    return (
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
        "seeds is said at the top of the page.")


def _test_bullets(result: ProtocolResult, tests: Sequence[Test]) -> dict[str, str]:
    """The protocol's bullets on how a verdict is reached: the tests, the baselines, the families and
    the clip treatments."""
    baselines = ", ".join(result.baselines) or "none ran"
    treated = "the like-for-like pairs" if result.treatments else "the like-for-like pairs (not run yet)"
    return {
        "Seeds and tests": _seeds_bullet(result),
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


def protocol_section(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    """The section "Protocol": one bullet per rule, in the order a reader meets them."""
    bullets = {**_run_bullets(result), **_rate_bullets(result), **_test_bullets(result, tests)}
    return ["## Protocol", "", *(f"- **{k}:** {v}" for k, v in bullets.items()), ""]
