"""The ``treerpo`` command line (also ``python -m dynamic_treerpo.trainer``, so
``torchrun -m dynamic_treerpo.trainer`` works)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bench.nfe import PAPER_TREE, format_table, nfe_table, strategy_configs
from .compat.versions import check_versions
from .core.strategies import DanceGRPOConfig, MixGRPOConfig, TreeConfig
from .utils.atomic import one_line


def _add_nfe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nfe", help="forwards per iteration and per scored image, per strategy",
                       description="Count model forwards of every strategy by running the sampler "
                                   "on a cheap velocity function, beside the closed form.")
    d, mix, dance = PAPER_TREE, MixGRPOConfig(), DanceGRPOConfig()
    p.add_argument("--T", type=int, default=d.steps, help="sampling steps (default %(default)s)")
    p.add_argument("--l", type=int, default=d.window_start, help="window start (default %(default)s)")
    p.add_argument("--d", type=int, default=d.depth, help="tree depth (default %(default)s)")
    p.add_argument("--b", type=int, default=d.branching, help="branching (default %(default)s)")
    p.add_argument("--M", type=int, default=d.trees_per_prompt, help="trees per prompt (default %(default)s)")
    p.add_argument("--W", type=int, default=mix.window_size, help="MixGRPO window (default %(default)s)")
    p.add_argument("--G", type=int, default=None,
                   help="group size of the baselines (default: M*b^d, the tree's image count)")
    p.add_argument("--f", type=float, default=dance.train_fraction,
                   help="DanceGRPO trained fraction (default %(default)s)")
    p.add_argument("--c", type=float, default=d.tail_compression,
                   help="MixGRPO-Flash tail compression (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    p.set_defaults(func=_run_nfe)


def _run_nfe(args: argparse.Namespace) -> int:
    tree = TreeConfig(steps=args.T, window_start=args.l, depth=args.d, branching=args.b,
                      trees_per_prompt=args.M, tail_compression=args.c)
    rows = nfe_table(strategy_configs(tree, MixGRPOConfig(window_size=args.W),
                                      DanceGRPOConfig(train_fraction=args.f), args.G))
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a LoRA with Dynamic-TreeRPO (or a baseline)",
                       description="Headless RL fine-tuning. Writes metrics.csv, TensorBoard events, "
                                   "checkpoints/, lora/, plots/ and samples/ into the run folder.")
    p.add_argument("config", nargs="?", default=None,
                   help="YAML config (default: built-in defaults, the same as configs/default.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set iterations=2 --set tree.depth=3")
    p.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<config name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from .training.run import format_summary, resolve_config, run_training

    out = args.out or Path("runs") / (Path(args.config).stem if args.config else "default")
    config = resolve_config(args.config, args.overrides, out, args.resume)
    summary = run_training(config, out, resume=args.resume, progress=not args.no_progress)
    if summary:  # rank 0 (the others of a torchrun job return an empty summary)
        print(format_summary(summary))
        print(f"run folder: {out}")
    return 0


def _add_sample(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="render prompts with the embedded model and an optional LoRA")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", type=Path, default=None, help="a prompt file, one per line")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds, one image per prompt and seed")
    p.add_argument("--lora", type=Path, default=None, help="LoRA file (ComfyUI or diffusers format)")
    p.add_argument("--model", type=Path, default=None, help="model folder (default: the embedded default)")
    p.add_argument("--steps", type=int, default=10, help="sampling steps (default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("samples.png"), help="output PNG grid")
    p.set_defaults(func=_run_sample)


def _run_sample(args: argparse.Namespace) -> int:
    from .inference.sample import sample_grid

    prompts = list(args.prompt)
    if args.prompts is not None:
        from .training.evaluate import read_prompt_file

        prompts += read_prompt_file(args.prompts)
    if not prompts:
        raise ValueError("give at least one --prompt or a --prompts file")
    sample_grid(prompts, args.seeds, args.out, lora=args.lora, model=args.model, steps=args.steps)
    print(f"wrote {args.out} ({len(prompts) * len(args.seeds)} images)")
    return 0


def _add_score(sub: argparse._SubParsersAction) -> None:
    from .rewards.registry import reward_names

    p = sub.add_parser("score", help="score a folder of images against their prompts",
                       description="Print each image's reward and the mean. Images are read in "
                                   "file-name order, with one prompt per image.")
    p.add_argument("--reward", required=True, metavar="NAME[:W][,NAME[:W]...]",
                   help=f"reward(s) by name: {', '.join(reward_names())}; an optional weight W "
                        "sets the reward's share in the weighted column")
    p.add_argument("--weights", nargs="+", action="extend", default=[], metavar="PATH",
                   help="local weights of the model rewards, in the order of --reward (or NAME=PATH)")
    p.add_argument("--device", default="cpu", help="device of the reward models (default %(default)s)")
    p.add_argument("--images", type=Path, required=True, help="folder of images (png, jpg, webp, bmp)")
    p.add_argument("--prompts", type=Path, required=True,
                   help="prompt file, one line per image in file-name order")
    p.set_defaults(func=_run_score)


def _run_score(args: argparse.Namespace) -> int:
    from .inference.score import format_scores, score_folder
    from .training.evaluate import read_prompt_file

    files, scores = score_folder(args.reward, args.images, read_prompt_file(args.prompts),
                                 weights=args.weights, device=args.device)
    print(format_scores(files, scores))
    return 0


def _bench_parser(kinds: argparse._SubParsersAction, name: str, help_text: str, out: str,
                  budget: bool) -> argparse.ArgumentParser:
    """A ``bench`` subcommand with the trainer's config arguments (and a training budget)."""
    p = kinds.add_parser(name, help=help_text)
    p.add_argument("config", nargs="?", default=None, help="YAML config (default: configs/default.yaml's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", type=Path, default=Path(out), help="folder for the results (default %(default)s)")
    if budget:
        p.add_argument("--budget-seconds", type=float, required=True,
                       help="training seconds per run (per strategy or variant, and seed)")
        p.add_argument("--seeds", type=int, default=1, help="seeds per run (default %(default)s)")
        p.add_argument("--eval-every", type=int, default=4, help="iterations between held-out evaluations")
    return p


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks: the recipes side by side on the embedded default")
    kinds = p.add_subparsers(dest="bench", required=True)
    q = _bench_parser(kinds, "protocol", "every recipe as published, like for like, at its best rate, "
                      "on equal images and equal seconds, over paired seeds; the paper's parts one at a time",
                      "runs/protocol", False)
    q.add_argument("--quick", action="store_true",
                   help="a smoke run of every arm and part (2 seeds, a few iterations, tiny batches): "
                        "what CI runs")
    q.add_argument("--part", choices=("main", "ablations", "all"), default=None,
                   help="main: the sweep and the main arms as published (the default); ablations: the "
                        "ablation arms (each swept at its own rate first) and the clip treatments, "
                        "continuing the finished main part in --out (the same options); all: both in one "
                        "command "
                        "(--quick's default)")
    q.add_argument("--arms", default=None, metavar="A,B,...",
                   help="run only these arms (comma-separated names; default: all of the part's)")
    q.add_argument("--seeds", type=int, default=None,
                   help="seeds per arm (default 8: the fewest with which the exact test can reach the "
                        "primary claims' Holm threshold; --quick 2)")
    q.add_argument("--images", type=int, default=None, help="scored images per run (default 320)")
    q.add_argument("--seconds", type=float, default=None,
                   help="equal-seconds budget (default: MixGRPO's time for the image budget)")
    q.add_argument("--checkpoints", type=int, default=None,
                   help="evaluations per budget, at k/N of it (default 2)")
    q.add_argument("--lrs", default=None, metavar="LR,LR,...",
                   help="the learning-rate grid (default 0.0004,0.0008,0.0016,0.0032)")
    q.add_argument("--max-extensions", type=int, default=None,
                   help="rates added per arm while its best is at the grid's edge (default 1)")
    q.add_argument("--sweep-iterations", type=int, default=None,
                   help="training iterations of each sweep run (default 3)")
    q.add_argument("--max-iterations-factor", type=int, default=None,
                   help="an arm still short of the equal-seconds budget stops after this many times the "
                        "image budget's iterations (default 4)")
    q.add_argument("--clock", choices=("auto", "cpu", "wall"), default=None,
                   help="seconds of the equal-seconds budget: CPU seconds of the training process, wall "
                        "seconds, or auto (CPU on a CPU, wall on a GPU; the default)")
    q.add_argument("--task", choices=("taste", "scene"), default="taste",
                   help="the embedded test bed's reward: taste (the scene reward mixed half and half with a "
                        "taste for larger objects; the default) or scene alone; a given config keeps its own")
    q.add_argument("--docs", type=Path, default=None,
                   help="also write this results page (e.g. docs/results.md) and its plots beside it")
    q.add_argument("--resume", action="store_true",
                   help="continue the part saved in --out (its sweep kept, finished runs skipped); "
                        "the same options as the run that saved it")
    q.set_defaults(func=_run_bench_protocol)
    r = kinds.add_parser("report", help="rebuild bench.json, the plots and results.md from protocol.json")
    r.add_argument("--out", type=Path, default=Path("runs/protocol"), help="the protocol's folder")
    r.add_argument("--docs", type=Path, default=None, help="also write this results page")
    r.add_argument("--readme", type=Path, default=None,
                   help="also rewrite the verdict table of this README (between its bench protocol claims "
                        "markers) from the same figures")
    r.set_defaults(func=_run_bench_report)
    _bench_parser(kinds, "sampler", "tree sampler overhead and training memory at 16 and 64 leaves",
                  "runs/sampler", False).set_defaults(func=_run_bench_sampler)
    t = kinds.add_parser("taste", help="learning a person's taste from picks under the guard, on "
                         "every taste, against the oracle frontier (a simulated person)",
                         description="Per taste and seed: a simulated person labels trees with a hidden "
                                     "taste (likes 2, dislikes 1, 15%% mistakes); the default method trains "
                                     "from the first 25, 50 and 100 labelled trees under the guard; the "
                                     "oracle frontier trains the hidden taste itself at several weights. "
                                     "out/<taste>/taste.json is written after every seed.")
    t.add_argument("--tastes", default=None, metavar="NAME,NAME,...",
                   help="hidden tastes: names of trainer/bench/tastes.py or MODULE:FUNCTION / "
                        "FILE.py:FUNCTION ((images, prompts) -> one score per image); default "
                        "larger_objects, central_objects, deep_shades, lower_objects, warm_shades "
                        "(--quick: larger_objects, lower_objects)")
    t.add_argument("--trees", type=int, default=None, help="labelled trees (default 100)")
    t.add_argument("--seeds", type=int, default=None, help="seeds (default 5)")
    t.add_argument("--iterations", type=int, default=None, help="training iterations per run (default 24)")
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
                        "choice gained the most personal reward on validation pairs (default 0.3,0.5, as "
                        "guard.weights); one weight: that fixed weight")
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
                   help="also write the figures as a section of this page (e.g. docs/results.md)")
    t.add_argument("--readme", type=Path, default=None,
                   help="also write the short table between the README's taste markers (e.g. README.md)")
    t.add_argument("--report", action="store_true",
                   help="train nothing: summarise --out's taste.json files again (and write --docs)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a training option for every run (e.g. tree.depth=3)")
    t.set_defaults(func=_run_bench_taste)
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


