"""How well the embedded image encoder reads a scene: image-to-caption retrieval on scenes it never saw.

Two measures, each on clean renders and on the embedded model's drawings of them
(``contrastive_data.redraw``):

- **top-1**: among the distinct captions of a held-out set of scenes, the one nearest each picture is
  its own (the same scene, in any group order);
- **near misses**, per kind (``contrastive_data.KINDS``): the share of (picture, near-miss caption)
  pairs where the picture's own caption is nearer than the caption one error away: the composition
  the embedding holds (counts, colour binding, sides), which top-1 over random scenes hardly tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .contrastive_data import KINDS, near_misses, scene_key
from .scenes import SceneSpec, spec_to_prompt


@torch.no_grad()
def top1_accuracy(image_embeddings: Tensor, specs: Sequence[SceneSpec], text: nn.Module) -> float:
    """The share of pictures whose nearest caption, among the set's distinct scenes, is their own."""
    keys = list(dict.fromkeys(scene_key(s) for s in specs))
    index = {k: i for i, k in enumerate(keys)}
    first = {}
    for s in specs:
        first.setdefault(scene_key(s), s)
    captions = text([spec_to_prompt(first[k]) for k in keys])
    nearest = (image_embeddings @ captions.T).argmax(dim=1)
    truth = torch.tensor([index[scene_key(s)] for s in specs])
    return float((nearest == truth).float().mean())


@torch.no_grad()
def near_miss_accuracy(image_embeddings: Tensor, specs: Sequence[SceneSpec], text: nn.Module
                       ) -> dict[str, float]:
    """Per kind of error, the share of (picture, near miss) pairs where the own caption is nearer;
    ``all``: every pair of every kind together."""
    own = text([spec_to_prompt(s) for s in specs])
    wins: dict[str, list[Tensor]] = {kind: [] for kind in KINDS}
    for i, spec in enumerate(specs):
        for kind, misses in near_misses(spec).items():
            if misses:
                other = text([spec_to_prompt(m) for m in misses])
                wins[kind].append((other @ image_embeddings[i] < own[i] @ image_embeddings[i]).float())
    out = {kind: float(torch.cat(w).mean()) for kind, w in wins.items() if w}
    out["all"] = float(torch.cat([torch.cat(w) for w in wins.values() if w]).mean())
    return out


def retrieval_report(image_embeddings: Tensor, specs: Sequence[SceneSpec], text: nn.Module
                     ) -> dict[str, float]:
    """``{"top1": ..., "near_miss_<kind>": ..., "near_miss_all": ...}`` for one set of pictures."""
    report = {"top1": top1_accuracy(image_embeddings, specs, text)}
    report.update({f"near_miss_{k}": v for k, v in near_miss_accuracy(image_embeddings, specs, text).items()})
    return report
