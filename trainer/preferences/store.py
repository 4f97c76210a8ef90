"""A picks folder on disk (the layout is in ``records.py``): trees go in whole, picks are appended.

Why append-only and atomic: a person may label 200 trees over an afternoon, in a browser tab that can
close and on a server that can restart. Every tree is written into a hidden temporary folder and
renamed into place when complete; every save of picks is a new file written atomically; nothing is
rewritten. A crash loses at most the save in flight, and every reader sees whole records only.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from torch import Tensor

from ..core.tree import Tree
from ..utils.atomic import atomic_write_text
from .records import (
    ModelId,
    Picks,
    PicksFormatError,
    TreeMeta,
    check_picks,
    plan_from_dict,
    plan_to_dict,
    tree_from,
    tree_tensors,
)

TREES = "trees"
META, TENSORS, PICKS_FOLDER = "tree.json", "tree.safetensors", "picks"  # a tree's files and its picks' folder


def _stamp() -> str:
    """A sortable UTC time plus randomness: names never collide, and sort by age."""
    now = datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%S')}{now.microsecond:06d}Z_{secrets.token_hex(4)}"


def leaf_image_name(leaf: int) -> str:
    return f"leaf_{leaf:02d}.png"


def save_png(image: Tensor, path: Path) -> None:
    """``[3, H, W]`` in [0, 1] as an 8-bit PNG."""
    from PIL import Image

    pixels = (image.detach().float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
    Image.fromarray(pixels).save(path)


class PickStore:
    """One picks folder. ``create``: make it when missing (else a missing folder is an error)."""

    def __init__(self, root: str | Path, create: bool = False) -> None:
        self.root = Path(root).expanduser()
        if create:
            (self.root / TREES).mkdir(parents=True, exist_ok=True)
        elif not (self.root / TREES).is_dir():
            raise FileNotFoundError(f"not a picks folder (no {TREES}/ inside): {self.root}")

    # ------------------------------------------------------------------ writing
    def add_tree(self, tree: Tree, images: Tensor, meta: TreeMeta) -> str:
        """Store one tree (one prompt) with its leaf images; returns its id."""
        if tree.num_prompts != 1:
            raise ValueError(f"a record holds one tree of one prompt, got {tree.num_prompts} prompts")
        if images.ndim != 4 or images.shape[0] != tree.leaf_node.numel():
            raise ValueError(f"expected one image per leaf ({tree.leaf_node.numel()}), "
                             f"got {tuple(images.shape)}")
        from safetensors.torch import save_file

        tree_id = _stamp()
        meta = replace(meta, created=meta.created or tree_id.split("_")[0], leaves=images.shape[0],
                       image_size=(int(images.shape[-2]), int(images.shape[-1])),
                       plan=plan_to_dict(tree.plan))
        staging = self.root / TREES / f".{tree_id}.partial"
        staging.mkdir(parents=True)
        try:
            save_file(tree_tensors(tree), str(staging / TENSORS))
            for leaf, image in enumerate(images):
                save_png(image, staging / leaf_image_name(leaf))
            (staging / PICKS_FOLDER).mkdir()
            (staging / META).write_text(meta.to_json(), encoding="utf-8")
            staging.rename(self.root / TREES / tree_id)  # atomic: the record appears whole
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return tree_id

    def save_picks(self, tree_id: str, liked: Sequence[int], disliked: Sequence[int] = ()) -> Picks:
        """Append a choice for ``tree_id`` (checked: ``records.check_picks``); the newest one counts."""
        meta = self.meta(tree_id)
        check_picks(list(liked), list(disliked), meta.leaves)
        picks = Picks(tuple(sorted({int(i) for i in liked})), tuple(sorted({int(i) for i in disliked})),
                      at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        atomic_write_text(self._folder(tree_id) / PICKS_FOLDER / f"{_stamp()}.json", picks.to_json())
        return picks

    # ------------------------------------------------------------------ reading
    def has_tree(self, tree_id: str) -> bool:
        """Whether ``tree_id`` is a complete tree of this folder (one lookup, not a listing)."""
        return (not tree_id.startswith(".") and "/" not in tree_id
                and (self.root / TREES / tree_id / META).is_file())

    def _folder(self, tree_id: str) -> Path:
        if not self.has_tree(tree_id):
            raise FileNotFoundError(f"no tree {tree_id!r} in {self.root}")
        return self.root / TREES / tree_id

    def tree_ids(self) -> list[str]:
        """Every complete tree, oldest first."""
        return sorted(p.name for p in (self.root / TREES).iterdir()
                      if p.is_dir() and not p.name.startswith(".") and (p / META).is_file())

    def meta(self, tree_id: str) -> TreeMeta:
        path = self._folder(tree_id) / META
        return TreeMeta.from_json(path.read_text(encoding="utf-8"), str(path))

    def picks(self, tree_id: str) -> Picks | None:
        """The newest choice made on ``tree_id``, None when it has none."""
        saves = sorted((self._folder(tree_id) / PICKS_FOLDER).glob("*.json"))
        if not saves:
            return None
        return Picks.from_json(saves[-1].read_text(encoding="utf-8"), str(saves[-1]))

    def labelled(self) -> list[tuple[str, Picks]]:
        """``(tree id, its newest picks)`` of every labelled tree, oldest tree first."""
        out = []
        for tree_id in self.tree_ids():
            picks = self.picks(tree_id)
            if picks is not None:
                out.append((tree_id, picks))
        return out

    def unlabelled(self) -> list[str]:
        return [t for t in self.tree_ids() if self.picks(t) is None]

    def image_path(self, tree_id: str, leaf: int) -> Path:
        return self._folder(tree_id) / leaf_image_name(leaf)

    def load_images(self, tree_id: str) -> Tensor:
        """``[L, 3, H, W]`` in [0, 1]: the leaves as the person saw them."""
        from ..utils.images import load_images

        return load_images([self.image_path(tree_id, leaf) for leaf in range(self.meta(tree_id).leaves)])

    def load_tree(self, tree_id: str) -> Tree:
        """The stored rollout, for the tree's own objective."""
        from safetensors.torch import load_file

        folder = self._folder(tree_id)
        meta = self.meta(tree_id)
        try:
            tensors = load_file(str(folder / TENSORS))
        except Exception as err:  # a truncated or foreign file
            raise PicksFormatError(f"{folder / TENSORS} is unreadable ({type(err).__name__})") from None
        return tree_from(tensors, plan_from_dict(meta.plan), str(folder / TENSORS))

    # ------------------------------------------------------------------ checks
    def check(self, model: ModelId | None = None) -> list[str]:
        """The folder is fit to train on, else one line naming the problem: it holds trees, labelled
        ones among them, all made by one model (``model``'s, when given) with images of
        one size. Returns the labelled tree ids."""
        ids = self.tree_ids()
        if not ids:
            raise ValueError(f"the picks folder {self.root} holds no tree yet: sample some trees first")
        metas = {t: self.meta(t) for t in ids}
        sizes = sorted({m.image_size for m in metas.values()})
        if len(sizes) > 1:
            raise ValueError(f"the picks folder {self.root} mixes image sizes {sizes[0]} and {sizes[1]}: "
                             "one folder per size")
        bases = sorted({(m.model.kind, m.model.name, m.model.fingerprint) for m in metas.values()})
        if len(bases) > 1:
            raise ValueError(f"the picks folder {self.root} mixes trees of two models ({bases[0][1]} and "
                             f"{bases[1][1]}): one folder per model")
        first = next(iter(metas.values())).model
        if model is not None and not model.same_base(first):
            raise ValueError(f"the picks folder {self.root} was made with another model ({first.name}, "
                             f"{first.fingerprint[:12]}), not the connected {model.name} "
                             f"({model.fingerprint[:12]})")
        labelled = []
        for tree_id, picks in self.labelled():
            try:
                check_picks(picks.liked, picks.disliked, metas[tree_id].leaves)
            except ValueError as err:
                raise ValueError(f"the picks of tree {tree_id} in {self.root} say nothing: {err}") from None
            labelled.append(tree_id)
        if not labelled:
            raise ValueError(f"the picks folder {self.root} holds {len(ids)} trees but none is labelled yet: "
                             "pick the leaves you like first")
        return labelled