BUDGET_FLAGS = ("seeds", "images", "seconds", "checkpoints", "lrs", "max_extensions", "sweep_iterations",
                "max_iterations_factor", "clock")


def _protocol_command(args: argparse.Namespace) -> str:
    """The ``treerpo bench protocol`` command line these arguments stand for (for the results page)."""
    import shlex

    parts = ["treerpo", "bench", "protocol", *([args.config] if args.config else [])]
    parts += ["--quick"] if args.quick else []
    parts += ["--part", args.part] if args.part else []
    parts += ["--task", args.task] if args.task != "taste" else []
    for flag in ("arms", *BUDGET_FLAGS):
        if getattr(args, flag) is not None:
            parts += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    for override in args.overrides:
        parts += ["--set", override]
    parts += ["--out", str(args.out), *(["--docs", str(args.docs)] if args.docs else [])]
    return " ".join(shlex.quote(p) for p in parts)


def _commands(saved: str | None, command: str, resumed: bool = False) -> str:
    """The commands that made a protocol.json, one a line: a part's is added once; a ``resumed``
    part keeps the command line that started it (its ``--resume`` may add ``--docs``)."""
    lines = [] if saved is None else saved.splitlines()
    return "\n".join(lines if resumed or command in lines else [*lines, command])


def _run_bench_protocol(args: argparse.Namespace) -> int:
    from .bench.arms import select_arms
    from .bench.protocol import bed_overrides, budget_for, run_ablations, run_protocol, save
    from .bench.report import format_summary, write_report
    from .bench.results import load

    budget = budget_for(args.quick, {flag: getattr(args, flag) for flag in BUDGET_FLAGS})
    arms = select_arms(args.arms)
    base = [*bed_overrides(args.quick, args.config, args.task), *args.overrides]
    part = args.part or ("all" if args.quick else "main")
    saved = args.out / "protocol.json"
    if part == "ablations":
        if not saved.is_file():
            raise ValueError(f"{saved} not found: the ablation part continues a protocol; run its main part "
                             f"first (`treerpo bench protocol --out {args.out}`)")
        previous = load(args.out)
    else:
        previous = load(args.out) if args.resume and saved.is_file() else None
    command = _commands(None if previous is None else previous.command, _protocol_command(args),
                        resumed=args.resume and previous is not None and part in previous.parts)
    if previous is not None:  # a continued protocol carries its commands from its first save on
        previous.command = command
    if part == "ablations":
        result = run_ablations(previous, budget, base, args.config, arms, out=args.out, resume=args.resume)
    else:
        result = run_protocol(budget, base, args.config, arms, out=args.out, resume=previous, part=part,
                              command=command)
    save(result, args.out)  # wall_s: the whole protocol's, a resumed one's included
    print(format_summary(write_report(result, args.out, args.docs)))
    print(f"written: {args.out / 'protocol.json'}, {args.out / 'bench.json'}, {args.out / 'results.md'}"
          + (f", {args.docs}" if args.docs else "") + f" ({result.wall_s / 60:.1f} min)")
    return 0


