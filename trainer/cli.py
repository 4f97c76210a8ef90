"""The ``treerpo`` command line (also ``python -m trainer``, so ``torchrun -m trainer`` works)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .nfe import NfeSettings, format_table, nfe_table


def _add_nfe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nfe", help="forwards per iteration and per scored image, per strategy",
                       description="Count model forwards of every strategy by running the sampler "
                                   "on a cheap velocity function, beside the closed form.")
    d = NfeSettings()
    p.add_argument("--T", type=int, default=d.steps, help="sampling steps (default %(default)s)")
    p.add_argument("--l", type=int, default=d.window_start, help="window start (default %(default)s)")
    p.add_argument("--d", type=int, default=d.depth, help="tree depth (default %(default)s)")
    p.add_argument("--b", type=int, default=d.branching, help="branching (default %(default)s)")
    p.add_argument("--M", type=int, default=d.trees_per_prompt, help="trees per prompt (default %(default)s)")
    p.add_argument("--W", type=int, default=d.window_size, help="MixGRPO window (default %(default)s)")
    p.add_argument("--G", type=int, default=None,
                   help="group size of the baselines (default: M*b^d, the tree's image count)")
    p.add_argument("--f", type=float, default=d.train_fraction,
                   help="DanceGRPO trained fraction (default %(default)s)")
    p.add_argument("--c", type=float, default=d.tail_compression,
                   help="MixGRPO-Flash tail compression (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    p.set_defaults(func=_run_nfe)


def _run_nfe(args: argparse.Namespace) -> int:
    settings = NfeSettings(steps=args.T, window_start=args.l, depth=args.d, branching=args.b,
                           trees_per_prompt=args.M, window_size=args.W, group_size=args.G,
                           train_fraction=args.f, tail_compression=args.c)
    rows = nfe_table(settings)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treerpo", description="Dynamic-TreeRPO for flow-matching "
                                     "text-to-image models.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_nfe(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; bad input ends with one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, TypeError) as err:
        print(f"treerpo {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
