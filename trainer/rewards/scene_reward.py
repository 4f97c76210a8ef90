"""Dense, compositional reward for the procedural scenes of `trainer.embedded.scenes`.

Pipeline per image:
1. segment: each pixel takes its nearest palette colour if it is within `SEG_DIST`
   (RGB distance), else it is background/clutter;
2. connected components (8-connected, same colour) with a small numpy labeller;
   blobs under `MIN_AREA` px are specks and ignored, `presence` ramps to 1 at `FULL_AREA`;
3. every blob is fitted with the IDEAL mask of each shape (the renderer's own
   geometry) placed at the blob's centroid over a few sizes, and scored by IoU --
   not by bounding boxes, which blocky patch artefacts (8x8 blocks, L shapes) game;
4. requested objects are matched to blobs by exhaustive assignment (<= 3 objects).

Formula (all terms in [0, 1]):
    pair(obj, blob) = presence * (W_C * colour + g * (W_S * shape + W_R * region))
                      / (W_C + W_S + W_R)       # W_R = 0 when the prompt has no region
    colour = colour purity * (0.5 + 0.5 * objectness)   if the blob has the asked colour, else 0
    shape  = ramp(IoU_asked - max(0, IoU_best_other - IoU_asked); SHAPE_IOU)
    g      = min(1, purity / 0.5) * (1 if same colour else WRONG_COLOUR_FACTOR)
    objects = max over matchings  sum(pair) / (n_requested + sum(presence of unmatched blobs))
    reward  = objects * (1 - BG_WEIGHT + BG_WEIGHT * background cleanliness)
Missing objects contribute 0; every extra blob adds to the denominator.
Only numpy and torch are needed.  No randomness anywhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
import torch

from ..embedded.scenes import (
    BACKGROUND,
    COLOURS,
    IMAGE_SIZE,
    SHAPES,
    SceneSpec,
    inside_shape,
    parse_prompt,
    row_half_width,
    shape_centroid_offset,
)

PALETTE_NAMES: tuple[str, ...] = tuple(COLOURS)
_PALETTE = np.asarray([COLOURS[c] for c in PALETTE_NAMES], dtype=np.float32)  # [K, 3]
_BG = np.asarray(BACKGROUND, dtype=np.float32)

SEG_DIST = 0.30  # a pixel belongs to a palette colour within this RGB distance
FULL_COLOUR_DIST = 0.10  # full colour credit within this distance, linear to 0 at SEG_DIST
BG_DIST = (0.05, 0.30)  # background cleanliness: 1 below the first, 0 beyond the second
MIN_AREA = 16  # px; smaller blobs are specks and ignored entirely
FULL_AREA = 64  # px; blobs count fully as objects (for credit and as extras) from here
FIT_SIZE_RANGE = (5.0, 16.0)  # plausible half-extents; fits are clipped to this range
FIT_SIZE_STEPS = np.asarray([0.88, 0.94, 1.0, 1.06, 1.12])  # around the area-matched size
SHAPE_IOU = (0.6, 0.9)  # shape credit ramps from 0 to 1 between these (margin-adjusted) IoUs
OBJECT_IOU = (0.5, 0.85)  # "looks like any of our shapes" ramp, gates half the colour credit
REGION_RAMP = 4.0  # px around the midline over which region credit goes 1 -> 0
W_COLOUR, W_SHAPE, W_REGION = 1.0, 1.0, 1.0  # a wrong side costs as much as a wrong colour
WRONG_COLOUR_FACTOR = 0.5  # shape/region credit kept when the blob has another colour
BG_WEIGHT = 0.2  # reward = objects * (1 - BG_WEIGHT + BG_WEIGHT * background)
MAX_CANDIDATES = 8  # blobs per image considered for matching (largest first)
EXACT_MIN_IOU = 0.75
_AREA_PER_SIZE2 = {"circle": np.pi, "square": 4.0, "triangle": 2.0}  # area / size**2
_NEIGHBOURS = ((0, 1), (1, -1), (1, 0), (1, 1))  # half of the 8-neighbourhood


# ---------------------------------------------------------------- segmentation


def _rgb_dist2(images: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """Squared RGB distance of every pixel of [B, 3, H, W] to one colour: [B, H, W]."""
    d2 = np.square(images[:, 0] - colour[0])
    d2 += np.square(images[:, 1] - colour[1])
    d2 += np.square(images[:, 2] - colour[2])
    return d2


def _segment(images: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest palette index per pixel (-1 if none is within SEG_DIST), its distance,
    and the distance to the background colour.  images: [B, 3, H, W] in [0, 1]."""
    best = _rgb_dist2(images, _PALETTE[0])
    idx = np.zeros(best.shape, dtype=np.int64)
    for k in range(1, len(_PALETTE)):  # K is tiny: a loop beats argmin over a short axis
        d2 = _rgb_dist2(images, _PALETTE[k])
        idx[d2 < best] = k
        np.minimum(best, d2, out=best)
    dmin = np.sqrt(best)
    cls = np.where(dmin < SEG_DIST, idx, -1)
    return cls, dmin, np.sqrt(_rgb_dist2(images, _BG))


