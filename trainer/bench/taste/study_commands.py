"""The command lines of the studies beside ``treerpo bench taste``'s table, each ``treerpo bench taste-...``:

- ``taste-weight``: the method at another fixed picks weight on a table's frontier (an ablation arm);
- ``taste-assemble``: the default that chooses the weight, assembled from runs at fixed weights;
- ``taste-check``: one seed of the default run afresh, beside the stored runs it is assembled from;
- ``taste-levers``: 0.3.0's comparison of the levers on the same picks;
- ``taste-guard-steps``: whether cheaper images could measure the guard's fall more precisely;
- ``taste-rewards``: which personal-reward head orders a hidden taste best from the same picks (no RL);
- ``taste-cost``: what training from picks costs as the node runs it, the default beside the alternatives;
- ``taste-order``: the guard's backward measuring order replayed on stored runs that measured every point;
- ``taste-sets``: one template run measured on more seed sets than the two its row is judged on.

Why subcommands and not options of ``bench taste``: each reads other inputs and writes other files, so
each ``--help`` says only what that study takes.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

TASTES_HELP = "comma-separated hidden tastes (names of trainer/bench/taste/hidden_tastes.py)"
WEIGHT_DESCRIPTION = (
    "The method at a fixed picks weight on the frontier stored by a bench taste run (--frontier-from), "
    "with that run's budget, person, trees and --set options: it differs from the run in the weight "
    "alone, so the two pair seed by seed (bench taste --report --arm NAME=OUT). Run it from the code "
    "version that made the frontier."
)
ASSEMBLE_DESCRIPTION = (
    "Per taste, seed and tree count, the run the default (the guard choosing the picks weight) keeps, "
    "from bench taste and taste-weight runs of one commit on one frontier: out/<taste>/taste.json, which "
    "bench taste --report reads like any run. No training."
)
CHECK_DESCRIPTION = (
    "Runs one seed of a stored table with the guard choosing the picks weight, on the table's own "
    "frontier, and prints the validation gains and test figures beside those the stored runs at each "
    "weight hold, to compare digit for digit (with the table's CPU kernels). It reproduces; it does not "
    "publish."
)
LEVERS_DESCRIPTION = (
    "The first version's guard, the default, the guard steering the weight, a higher fixed weight and two "
    "rounds of picks, on the same picks and seeds, each against the oracle frontier and paired per seed "
    "with the default; out/<taste>_<seed>.json is written after every arm (a stopped run resumes)."
)
GUARD_STEPS_DESCRIPTION = (
    "Trains the hidden taste under the guard, then measures every point of its trail on the validation "
    "pairs at the full sampling steps and at fewer: per step count the cheap fall's bias, its rank "
    "agreement, the per-pair correlation and the two-phase standard error against the plain one at equal "
    "cost."
)
REWARDS_DESCRIPTION = (
    "Grows one pool of base-model trees; per hidden taste, seed and labelled-tree count the simulated "
    "person labels the first trees, each personal-reward head on each backbone is fitted on those picks "
    "and scored on held-out trees against the hidden taste itself (pair accuracy, Spearman per tree), "
    "paired with the linear head. No training; out/rewards.json keeps every per-seed value."
)


def add_study_commands(kinds: argparse._SubParsersAction) -> None:
    """``bench taste-weight``, ``taste-assemble``, ``taste-check``, ``taste-levers``,
    ``taste-guard-steps`` and ``taste-rewards``."""
    _add_weight(kinds)
    _add_assemble(kinds)
    _add_check(kinds)
    _add_levers(kinds)
    _add_guard_steps(kinds)
    _add_rewards(kinds)
    _add_cost(kinds)
    _add_order(kinds)
    _add_sets(kinds)


def _command(name: str, args: argparse.Namespace, flags: tuple[str, ...]) -> str:
    """The command line of ``treerpo bench NAME`` that repeats ``args`` (recorded in what it writes)."""
    parts = ["treerpo", "bench", name]
    for flag in flags:
        value = getattr(args, flag)
        option = f"--{flag.replace('_', '-')}"
        if isinstance(value, bool):
            parts += [option] * value
        elif isinstance(value, list):
            for item in value:
                parts += [option, str(item)]
        elif value is not None:
            parts += [option, str(value)]
    return shlex.join(parts)


def _add_weight(kinds: argparse._SubParsersAction) -> None:
    w = kinds.add_parser("taste-weight", help="the taste method at another fixed picks weight on a bench "
                         "taste run's frontier (an ablation arm of the weight)",
                         description=WEIGHT_DESCRIPTION)
    w.add_argument("--tastes", required=True, help=TASTES_HELP)
    w.add_argument("--seeds", type=int, default=5, help="seeds (default %(default)s)")
    w.add_argument("--trees", type=int, default=50, help="labelled trees (default %(default)s)")
    w.add_argument("--weight", type=float, required=True, help="the method's fixed picks weight")
    w.add_argument("--frontier-from", type=Path, required=True, metavar="DIR",
                   help="the bench taste run (DIR/<taste>/taste.json) whose frontier, budget and options "
                        "the arm takes")
    w.add_argument("--out", type=Path, required=True, help="where <taste>/taste.json go")
    w.add_argument("--resume", action="store_true", help="keep the seeds already in --out")
    w.set_defaults(func=_run_weight)


def _run_weight(args: argparse.Namespace) -> int:
    from .weight_arm import run_arm

    command = _command("taste-weight", args, ("tastes", "seeds", "trees", "weight", "frontier_from", "out",
                                              "resume"))
    for taste in args.tastes.split(","):
        print(run_arm(taste.strip(), args.frontier_from, args.out, args.seeds, args.trees, args.weight,
                      args.resume, command))
    return 0


def _add_assemble(kinds: argparse._SubParsersAction) -> None:
    a = kinds.add_parser("taste-assemble", help="the taste default that chooses the picks weight, assembled "
                         "from bench taste runs at fixed weights (no training)",
                         description=ASSEMBLE_DESCRIPTION)
    a.add_argument("--runs", type=Path, action="append", required=True, metavar="DIR",
                   help="a bench taste output folder at one fixed weight (repeat; the first weight is tried "
                        "first)")
    a.add_argument("--tastes", default=None,
                   help="comma-separated (default: every taste of the first --runs)")
    a.add_argument("--out", type=Path, required=True, help="where the assembled <taste>/taste.json go")
    a.add_argument("--docs", type=Path, default=None,
                   help="write the assembled table into this page, between its markers "
                        "(docs/results-taste.md); the text around them is kept")
    a.add_argument("--readme", type=Path, default=None,
                   help="write the README's taste block from the assembled default, with one line against "
                        "the first --runs (README.md)")
    a.add_argument("--summary", type=Path, default=None, metavar="PAGE",
                   help="write the same block between the taste summary markers of PAGE (e.g. "
                        "docs/results.md), its link relative to PAGE; refused when PAGE lacks the markers")
    a.set_defaults(func=_run_assemble)


def _run_assemble(args: argparse.Namespace) -> int:
    from .assemble import assemble, write_assembled
    from .readme import check_summary_page

    command = _command("taste-assemble", args, ("runs", "tastes", "out", "docs", "readme", "summary"))
    for page, option in ((args.readme, "--readme"), (args.summary, "--summary")):
        if page is not None:  # refused before anything is written
            check_summary_page(page, option)
    tastes = args.tastes.split(",") if args.tastes else None
    assembled = assemble(args.runs, args.out, tastes, command)
    if assembled:
        write_assembled(assembled, args.runs, command, args.docs, args.readme, args.summary)
    return 0


def _add_check(kinds: argparse._SubParsersAction) -> None:
    c = kinds.add_parser("taste-check", help="one seed of the taste default run afresh on a stored table's "
                         "frontier, printed beside the stored runs at each weight",
                         description=CHECK_DESCRIPTION)
    c.add_argument("--taste", required=True, help="one hidden taste")
    c.add_argument("--seed", type=int, default=0, help="the seed (default %(default)s)")
    c.add_argument("--trees", type=int, default=50, help="labelled trees (default %(default)s)")
    c.add_argument("--weights", default="0.3,0.5", help="the picks weights the guard chooses among "
                   "(default %(default)s)")
    c.add_argument("--table", type=Path, required=True, help="the stored run at the first weight")
    c.add_argument("--arm", type=Path, action="append", default=[], help="stored runs at the others (repeat)")
    c.set_defaults(func=_run_check)


def _run_check(args: argparse.Namespace) -> int:
    from .default_check import check_default

    weights = tuple(float(w) for w in args.weights.split(","))
    check_default(args.taste, args.seed, args.trees, weights, args.table, args.arm)
    return 0


def _add_levers(kinds: argparse._SubParsersAction) -> None:
    v = kinds.add_parser("taste-levers", help="0.3.0's comparison of the levers of learning from picks, on "
                         "the same picks and seeds",
                         description=LEVERS_DESCRIPTION)
    v.add_argument("--tastes", default="lower_objects,warm_shades,larger_objects",
                   help=f"{TASTES_HELP} (default %(default)s)")
    v.add_argument("--seeds", type=int, default=2, help="seeds (default %(default)s)")
    v.add_argument("--trees", type=int, default=50, help="labelled trees (default %(default)s)")
    v.add_argument("--out", type=Path, default=Path("runs/levers"), help="where <taste>_<seed>.json go")
    v.add_argument("--report", action="store_true", help="run nothing: print the table of --out")
    v.add_argument("--arms", default=None, metavar="NAME;NAME",
                   help="run only these arms (names as in the table, ';'-separated); the others are read "
                        "from --out where there")
    v.set_defaults(func=_run_levers)


def _run_levers(args: argparse.Namespace) -> int:
    from .levers import check_arms, run_levers, table

    wanted = args.arms.split(";") if args.arms else None
    check_arms(wanted or [])
    print(table(run_levers(args.tastes.split(","), args.seeds, args.trees, args.out, args.report, wanted)))
    return 0


def _add_guard_steps(kinds: argparse._SubParsersAction) -> None:
    g = kinds.add_parser("taste-guard-steps", help="whether images of fewer sampling steps could measure the "
                         "guard's fall more precisely at the same cost (the taste bed's oracle)",
                         description=GUARD_STEPS_DESCRIPTION)
    g.add_argument("--tastes", default="lower_objects,warm_shades",
                   help=f"{TASTES_HELP} (default %(default)s)")
    g.add_argument("--seeds", type=int, default=1, help="seeds (default %(default)s)")
    g.add_argument("--weight", type=float, default=0.5,
                   help="the oracle's taste weight (default %(default)s)")
    g.add_argument("--steps", default="2,3,5", help="the cheap step counts (default %(default)s)")
    g.add_argument("--out", type=Path, required=True, help="where <taste>_<seed>.json go")
    g.add_argument("--report", action="store_true", help="print the table from the runs in --out")
    g.set_defaults(func=_run_guard_steps)


def _run_guard_steps(args: argparse.Namespace) -> int:
    from .guard_steps import report, run_guard_steps

    steps = [int(k) for k in args.steps.split(",")]
    print(report(run_guard_steps(args.tastes.split(","), args.seeds, args.weight, steps, args.out,
                                 args.report)))
    return 0


def _add_rewards(kinds: argparse._SubParsersAction) -> None:
    r = kinds.add_parser("taste-rewards", help="which personal-reward head and backbone order a hidden taste "
                         "best from the same picks (a screen, no RL)", description=REWARDS_DESCRIPTION)
    r.add_argument("--tastes", default=None,
                   help=f"{TASTES_HELP} or of the generated family (default: the five named and the family)")
    r.add_argument("--seeds", type=int, default=None, help="seeds (default 3)")
    r.add_argument("--trees", default=None, help="comma-separated labelled-tree counts (default 25,50)")
    r.add_argument("--heads", default=None, help="comma-separated picks.head values, linear among them "
                   "(default linear,quadratic,kernel)")
    r.add_argument("--backbones", default=None, help="comma-separated picks.backbone values, NAME or "
                   "NAME=WEIGHTS (default content)")
    r.add_argument("--candidates", type=int, default=None, help="trees the person labels from (default 150)")
    r.add_argument("--test", type=int, default=None, help="held-out trees that score the heads (default 40)")
    r.add_argument("--out", type=Path, default=Path("runs/taste-rewards"), help="where rewards.json goes")
    r.add_argument("--quick", action="store_true", help="a tiny pool and two tastes, in seconds (CI)")
    r.set_defaults(func=_run_rewards)


def _run_rewards(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .reward_study import QUICK, QUICK_OVERRIDES, RewardStudyBudget, format_summary, run_reward_study

    command = _command("taste-rewards", args, ("tastes", "seeds", "trees", "heads", "backbones", "candidates",
                                               "test", "out", "quick"))
    budget = QUICK if args.quick else RewardStudyBudget()
    lists = {"tastes": args.tastes, "heads": args.heads, "backbones": args.backbones}
    changes: dict[str, object] = {k: tuple(v.strip() for v in value.split(",")) for k, value in lists.items()
                                  if value}
    if args.trees:
        changes["at"] = tuple(int(n) for n in args.trees.split(","))
    sizes = ("seeds", "candidates", "test")
    changes.update({k: getattr(args, k) for k in sizes if getattr(args, k) is not None})
    budget = replace(budget, **changes)
    result = run_reward_study(budget, args.out, QUICK_OVERRIDES if args.quick else (), command=command)
    print(format_summary(result["summary"], budget))
    print(f"{result['minutes']:.1f} min (the pool {result['pool_seconds']:.0f} s); every value in "
          f"{args.out / 'rewards.json'}")
    return 0


COST_DESCRIPTION = (
    "Trains the template's picks (its 12 trees, labelled by the simulated person) as the node does: the "
    "shipped default, the default measuring each checkpoint as it is kept, one training at one weight with "
    "the same guard, 0.5.0's two trainings where the default differs, and the small run (2 rounds of 4 "
    "prompts on 9 trees) with the default and each checkpoint measured as kept; prints each run's wall "
    "and CPU seconds, the training's and the guard's seconds and images, on this machine, in one table."
)


def _add_cost(kinds: argparse._SubParsersAction) -> None:
    c = kinds.add_parser("taste-cost", help="what training from picks costs as the node runs it: the default "
                         "beside one training and 0.5.0's two (seconds, images; one run, one machine)",
                         description=COST_DESCRIPTION)
    c.add_argument("--taste", default="larger_objects",
                   help="the simulated person's hidden taste (what it picks)")
    c.add_argument("--seed", type=int, default=0, help="the template's seed widget and the training seed")
    c.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    c.set_defaults(func=_run_cost)


def _run_cost(args: argparse.Namespace) -> int:
    import json

    from .cost import format_costs, run_cost

    rows = run_cost(args.taste, args.seed)
    print(format_costs(rows))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
        print(f"written: {args.out}")
    return 0


ORDER_DESCRIPTION = (
    "Per stored method run (every taste, seed and tree count of each --runs folder): the points the "
    "backward order (guard.measure: backward) would have measured, the guard's choice among them against "
    "its choice among every point, and the measurements each made."
)


def _add_order(kinds: argparse._SubParsersAction) -> None:
    o = kinds.add_parser("taste-order", help="the guard measuring the last checkpoint first, replayed on "
                         "stored bench taste runs that measured every checkpoint (no training)",
                         description=ORDER_DESCRIPTION)
    o.add_argument("--runs", type=Path, action="append", required=True, metavar="DIR",
                   help="a bench taste output folder (DIR/<taste>/taste.json; repeat)")
    o.set_defaults(func=_run_order)


def _run_order(args: argparse.Namespace) -> int:
    from .order_replay import load_runs, order_line, replay_runs

    total = {"runs": 0, "same": 0, "not_replayable": 0, "every": 0, "backward": 0}
    for folder in args.runs:
        runs = load_runs([folder])
        if not runs:
            raise ValueError(f"--runs {folder}: no <taste>/taste.json there")
        counts = replay_runs(runs)
        print(f"{folder}: {order_line(counts)}")
        total = {k: total[k] + counts[k] for k in total}
    print(f"all: {order_line(total)}")
    return 0


SETS_DESCRIPTION = (
    "Trains one run of the template row (bench taste --template: the template's 12 trees labelled by the "
    "simulated person, trained as the node trains them) and measures the base and the kept model on the "
    "guard's validation pairs, the row's test pairs and --sets further seed sets of the same prompts: "
    "which set is the unusual one, and whether the spread between sets is the guard's stated error. "
    "Writes out/<taste>_seed<seed>.json."
)


def _add_sets(kinds: argparse._SubParsersAction) -> None:
    s = kinds.add_parser("taste-sets", help="one template run measured on further seed sets of its prompts",
                         description=SETS_DESCRIPTION)
    s.add_argument("--taste", required=True,
                   help="one hidden taste (a name of trainer/bench/taste/hidden_tastes.py)")
    s.add_argument("--seed", type=int, default=0, help="the template row's seed to run again (default 0)")
    s.add_argument("--sets", type=int, default=4, help="further seed sets of 512 pairs (default 4)")
    s.add_argument("--out", type=Path, required=True, help="where <taste>_seed<seed>.json is written")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override, as the row's run had it (threads=1, ...)")
    s.set_defaults(func=_run_sets)


def _run_sets(args: argparse.Namespace) -> int:
    from .pair_sets import run_sets

    if args.sets < 2:
        raise ValueError(f"--sets must be at least 2 (a spread needs two further sets), got {args.sets}")
    run_sets(args.taste, args.seed, args.sets, args.out, args.overrides)
    return 0
