"""The ``treerpo`` command line (also ``python -m dynamic_treerpo.trainer``, so
``torchrun -m dynamic_treerpo.trainer`` works)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .bench.protocol.nfe import PAPER_TREE, format_table, nfe_table, strategy_configs
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


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from .bench.protocol.commands import add_protocol_commands
    from .bench.taste.commands import add_taste_commands

    p = sub.add_parser("bench", help="benchmarks: the recipes side by side on the embedded default")
    kinds = p.add_subparsers(dest="bench", required=True)
    add_protocol_commands(kinds)
    add_taste_commands(kinds)


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