def _shift_pairs(a: np.ndarray, dy: int, dx: int) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """Index pairs (p, q) over [B, H, W] so that q is the (dy, dx) neighbour of p."""
    h, w = a.shape[1:]
    ys, yq = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xq = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    return (slice(None), ys, xs), (slice(None), yq, xq)


_EIGHT_CONNECTED = np.zeros((3, 3, 3), dtype=bool)  # 8 neighbours within an image, none across the batch
_EIGHT_CONNECTED[1] = True


def label_components(cls: np.ndarray) -> np.ndarray:
    """8-connected components of equal non-negative values in cls [B, H, W] (``scipy.ndimage.label``,
    one class at a time).

    Returns int64 labels (0 = background): the flat index + 1 of the blob's first pixel, so labels
    are unique across the batch and do not depend on the labeller's own numbering.
    """
    from scipy import ndimage

    out = np.zeros(cls.size, dtype=np.int64)
    for value in np.unique(cls[cls >= 0]):
        labels, count = ndimage.label(cls == value, structure=_EIGHT_CONNECTED)
        flat = labels.reshape(-1)
        pixels = np.flatnonzero(flat)  # in flat order, so a blob's first occurrence is its first pixel
        blob = flat[pixels]
        ids, first = np.unique(blob, return_index=True)
        first_pixel = np.zeros(count + 1, dtype=np.int64)
        first_pixel[ids] = pixels[first]
        out[pixels] = first_pixel[blob] + 1
    return out.reshape(cls.shape)


# ---------------------------------------------------------------- blob statistics


def _blob_stats(cls: np.ndarray, dmin: np.ndarray) -> dict[str, np.ndarray]:
    """Per-blob image index, colour, area, centroid, mean colour quality and pixels.

    Pixel coordinates of blob i are `xs[start[i]:start[i] + area[i]]` (same for ys).
    """
    raw = label_components(cls)
    h, w = cls.shape[1:]
    flat = raw.reshape(-1)
    pix = np.flatnonzero(flat)
    roots, compact = np.unique(flat[pix], return_inverse=True)
    n = len(roots)
    order = np.argsort(compact, kind="stable")
    pix, compact = pix[order], compact[order]
    ys = (pix // w % h).astype(np.float64) + 0.5
    xs = (pix % w).astype(np.float64) + 0.5
    counts = np.bincount(compact, minlength=n)
    area = counts.astype(np.float64)
    quality = np.clip(
        1.0 - (dmin.reshape(-1)[pix] - FULL_COLOUR_DIST) / (SEG_DIST - FULL_COLOUR_DIST), 0, 1
    )
    return {
        "image": (roots - 1) // (h * w),
        "colour": cls.reshape(-1)[roots - 1],
        "area": area,
        "cx": np.bincount(compact, xs, n) / np.maximum(area, 1),
        "cy": np.bincount(compact, ys, n) / np.maximum(area, 1),
        "quality": np.bincount(compact, quality, n) / np.maximum(area, 1),
        "start": np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64),
        "xs": xs,
        "ys": ys,
        "pixel": pix,
        "pixel_blob": compact,
    }


def presence(area: float) -> float:
    """How much a blob counts as an object: 0 below MIN_AREA, 1 from FULL_AREA."""
    return min(1.0, max(0.0, (area - MIN_AREA) / (FULL_AREA - MIN_AREA)))


# ---------------------------------------------------------------- shape fitting


def ideal_pixel_count(
    shape: str, cx: np.ndarray, cy: np.ndarray, size: np.ndarray, res: int = IMAGE_SIZE
) -> np.ndarray:
    """Pixels of each ideal mask inside the image, counted row by row: [C] for [C] params.

    Equals shape_mask(shape, cx, cy, size, res).sum() without drawing the mask.
    """
    rows = np.arange(res, dtype=np.float64) + 0.5
    hw = row_half_width(shape, rows[None, :] - cy[:, None], size[:, None])  # [C, res]
    lo = np.maximum(np.ceil(cx[:, None] - hw - 0.5), 0.0)
    hi = np.minimum(np.floor(cx[:, None] + hw - 0.5), res - 1.0)
    return np.maximum(hi - lo + 1.0, 0.0).sum(1)


