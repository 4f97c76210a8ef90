"""The command lines of the taste wing's two benchmarks: ``treerpo bench taste`` (the table) and ``bench
picking`` (how many clicks); the studies beside the table are in ``study_commands.py``. ``trainer/cli.py``
adds them all under ``bench``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_taste_commands(kinds: argparse._SubParsersAction) -> None:
    """``bench taste``, the studies beside it (``bench taste-...``) and ``bench picking``."""
    from .study_commands import add_study_commands

    add_taste_table(kinds)
    add_study_commands(kinds)
    add_picking(kinds)


def add_taste_table(kinds: argparse._SubParsersAction) -> None:
    """``bench taste``: its options."""
    t = kinds.add_parser("taste", help="learning a person's taste from picks under the guard, on "
                         "every taste, against the oracle frontier (a simulated person)",
                         description="Per taste and seed: a simulated person labels trees with a hidden "
                                     "taste (likes 2, dislikes 1, 15%% mistakes); the default method trains "
                                     "from the first 25, 50 and 100 labelled trees under the guard; the "
                                     "oracle frontier trains the hidden taste itself at several weights. "
                                     "out/<taste>/taste.json is written after every seed. --report "
                                     "--docs docs/results-taste.md rebuilds the taste page from stored "
                                     "runs. Beside the table: bench taste-weight (another fixed picks "
                                     "weight on its frontier), taste-assemble (the default that chooses "
                                     "the weight, from those runs), taste-check, taste-levers and "
                                     "taste-guard-steps.")
    t.add_argument("--tastes", default=None, metavar="NAME,NAME,...",
                   help="hidden tastes: names of trainer/bench/taste/hidden_tastes.py, family_NN of the "
                        "generated family (trainer/bench/taste/family.py; 'family' names all of it), or "
                        "MODULE:FUNCTION / FILE.py:FUNCTION ((images, prompts) -> one score per image); "
                        "default larger_objects, central_objects, deep_shades, lower_objects, warm_shades "
                        "(--quick: larger_objects, lower_objects)")
    add_budget_options(t)
    t.add_argument("--trees", type=int, default=None, help="labelled trees (default 100)")
    t.add_argument("--seeds", type=int, default=None, help="seeds (default 5)")
    t.add_argument("--iterations", type=int, default=None,
                   help="training iterations per run (default: the budget's)")
    t.add_argument("--at", default=None, metavar="N,N,...",
                   help="labelled-tree counts to measure at (default 25,50,100; always --trees)")
    t.add_argument("--keep", choices=("strictly", "closely", "loosely"), default=None,
                   help="the guard's limit (default closely)")
    t.add_argument("--rounds", type=int, choices=(1, 2), default=None,
                   help="2: half the clicks on base-model trees, half on trees of the first round's model "
                        "(default 1)")
    t.add_argument("--mistakes", type=float, default=None,
                   help="the simulated person's share of random marks (default 0.15; 0: error-free picks)")
    t.add_argument("--picks-weights", default=None, metavar="W,W,...",
                   help="the picks weights the method trains at, one training each, keeping the run whose "
                        "choice gained the most personal reward on validation pairs (default 0.4, as "
                        "guard.weights: one training; 0.3,0.5: 0.5.0's two)")
    t.add_argument("--quick", action="store_true", help="a smoke run (2 tastes, 6 trees, 2 seeds): CI's")
    t.add_argument("--out", type=Path, default=Path("runs/taste"), help="where <taste>/taste.json go")
    t.add_argument("--resume", action="store_true",
                   help="keep the seeds already in --out and run the rest (the same budget only)")
    t.add_argument("--frontier-from", type=Path, default=None, metavar="DIR",
                   help="take each seed's oracle frontier from DIR/<taste>/taste.json (a run of the same "
                        "code and budget) instead of training it again: an ablation of the method on the "
                        "same seeds")
    t.add_argument("--arm", dest="arms", action="append", default=[], metavar="NAME=DIR",
                   help="with --report: an ablation arm, a run of the same tastes and seeds with one lever "
                        "changed (DIR/<taste>/taste.json), compared with --out's run paired per seed (repeat "
                        "for more arms; the one run with --mistakes 0 also fills the decomposition)")
    t.add_argument("--docs", type=Path, default=None,
                   help="also write the figures as a section of this page (e.g. docs/results-taste.md), "
                        "the hand-written text around it kept")
    t.add_argument("--section", choices=("every taste", "fixed 0.3", "family", "template"),
                   default="every taste",
                   help="with --docs: the page's section these runs fill (default: the table of every named "
                        "taste at the shipped default; fixed 0.3: 0.4.x's table at the fixed weight 0.3 and "
                        "the levers measured on it; family: the generated family's distribution of shares; "
                        "template: the template as it opens)")
    t.add_argument("--against", type=Path, default=None, metavar="DIR",
                   help="with --section template: runs of 0.5.0's template budget (DIR/<taste>/taste.json) "
                        "shown beside")
    t.add_argument("--readme", type=Path, default=None,
                   help="also write the short table between the README's taste markers (e.g. README.md)")
    t.add_argument("--summary", type=Path, default=None, metavar="PAGE",
                   help="also write the short table between the taste summary markers of PAGE (e.g. "
                        "docs/results.md), its link relative to PAGE; refused when PAGE lacks the markers")
    t.add_argument("--report", action="store_true",
                   help="train nothing: summarise --out's taste.json files again (and write --docs)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a training option for every run (e.g. tree.depth=3)")
    t.set_defaults(func=_run_bench_taste)


def add_budget_options(t: argparse.ArgumentParser) -> None:
    """``bench taste``'s options for what is trained and measured: the budget, the template, every point,
    the frontier."""
    t.add_argument("--budget", choices=("shipped", "node-0.5", "bench-0.5"), default="shipped",
                   help="shipped: the method as the node runs it with its defaults (trainer/config/"
                        "picks_budget.py; the default); node-0.5: as the node ran with 0.5.0's defaults (8 "
                        "rounds at 0.001, a rank-8 LoRA, 6 checkpoints); bench-0.5: 0.5.0's benchmark budget "
                        "and loop")
    t.add_argument("--template", action="store_true",
                   help="the pick-and-train template as it opens: its 12 trees of 3 prompts, every one "
                        "labelled, the node's training, measured on its own prompts at unseen seeds")
    t.add_argument("--every-point", action="store_true",
                   help="measure every checkpoint and strength on the test pairs (what the reward gained and "
                        "what the guard's choice lost, told apart); costs a test measurement per point")
    t.add_argument("--frontier-weights", default=None, metavar="W,W,...",
                   help="the weights the oracle frontier trains the hidden taste at (default 0.3,0.5,0.8)")
    t.add_argument("--no-steered-frontier", action="store_true",
                   help="leave the guard-steered run out of the frontier (a cheaper frontier)")


def add_picking(kinds: argparse._SubParsersAction) -> None:
    """``bench picking``: its options."""
    k = kinds.add_parser("picking", help="fewer clicks: the personal reward's accuracy by labelled trees, "
                         "oldest first against the active order, and when to stop (a simulated person, no "
                         "training)",
                         description="A pool of base-model trees is grown once; a simulated person (15% "
                                     "mistakes) labels them oldest first or in the active order, and the "
                                     "personal reward fitted on 10, 15, 25 and 50 of them is scored against "
                                     "the hidden taste on held-out trees.")
    k.add_argument("--tastes", default=None, metavar="NAME,NAME,...",
                   help="hidden tastes (default larger_objects,central_objects,deep_shades)")
    k.add_argument("--seeds", type=int, default=None, help="seeds (default 5)")
    k.add_argument("--candidates", type=int, default=None, help="trees to pick from (default 200)")
    k.add_argument("--test", type=int, default=None, help="held-out trees scoring the reward (default 40)")
    k.add_argument("--quick", action="store_true", help="a smoke run (18 trees, 2 seeds, one taste): CI's")
    k.add_argument("--out", type=Path, default=Path("runs/picking"), help="where picking.json goes")
    k.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a sampling option of the grown trees (e.g. tree.depth=3)")
    k.set_defaults(func=_run_bench_picking)


def _run_bench_taste(args: argparse.Namespace) -> int:
    from .budget import QUICK_OVERRIDES, QUICK_TASTES, TASTE_SET
    from .page import overall_lines
    from .readme import EVERY_TASTE, check_summary_page, page_link, readme_block, write_summary_block
    from .run import run_taste
    from .storage import reload
    from .summary import format_summary

    default = QUICK_TASTES if args.quick else TASTE_SET
    tastes = named_tastes(args.tastes) if args.tastes else list(default)
    outs = [args.out / t.rpartition(":")[2] for t in tastes]
    command = taste_command(args)
    blocks = [(p, o) for p, o in ((args.readme, "--readme"), (args.summary, "--summary")) if p is not None]
    for page, option in blocks:  # a page without the markers is refused before anything runs
        check_summary_page(page, option)
    if args.report:
        summaries = [reload(out) for out in outs]
    else:
        budget = taste_budget(args)
        extra = [*(QUICK_OVERRIDES if args.quick else ()), *args.overrides]
        summaries = [run_taste(budget, taste, out, extra, command=command, resume=args.resume,
                               frontier_from=args.frontier_from / out.name / "taste.json"
                               if args.frontier_from else None)
                     for taste, out in zip(tastes, outs, strict=True)]
    for summary, out in zip(summaries, outs, strict=True):
        print(format_summary(summary))
        print(f"{'read' if args.report else 'written'}: {out / 'taste.json'}")
    arms = taste_arms(args.arms, [out.name for out in outs])
    for line in overall_lines(summaries, arms):
        print(line)
    if args.docs:
        print(f"written: {write_section(args, summaries, outs, command, arms)}")
    for page, _ in blocks:
        write_summary_block(page, readme_block(summaries, arms, page_link(page, EVERY_TASTE, args.docs)))
        print(f"written: {page}")
    return 0


def write_section(args: argparse.Namespace, summaries: list[dict[str, Any]], outs: list[Path], command: str,
                  arms: dict[str, list[dict[str, Any]]]) -> Path:
    """The page section ``--section`` names, from these runs."""
    from .family_page import FAMILY_SECTION, TEMPLATE_SECTION, family_markdown, template_markdown
    from .page import put_section, write_docs
    from .storage import reload

    if args.section == "family":
        put_section(args.docs, FAMILY_SECTION, family_markdown(summaries, command, arms=arms),
                    drop_others=True)
    elif args.section == "template":
        against = [reload(args.against / out.name) for out in outs
                   if (args.against / out.name / "taste.json").is_file()] if args.against else []
        put_section(args.docs, TEMPLATE_SECTION, template_markdown(summaries, command, against, arms),
                    drop_others=True)
    else:
        write_docs(summaries, outs, args.docs, command, arms, key=args.section)
    return args.docs


def named_tastes(text: str) -> list[str]:
    """The tastes of ``--tastes``: ``family`` stands for every taste of the generated family."""
    from .family import FAMILY

    names = [t.strip() for t in text.split(",") if t.strip()]
    return [n for name in names for n in (list(FAMILY) if name == "family" else [name])]


def taste_budget(args: argparse.Namespace) -> Any:
    """The budget ``bench taste``'s options ask for (``--quick``'s, the template's, the shipped one or
    0.5.0's, changed)."""
    from dataclasses import replace

    from ...config.schema import check_weights
    from .budget import BENCH_050, NODE_050, QUICK, TasteBudget, template_budget

    kind = getattr(args, "budget", "shipped")
    if args.quick:
        budget = QUICK
    elif args.template:
        budget = template_budget()
    else:
        budget = BENCH_050 if kind == "bench-0.5" else TasteBudget()
    if kind == "node-0.5":
        budget = replace(budget, **NODE_050)
    given = (("trees", args.trees), ("seeds", args.seeds), ("iterations", args.iterations),
             ("keep", args.keep), ("rounds", args.rounds), ("mistakes", args.mistakes))
    changes: dict[str, object] = {k: v for k, v in given if v is not None}
    if getattr(args, "every_point", False):
        changes["every_point"] = True
    if getattr(args, "frontier_weights", None):
        changes["frontier_weights"] = tuple(float(w) for w in args.frontier_weights.split(","))
    if getattr(args, "no_steered_frontier", False):
        changes["frontier_steer"] = False
    if args.at:
        changes["at"] = tuple(int(n) for n in args.at.split(","))
    if args.picks_weights:
        changes["picks_weights"] = check_weights(float(w) for w in args.picks_weights.split(","))
        changes["picks_weight"] = changes["picks_weights"][0]
    return replace(budget, **changes)