def _run_bench_report(args: argparse.Namespace) -> int:
    from .bench.report import format_summary, write_report
    from .bench.results import load

    result = load(args.out)
    print(format_summary(write_report(result, args.out, args.docs, args.readme)))
    return 0


def _run_bench_taste(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .bench.taste import QUICK, QUICK_OVERRIDES, QUICK_TASTES, TASTE_SET, TasteBudget, reload, run_taste
    from .bench.taste_page import overall_lines, write_docs
    from .bench.taste_readme import readme_block, with_readme_block
    from .bench.taste_summary import format_summary
    from .config.schema import check_weights
    from .utils.atomic import atomic_write_text

    default = QUICK_TASTES if args.quick else TASTE_SET
    tastes = [t.strip() for t in args.tastes.split(",")] if args.tastes else list(default)
    outs = [args.out / t.rpartition(":")[2] for t in tastes]
    command = _taste_command(args)
    if args.readme:  # a README without the markers is refused before anything runs
        if not args.readme.is_file():
            raise ValueError(f"--readme {args.readme}: no such file")
        with_readme_block(args.readme.read_text(encoding="utf-8"), "")
    if args.report:
        summaries = [reload(out) for out in outs]
    else:
        budget = QUICK if args.quick else TasteBudget()
        given = (("trees", args.trees), ("seeds", args.seeds), ("iterations", args.iterations),
                 ("keep", args.keep), ("rounds", args.rounds), ("mistakes", args.mistakes))
        changes: dict[str, object] = {k: v for k, v in given if v is not None}
        if args.at:
            changes["at"] = tuple(int(n) for n in args.at.split(","))
        if args.picks_weights:
            changes["picks_weights"] = check_weights(float(w) for w in args.picks_weights.split(","))
            changes["picks_weight"] = changes["picks_weights"][0]
        budget = replace(budget, **changes)
        extra = [*(QUICK_OVERRIDES if args.quick else ()), *args.overrides]
        summaries = [run_taste(budget, taste, out, extra, command=command, resume=args.resume,
                               frontier_from=args.frontier_from / out.name / "taste.json"
                               if args.frontier_from else None)
                     for taste, out in zip(tastes, outs, strict=True)]
    for summary, out in zip(summaries, outs, strict=True):
        print(format_summary(summary))
        print(f"{'read' if args.report else 'written'}: {out / 'taste.json'}")
    arms = _taste_arms(args.arms, [out.name for out in outs])
    for line in overall_lines(summaries, arms):
        print(line)
    if args.docs:
        print(f"written: {write_docs(summaries, outs, args.docs, command, arms)}")
    if args.readme:
        text = with_readme_block(args.readme.read_text(encoding="utf-8"), readme_block(summaries, arms))
        atomic_write_text(args.readme, text)
        print(f"written: {args.readme}")
    return 0


def _taste_arms(specs: list[str], tastes: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``NAME=DIR`` arms: each one's summaries of the tastes it ran (a missing taste is left out)."""
    from .bench.taste import reload

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


def _taste_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this taste run (for the page)."""
    import shlex

    parts = ["treerpo", "bench", "taste"]
    flags = ("tastes", "trees", "seeds", "iterations", "at", "keep", "rounds", "mistakes", "picks_weights")
    for flag in flags:
        if getattr(args, flag) is not None:
            parts += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
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
    parts += ["--readme", str(args.readme)] * (getattr(args, "readme", None) is not None)
    return " ".join(shlex.quote(p) for p in parts)


def _run_bench_picking(args: argparse.Namespace) -> int:
    import shlex
    from dataclasses import replace

    from .bench.picking import QUICK, QUICK_OVERRIDES, PickingBudget, format_summary, run_picking

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


def _run_bench_sampler(args: argparse.Namespace) -> int:
    from .bench.sampler import format_sampler, sampler

    print(format_sampler(sampler(args.config, args.overrides, args.out)))
    print(f"written: {args.out / 'sampler.json'}")
    return 0


def _add_take(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("take", help="another checkpoint or LoRA strength of a run trained from picks under "
                                    "the guard, as LoRA files, without training again",
                       description="A run trained from picks under the guard kept a checkpoint every few "
                                   "iterations (RUN/guard: trail.json, trade.png). This writes the LoRA of "
                                   "one of them, at a strength, in ComfyUI, diffusers and kohya keys.")
    p.add_argument("run", type=Path, help="the run folder (treerpo train --out)")
    p.add_argument("--iteration", type=int, default=None,
                   help="the checkpoint's iteration (the numbers on trade.png; default: the guard's choice)")
    p.add_argument("--strength", type=float, default=1.0, help="the LoRA's strength, 0 to 2 (default 1)")
    p.add_argument("--out", type=Path, default=None, help="where the files go (default RUN/taken)")
    p.set_defaults(func=_run_take)


def _run_take(args: argparse.Namespace) -> int:
    from .training.guarded import take_from_run

    choice, files = take_from_run(args.run, args.iteration, args.strength, args.out or args.run / "taken")
    print(f"took {choice.reason}")
    for name, path in files.items():
        print(f"written: {path} ({name})")
    return 0


def _add_run_workflow(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run-workflow", help="run a ComfyUI workflow (API or UI JSON) headless, here",
                       description="Load ComfyUI (its built-in nodes and this pack, from this checkout), "
                                   "validate the workflow as the server does, run it, and list the files "
                                   "it wrote. Exit status: 0 done, 2 refused by validation, 1 a node failed.")
    p.add_argument("workflow", type=Path, help="workflow JSON: API format (Export (API)) or the web UI's")
    p.add_argument("--comfyui", type=Path, default=None,
                   help="ComfyUI folder (default: $TREERPO_COMFYUI, else .comfyui of this checkout)")
    p.add_argument("--output", type=Path, default=None,
                   help="output folder for SaveImage and the pack's savers (default: ComfyUI's own)")
    p.add_argument("--verbose", action="store_true", help="show ComfyUI's log and progress bars")
    p.set_defaults(func=_run_run_workflow)


def _run_run_workflow(args: argparse.Namespace) -> int:
    from .comfyui_host.runner import (
        WorkflowExecutionError,
        WorkflowValidationError,
        format_result,
        run_workflow,
    )

    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        result = run_workflow(args.workflow, comfyui=args.comfyui, output=args.output, report=report,
                              verbose=args.verbose)
    except WorkflowValidationError as err:
        for line in err.lines:
            print(f"treerpo run-workflow: invalid: {line}", file=sys.stderr)
        return 2
    except WorkflowExecutionError as err:
        print(f"treerpo run-workflow: error: {err}", file=sys.stderr)
        return 1
    print(format_result(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treerpo", description="Dynamic-TreeRPO for flow-matching "
                                     "text-to-image models.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_nfe(sub)
    _add_train(sub)
    _add_sample(sub)
    _add_score(sub)
    _add_take(sub)
    _add_run_workflow(sub)
    _add_bench(sub)
    return parser


def _quiet_loading_bars() -> None:
    """transformers draws a progress bar for every checkpoint it loads (the embedded model's text
    encoder: a fraction of a second); on stderr it buries the one line an error prints."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; bad input ends with one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        check_versions()
        _quiet_loading_bars()
        return int(args.func(args))
    except (ValueError, TypeError, ImportError) as err:
        print(f"treerpo {args.command}: error: {one_line(err, 400)}", file=sys.stderr)
        return 2
    except OSError as err:  # a missing file, a full disk, no permission: what and where
        what = err.strerror or one_line(err, 400)
        where = f": {err.filename}" if err.filename else ""
        print(f"treerpo {args.command}: error: {what}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