def fit_blob_ious(
    xs: np.ndarray, ys: np.ndarray, blob: np.ndarray, res: int = IMAGE_SIZE
) -> np.ndarray:
    """Best IoU of each blob against each ideal shape: [n_blobs, len(SHAPES)].

    xs, ys are pixel-centre coordinates grouped contiguously by `blob` (0..n-1,
    non-decreasing).  The ideal mask (the renderer's exact geometry) is placed with
    its centroid on the blob's, over a few sizes around the area-matched one --
    clipped to FIT_SIZE_RANGE, so huge or tiny blobs fit badly.  All blobs of a
    batch are fitted at once to keep the per-blob Python cost out of the loop.
    """
    n = int(blob[-1]) + 1 if len(blob) else 0
    area = np.bincount(blob, minlength=n).astype(np.float64)
    cx = np.bincount(blob, xs, n) / np.maximum(area, 1.0)
    cy = np.bincount(blob, ys, n) / np.maximum(area, 1.0)
    starts = np.flatnonzero(np.r_[True, blob[1:] != blob[:-1]]) if n else np.zeros(0, int)
    out = np.zeros((n, len(SHAPES)), dtype=np.float64)
    if n == 0:
        return out
    for i, shape in enumerate(SHAPES):
        r = np.sqrt(area / _AREA_PER_SIZE2[shape])[:, None] * FIT_SIZE_STEPS[None, :]
        r = np.clip(r, *FIT_SIZE_RANGE)  # [n, S]
        ccy = cy[:, None] - shape_centroid_offset(shape, r)
        dx = (xs - cx[blob])[None, :]
        inside = inside_shape(shape, dx, ys[None, :] - ccy[blob].T, r[blob].T)  # [S, P]
        inter = np.add.reduceat(inside, starts, axis=1, dtype=np.float64).T  # [n, S]
        ccx = np.broadcast_to(cx[:, None], r.shape)
        count = ideal_pixel_count(shape, ccx.ravel(), ccy.ravel(), r.ravel(), res)
        union = area[:, None] + count.reshape(r.shape) - inter
        out[:, i] = (inter / np.maximum(union, 1.0)).max(1)
    return out


def shape_score(ious: np.ndarray, shape: str) -> float:
    """Credit for `shape` given IoUs against all shapes.

    The requested IoU is reduced by how much a different shape fits better, so
    a square blob is not half a circle just because circle-IoU(square) ~ 0.83.
    """
    i = SHAPES.index(shape)
    own = float(ious[i])
    best_other = max((float(v) for j, v in enumerate(ious) if j != i), default=0.0)
    lo, hi = SHAPE_IOU
    return min(1.0, max(0.0, (own - max(0.0, best_other - own) - lo) / (hi - lo)))


def region_score(region: str | None, cx: float, cy: float, res: int = IMAGE_SIZE) -> float:
    """Soft agreement of a centroid with a region word (1 when well inside that half)."""
    if region is None:
        return 1.0
    half = res / 2.0
    signed = {
        "on the left": half - cx,
        "on the right": cx - half,
        "at the top": half - cy,
        "at the bottom": cy - half,
    }[region]
    return min(1.0, max(0.0, signed / (2.0 * REGION_RAMP) + 0.5))


# ---------------------------------------------------------------- matching and scoring


@lru_cache(maxsize=4096)
def _parse(prompt: str) -> SceneSpec:
    """Prompts repeat a lot during RL; parse each only once."""
    return parse_prompt(prompt)


def _requested_objects(spec: SceneSpec) -> list[tuple[str, str, str | None]]:
    """Expand groups into one (shape, colour, region) entry per object."""
    return [(g.shape, g.colour, g.region) for g in spec.groups for _ in range(g.count)]


@lru_cache(maxsize=256)
def _assignments(n_objects: int, n_blobs: int) -> np.ndarray:
    """All injective maps object -> blob or 'none' (index n_blobs + j), [P, n_objects]."""
    slots = range(n_blobs + n_objects)
    rows = list(itertools.permutations(slots, n_objects))
    return np.asarray(rows, dtype=np.int64).reshape(-1, n_objects)