def taste_arms(specs: list[str], tastes: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``NAME=DIR`` arms: each one's summaries of the tastes it ran (a missing taste is left out)."""
    from .storage import reload

    arms: dict[str, list[dict[str, Any]]] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise ValueError(f"--arm {spec!r}: expected NAME=DIR")
        found = [reload(Path(folder) / t) for t in tastes if (Path(folder) / t / "taste.json").is_file()]
        if not found:
            raise ValueError(f"--arm {spec!r}: no <taste>/taste.json of these tastes in {folder}")
        arms[name.strip()] = found
    return arms


def taste_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this taste run (for the page)."""
    import shlex

    parts = ["treerpo", "bench", "taste"]
    flags = ("tastes", "trees", "seeds", "iterations", "at", "keep", "rounds", "mistakes", "picks_weights",
             "frontier_weights")
    for flag in flags:
        if getattr(args, flag, None) is not None:
            parts += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if getattr(args, "budget", "shipped") != "shipped":
        parts += ["--budget", args.budget]
    for flag in ("template", "every_point", "no_steered_frontier"):
        parts += [f"--{flag.replace('_', '-')}"] * bool(getattr(args, flag, False))
    parts += ["--quick"] * args.quick
    for override in args.overrides:
        parts += ["--set", override]
    for arm in getattr(args, "arms", []):
        parts += ["--arm", arm]
    if args.out != Path("runs/taste"):
        parts += ["--out", str(args.out)]
    if getattr(args, "frontier_from", None) is not None:
        parts += ["--frontier-from", str(args.frontier_from)]
    parts += ["--resume"] * args.resume + ["--report"] * args.report
    parts += ["--docs", str(args.docs)] * (args.docs is not None)
    if getattr(args, "section", "every taste") != "every taste":
        parts += ["--section", args.section]
    if getattr(args, "against", None) is not None:
        parts += ["--against", str(args.against)]
    parts += ["--readme", str(args.readme)] * (getattr(args, "readme", None) is not None)
    parts += ["--summary", str(args.summary)] * (getattr(args, "summary", None) is not None)
    return " ".join(shlex.quote(p) for p in parts)


def _run_bench_picking(args: argparse.Namespace) -> int:
    import shlex
    from dataclasses import replace

    from .picking import QUICK, QUICK_OVERRIDES, PickingBudget, format_summary, run_picking

    budget = QUICK if args.quick else PickingBudget()
    given = (("seeds", args.seeds), ("candidates", args.candidates), ("test", args.test),
             ("tastes", tuple(args.tastes.split(",")) if args.tastes else None))
    budget = replace(budget, **{k: v for k, v in given if v is not None})
    extra = [*(QUICK_OVERRIDES if args.quick else ()), *args.overrides]
    parts = ["treerpo", "bench", "picking", *["--quick"] * args.quick]
    for flag in ("tastes", "seeds", "candidates", "test"):
        parts += [f"--{flag}", str(getattr(args, flag))] * (getattr(args, flag) is not None)
    for override in args.overrides:
        parts += ["--set", override]
    command = " ".join(shlex.quote(p) for p in parts)
    summary = run_picking(budget, args.out, extra, command=command)
    print(format_summary(summary))
    print(f"written: {args.out / 'picking.json'} ({summary['minutes']:.1f} min)")
    return 0
