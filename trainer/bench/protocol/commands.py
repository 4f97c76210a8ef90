"""The command lines of the protocol wing: ``treerpo bench protocol``, ``bench report`` and ``bench sampler``
(``trainer/cli.py`` adds them under ``bench``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def bench_parser(kinds: argparse._SubParsersAction, name: str, help_text: str, out: str,
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


SUMMARY_HELP = ("also rewrite the verdict table between the bench protocol claims markers of this short "
                "results page (e.g. docs/results.md), its links relative to it; a page without them is "
                "refused")


def add_protocol_commands(kinds: argparse._SubParsersAction) -> None:
    """``bench protocol``, ``bench report`` and ``bench sampler``."""
    q = bench_parser(kinds, "protocol", "every recipe as published, like for like, at its best rate, "
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
                   help="also write this results page (e.g. docs/results-protocol.md) and its plots "
                        "beside it")
    q.add_argument("--summary", type=Path, default=None, metavar="PAGE", help=SUMMARY_HELP)
    q.add_argument("--resume", action="store_true",
                   help="continue the part saved in --out (its sweep kept, finished runs skipped); "
                        "the same options as the run that saved it")
    q.set_defaults(func=_run_bench_protocol)
    r = kinds.add_parser("report", help="rebuild bench.json, the plots and results.md from protocol.json")
    r.add_argument("--out", type=Path, default=Path("runs/protocol"), help="the protocol's folder")
    r.add_argument("--docs", type=Path, default=None,
                   help="also write this results page (e.g. docs/results-protocol.md; what is below its "
                        "hand-written marker is kept)")
    r.add_argument("--readme", type=Path, default=None,
                   help="also rewrite the verdict table of this README (between its bench protocol claims "
                        "markers) from the same figures")
    r.add_argument("--summary", type=Path, default=None, metavar="PAGE", help=SUMMARY_HELP)
    r.set_defaults(func=_run_bench_report)
    bench_parser(kinds, "sampler", "tree sampler overhead and training memory at 16 and 64 leaves",
                  "runs/sampler", False).set_defaults(func=_run_bench_sampler)


BUDGET_FLAGS = ("seeds", "images", "seconds", "checkpoints", "lrs", "max_extensions", "sweep_iterations",
                "max_iterations_factor", "clock")


def protocol_command(args: argparse.Namespace) -> str:
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
    from .arms import select_arms
    from .bed import bed_overrides, budget_for
    from .claims_block import page_with_block
    from .report import format_summary, write_report
    from .results import load, save
    from .run import run_ablations, run_protocol

    if args.summary is not None:  # refused before the hours of training, not after
        page_with_block(args.summary, "")
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
    command = _commands(None if previous is None else previous.command, protocol_command(args),
                        resumed=args.resume and previous is not None and part in previous.parts)
    if previous is not None:  # a continued protocol carries its commands from its first save on
        previous.command = command
    if part == "ablations":
        result = run_ablations(previous, budget, base, args.config, arms, out=args.out, resume=args.resume)
    else:
        result = run_protocol(budget, base, args.config, arms, out=args.out, resume=previous, part=part,
                              command=command)
    save(result, args.out)  # wall_s: the whole protocol's, a resumed one's included
    print(format_summary(write_report(result, args.out, args.docs, summary=args.summary)))
    print(f"written: {args.out / 'protocol.json'}, {args.out / 'bench.json'}, {args.out / 'results.md'}"
          + "".join(f", {page}" for page in (args.docs, args.summary) if page)
          + f" ({result.wall_s / 60:.1f} min)")
    return 0


def _run_bench_report(args: argparse.Namespace) -> int:
    from .report import format_summary, write_report
    from .results import load

    result = load(args.out)
    print(format_summary(write_report(result, args.out, args.docs, args.readme, args.summary)))
    return 0


def _run_bench_sampler(args: argparse.Namespace) -> int:
    from .sampler import format_sampler, sampler

    print(format_sampler(sampler(args.config, args.overrides, args.out)))
    print(f"written: {args.out / 'sampler.json'}")
    return 0