def objectness(ious: np.ndarray) -> float:
    """How much a blob looks like any shape at all (so a colour flood is not an object)."""
    lo, hi = OBJECT_IOU
    return min(1.0, max(0.0, (float(np.max(ious)) - lo) / (hi - lo)))


def _pair_parts(
    obj: tuple[str, str, str | None], blob: dict[str, float], ious: np.ndarray
) -> tuple[float, float, float, float]:
    """(score, colour, shape, region) for one requested object explained by one blob."""
    shape, colour, region = obj
    same = PALETTE_NAMES[int(blob["colour"])] == colour
    c = blob["quality"] * (0.5 + 0.5 * objectness(ious)) if same else 0.0
    s = shape_score(ious, shape)
    r = region_score(region, blob["cx"], blob["cy"])
    # Shape/region credit fades with colour purity too, so a blob drifting out of
    # the palette loses its credit smoothly instead of at the SEG_DIST cliff.
    keep = min(1.0, blob["quality"] / 0.5) * (1.0 if same else WRONG_COLOUR_FACTOR)
    w_r = W_REGION if region is not None else 0.0
    score = (W_COLOUR * c + keep * (W_SHAPE * s + w_r * r)) / (W_COLOUR + W_SHAPE + w_r)
    return score * presence(blob["area"]), c, s, r


def _count_score(spec: SceneSpec, blob_colours: list[int], blob_presence: list[float]) -> float:
    """Colour-aware count agreement: matched counts over requested + surplus blobs."""
    want = np.zeros(len(PALETTE_NAMES))
    for g in spec.groups:
        want[PALETTE_NAMES.index(g.colour)] += g.count
    have = np.zeros(len(PALETTE_NAMES))
    for k, p in zip(blob_colours, blob_presence, strict=True):
        have[k] += p
    return float(np.minimum(want, have).sum() / (want.sum() + np.maximum(have - want, 0).sum()))


def _is_exact(obj: tuple[str, str, str | None], blob: dict[str, float], ious: np.ndarray) -> bool:
    """Strict per-object check: right colour, clearly the right shape, right half, full size."""
    shape, colour, region = obj
    return (
        PALETTE_NAMES[int(blob["colour"])] == colour
        and blob["quality"] >= 0.5
        and int(np.argmax(ious)) == SHAPES.index(shape)
        and ious[SHAPES.index(shape)] >= EXACT_MIN_IOU
        and region_score(region, blob["cx"], blob["cy"]) >= 0.5
        and blob["area"] >= FULL_AREA
    )


def _score_image(
    spec: SceneSpec, blobs: list[dict[str, float]], ious: list[np.ndarray], background: float
) -> dict[str, float]:
    """All metrics for one image, given its significant blobs (largest first) and the
    shape IoUs of the first MAX_CANDIDATES of them."""
    objects = _requested_objects(spec)
    n_obj = len(objects)
    cand = blobs[:MAX_CANDIDATES]
    pres = np.asarray([presence(b["area"]) for b in blobs], dtype=np.float64)
    parts = np.zeros((n_obj, len(cand) + n_obj, 4))
    for i, obj in enumerate(objects):
        for j, blob in enumerate(cand):
            parts[i, j] = _pair_parts(obj, blob, ious[j])
    assign = _assignments(n_obj, len(cand))
    rows = np.arange(n_obj)
    matched = parts[rows, assign, 0].sum(1)
    real = assign < len(cand)
    pres_padded = np.concatenate([pres[: len(cand)], np.zeros(n_obj)])
    extra = pres.sum() - (pres_padded[assign] * real).sum(1)
    objective = matched / (n_obj + extra)
    best = int(np.argmax(objective))
    chosen = assign[best]
    picked = parts[rows, chosen]
    hit = real[best]
    exact = bool(
        all(hit)
        and all(_is_exact(objects[i], cand[chosen[i]], ious[chosen[i]]) for i in rows)
        and not any(
            b["area"] >= FULL_AREA for j, b in enumerate(blobs) if j not in set(chosen.tolist())
        )
    )
    obj_score = float(objective[best])
    return {
        "reward": obj_score * (1.0 - BG_WEIGHT + BG_WEIGHT * background),
        "exact": float(exact),
        "objects": obj_score,
        "colour": float(picked[:, 1].mean()),
        "shape": float(np.where(hit, picked[:, 2], 0.0).mean()),
        "position": float(np.where(hit, picked[:, 3], 0.0).mean()),
        "count": _count_score(spec, [int(b["colour"]) for b in blobs], pres.tolist()),
        "extra": float(extra[best]),
        "background": background,
    }


