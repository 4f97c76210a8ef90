"""Score a folder of images against their prompts with registered rewards (``treerpo score``).

Why: users compare checkpoints, samplers and other tools' outputs with the same numbers the
trainer optimises, without writing code. Images are read in file-name order, one prompt per image.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from ..rewards.mix import RewardMix, bind_weights, parse_reward_spec
from ..utils.images import load_images

IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def image_files(folder: str | Path) -> list[Path]:
    """Image files directly in ``folder``, sorted by name; a missing or empty folder is an error."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {root}")
    return files


def score_folder(reward_spec: str, folder: str | Path, prompts: Sequence[str],
                 weights: Sequence[str] = (), device: str = "cpu"
                 ) -> tuple[list[Path], dict[str, Tensor]]:
    """Each reward's score ``[B]`` for the folder's images, in file-name order.

    ``weights``: the ``--weights`` items (``PATH`` or ``NAME=PATH``). With several rewards a
    ``weighted`` column adds the weighted sum of the raw scores.
    """
    names = [t.name for t in parse_reward_spec(reward_spec)]  # bad names fail before any work
    paths = bind_weights(names, weights)
    files = image_files(folder)
    if len(prompts) != len(files):
        raise ValueError(f"{len(files)} images in {folder} but {len(prompts)} prompts: "
                         "give one prompt per image, in file-name order")
    images = load_images(files)
    mix = RewardMix(reward_spec, paths, device)
    out = mix(images.to(device), list(prompts))
    if len(names) == 1:
        return files, {names[0]: out["reward"].float().cpu()}
    scores = {name: out[f"reward_{name}"].float().cpu() for name in names}
    scores["weighted"] = out["reward"].float().cpu()
    return files, scores


def format_scores(rows: Sequence[Path | str], scores: dict[str, Tensor]) -> str:
    """One row per image (labelled by its file name, or the given label) and a final ``mean`` row,
    tab-separated, a column per reward."""
    names = list(scores)
    lines = ["\t".join(["image", *names])]
    for i, row in enumerate(rows):
        label = row.name if isinstance(row, Path) else str(row)
        lines.append("\t".join([label, *(f"{float(scores[n][i]):.4f}" for n in names)]))
    lines.append("\t".join(["mean", *(f"{float(scores[n].mean()):.4f}" for n in names)]))
    return "\n".join(lines)
