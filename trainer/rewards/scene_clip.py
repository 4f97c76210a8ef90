"""The personal reward's ``scene-clip`` backbone: the embedded model's image encoder, beside ``content``.

Why: ``content`` describes pixels (where the colour is, how much, how bright), so a linear head on it
can only like what is linear in those numbers. The embedded image encoder (``embedded/image_tower.py``),
trained CLIP-style on the scene grammar's captions, says what is drawn: which shapes, how many, which
colour goes with which shape, on which side, read through the embedded model's blur. A taste for
"triangles" or "all one colour" is a direction in its embedding, not in pooled pixels.

The features, in order: the embedding, the ``content`` features, then the embedding's coordinates on its
main axes over the embedded model's drawings (``ImageTower.principal_coordinates``). The last
``summary`` of them (``content``'s own summary and those coordinates) are kept as they are by the linear
head beside the principal directions it finds (``preferences.linear_reward.fit_basis``). Why: those
directions are found over every feature at once, where the content's many pixel numbers outweigh the
embedding; kept apart, a few summaries of what is drawn always reach the head, and the pixels' shade,
size and place still do through ``content``. The shipped weights are loaded once per process; images
are embedded on the CPU in batches.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..embedded.image_tower import embed_images, shipped_image_tower
from .pixel_features import SUMMARY, content_features


class SceneClipFeatures:
    """``[B, 3, 64, 64]`` in ``[0, 1]`` -> ``[B, dim + 449 + principal]``: the encoder's embedding,
    ``content``, then the embedding's principal coordinates; ``summary``: how many last features the
    linear head keeps as they are (read by ``personal.summary_features``)."""

    @property
    def summary(self) -> int:
        return SUMMARY + shipped_image_tower().spec.principal

    def __call__(self, images: Tensor) -> Tensor:
        images = images.float().cpu()
        tower = shipped_image_tower()
        embedding = embed_images(images, tower)
        return torch.cat([embedding, content_features(images), tower.principal_coordinates(embedding)],
                         dim=1)


scene_clip_features = SceneClipFeatures()
"""The backbone itself: one per process, over the shipped tower."""