def _background_scores(dbg: np.ndarray, covered: np.ndarray) -> np.ndarray:
    """Mean cleanliness of pixels away from (1-px dilated) blobs, per image."""
    grown = covered.copy()
    for dy, dx in _NEIGHBOURS:
        p, q = _shift_pairs(covered, dy, dx)
        grown[p] |= covered[q]
        grown[q] |= covered[p]
    lo, hi = BG_DIST
    clean = np.clip(1.0 - (dbg - lo) / (hi - lo), 0.0, 1.0)
    free = ~grown
    n_free = free.sum((1, 2))
    return np.where(n_free > 0, (clean * free).sum((1, 2)) / np.maximum(n_free, 1), 0.0)


METRIC_NAMES: tuple[str, ...] = (
    "reward",
    "exact",
    "objects",
    "colour",
    "shape",
    "position",
    "count",
    "extra",
    "background",
)


def scene_metrics(images: torch.Tensor | np.ndarray, prompts: list[str]) -> dict[str, torch.Tensor]:
    """Reward plus its components, each a float32 tensor [B] on the images' device.

    `reward` is the dense training signal in [0, 1]; `exact` is 1 only when every
    requested object is present with the right colour, shape, count and region and
    no extra object exists.  Raises ValueError for unparseable prompts.
    """
    images = torch.as_tensor(images)
    if images.ndim != 4 or images.shape[1:] != (3, IMAGE_SIZE, IMAGE_SIZE):
        want = f"[B, 3, {IMAGE_SIZE}, {IMAGE_SIZE}]"
        raise ValueError(f"expected images {want}, got {tuple(images.shape)}")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    specs = [_parse(p) for p in prompts]
    arr = torch.nan_to_num(images.detach().to("cpu", torch.float32), nan=0.0).clamp(0.0, 1.0)
    arr = arr.numpy()
    cls, dmin, dbg = _segment(arr)
    stats = _blob_stats(cls, dmin)
    keep = np.flatnonzero(stats["area"] >= MIN_AREA)
    keep = keep[np.lexsort((keep, -stats["area"][keep], stats["image"][keep]))]
    covered = np.zeros(cls.shape, dtype=bool)
    covered.reshape(-1)[stats["pixel"][np.isin(stats["pixel_blob"], keep)]] = True
    background = _background_scores(dbg, covered)
    # Fit every candidate blob of the batch in one go (pixels are grouped by blob id).
    cand = np.concatenate(
        [keep[stats["image"][keep] == b][:MAX_CANDIDATES] for b in range(len(prompts))]
    ).astype(np.int64)
    is_cand = np.zeros(len(stats["area"]), dtype=bool)
    is_cand[cand] = True
    sel = is_cand[stats["pixel_blob"]]
    ids, group = np.unique(stats["pixel_blob"][sel], return_inverse=True)
    ious = fit_blob_ious(stats["xs"][sel], stats["ys"][sel], group.reshape(-1))
    row_of = dict(zip(ids.tolist(), range(len(ids)), strict=True))
    out = {k: np.zeros(len(prompts)) for k in METRIC_NAMES}
    fields = ("colour", "area", "cx", "cy", "quality")
    for b, spec in enumerate(specs):
        ids_b = keep[stats["image"][keep] == b]
        blobs = [{k: float(stats[k][j]) for k in fields} for j in ids_b]
        fits = [ious[row_of[j]] for j in ids_b[:MAX_CANDIDATES].tolist()]
        for k, v in _score_image(spec, blobs, fits, float(background[b])).items():
            out[k][b] = v
    dev = images.device
    return {k: torch.as_tensor(v, dtype=torch.float32, device=dev) for k, v in out.items()}


def scene_reward(images: torch.Tensor | np.ndarray, prompts: list[str]) -> torch.Tensor:
    """Dense compositional reward in [0, 1], shape [B] (see module docstring)."""
    return scene_metrics(images, prompts)["reward"]


def build(weights: str | None = None, device: object = "cpu"
          ) -> Callable[[torch.Tensor, Sequence[str]], dict[str, torch.Tensor]]:
    """The registry's builder: the scene reward has no weights and runs on CPU (numpy), whatever
    device the images come from."""
    if weights is not None:
        raise ValueError("reward 'scene' takes no weights (it is programmatic)")

    def score(images: torch.Tensor, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
        return scene_metrics(torch.as_tensor(images).detach().cpu(), list(prompts))

    return score
