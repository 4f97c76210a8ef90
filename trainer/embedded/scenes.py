"""Procedural compositional scenes: a few coloured shapes on a plain background.

A scene is described by a `SceneSpec` (groups of identical objects, each with a
shape, a colour, a count and an optional region word).  The spec maps one-to-one
to a plain English prompt, so a reward can recover exactly what was asked from
the prompt alone.  Everything is deterministic given a `numpy.random.Generator`.

Geometry convention: `size` is the half-extent of an object, so every shape of
size r fits exactly in the box [cx - r, cx + r] x [cy - r, cy + r]; pixel (i, j)
is sampled at its centre (x = j + 0.5, y = i + 0.5); y grows downwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

IMAGE_SIZE = 64
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
# Saturated colours whose pairwise RGB distance is >= 0.6, so nearest-colour
# segmentation stays unambiguous; all are far from the background.
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.10, 0.10),
    "green": (0.10, 0.75, 0.15),
    "blue": (0.15, 0.25, 0.95),
    "yellow": (0.95, 0.85, 0.10),
    "purple": (0.75, 0.10, 0.85),
}
BACKGROUND: tuple[float, float, float] = (0.10, 0.10, 0.10)
REGIONS: tuple[str, ...] = ("on the left", "on the right", "at the top", "at the bottom")
# Region pairs that never compete for space, so a two-group scene always fits.
OPPOSITE_REGIONS: tuple[tuple[str, str], ...] = (
    ("on the left", "on the right"),
    ("at the top", "at the bottom"),
)
COUNT_WORDS: dict[int, str] = {1: "a", 2: "two"}
MAX_OBJECTS = 3
SIZE_RANGE: tuple[float, float] = (8.0, 11.0)  # per-scene base half-extent in px
SIZE_JITTER = 0.05  # per-object relative jitter around the scene's base size
GAP = 3.0  # min px between object bounding boxes, keeps objects separate blobs
EDGE_MARGIN = 1.0  # px between an object and the image / region border

VOCABULARY: frozenset[str] = frozenset(
    set(COUNT_WORDS.values())
    | set(COLOURS)
    | set(SHAPES)
    | {s + "s" for s in SHAPES}
    | {w for r in REGIONS for w in r.split()}
    | {"and"}
)


@dataclass(frozen=True)
class ObjectSpec:
    """A group of `count` identical objects, optionally confined to a region."""

    shape: str
    colour: str
    count: int
    region: str | None = None


@dataclass(frozen=True)
class SceneSpec:
    """What a prompt asks for: an ordered tuple of object groups."""

    groups: tuple[ObjectSpec, ...]

    @property
    def n_objects(self) -> int:
        """Total number of objects in the scene."""
        return sum(g.count for g in self.groups)


@dataclass(frozen=True)
class Placed:
    """One concrete object in an image (centre and half-extent in pixels)."""

    shape: str
    colour: str
    cx: float
    cy: float
    size: float


# ---------------------------------------------------------------- specs


def validate_spec(spec: SceneSpec) -> SceneSpec:
    """Raise ValueError if the spec is outside the domain the generator can render."""
    if not spec.groups:
        raise ValueError("scene spec has no object groups")
    if not 1 <= spec.n_objects <= MAX_OBJECTS:
        raise ValueError(f"scene has {spec.n_objects} objects, expected 1..{MAX_OBJECTS}")
    seen: set[tuple[str, str]] = set()
    regions: list[str] = []
    for g in spec.groups:
        if g.shape not in SHAPES:
            raise ValueError(f"unknown shape {g.shape!r}")
        if g.colour not in COLOURS:
            raise ValueError(f"unknown colour {g.colour!r}")
        if g.count not in COUNT_WORDS:
            raise ValueError(f"unsupported count {g.count}")
        if g.region is not None:
            if g.region not in REGIONS:
                raise ValueError(f"unknown region {g.region!r}")
            regions.append(g.region)
        if (g.colour, g.shape) in seen:
            raise ValueError(f"group '{g.colour} {g.shape}' appears twice")
        seen.add((g.colour, g.shape))
    if len(set(regions)) != len(regions):
        raise ValueError("two groups share the same region")
    return spec


def _sample_counts(rng: np.random.Generator) -> tuple[int, ...]:
    """Pick how many groups and how many objects per group (total <= 3)."""
    options: tuple[tuple[int, ...], ...] = ((1,), (2,), (1, 1), (2, 1), (1, 2), (1, 1, 1))
    probs = np.array([0.15, 0.15, 0.25, 0.15, 0.15, 0.15])
    return options[int(rng.choice(len(options), p=probs))]


def sample_spec(rng: np.random.Generator) -> SceneSpec:
    """Sample a random scene spec; regions are only used for two-group scenes."""
    counts = _sample_counts(rng)
    colours = tuple(COLOURS)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < len(counts):
        pair = (SHAPES[int(rng.integers(len(SHAPES)))], colours[int(rng.integers(len(colours)))])
        if pair not in pairs:
            pairs.append(pair)
    regions: tuple[str | None, ...] = (None,) * len(counts)
    if len(counts) == 2 and rng.random() < 0.5:
        a, b = OPPOSITE_REGIONS[int(rng.integers(len(OPPOSITE_REGIONS)))]
        regions = (a, b) if rng.random() < 0.5 else (b, a)
    groups = tuple(
        ObjectSpec(shape=s, colour=c, count=n, region=r)
        for (s, c), n, r in zip(pairs, counts, regions, strict=True)
    )
    return SceneSpec(groups=groups)


# ---------------------------------------------------------------- prompts


def _group_phrase(g: ObjectSpec) -> str:
    """'a red circle', 'two blue squares on the left', ..."""
    noun = g.shape if g.count == 1 else g.shape + "s"
    phrase = f"{COUNT_WORDS[g.count]} {g.colour} {noun}"
    return f"{phrase} {g.region}" if g.region else phrase


def spec_to_prompt(spec: SceneSpec) -> str:
    """Render a spec as plain English; `parse_prompt` is its exact inverse."""
    phrases = [_group_phrase(g) for g in spec.groups]
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


_WORD_TO_COUNT = {w: n for n, w in COUNT_WORDS.items()}
_REGION_TOKENS = tuple((r, tuple(r.split())) for r in REGIONS)


def _parse_error(prompt: str, tokens: list[str], i: int) -> ValueError:
    """One-line error naming the offending word (or saying the prompt ended early)."""
    if i >= len(tokens):
        return ValueError(f"cannot parse prompt {prompt!r}: it ends early")
    tok = tokens[i]
    kind = "unexpected" if tok in VOCABULARY or tok == "," else "unknown"
    return ValueError(f"cannot parse prompt {prompt!r}: {kind} word {tok!r}")


def _parse_group(prompt: str, tokens: list[str], i: int) -> tuple[ObjectSpec, int]:
    """Parse '<count> <colour> <shape>[s] [<region>]' starting at token i."""
    if i >= len(tokens) or tokens[i] not in _WORD_TO_COUNT:
        raise _parse_error(prompt, tokens, i)
    count = _WORD_TO_COUNT[tokens[i]]
    if i + 1 >= len(tokens) or tokens[i + 1] not in COLOURS:
        raise _parse_error(prompt, tokens, i + 1)
    colour = tokens[i + 1]
    noun = tokens[i + 2] if i + 2 < len(tokens) else None
    shape = noun if count == 1 else (noun[:-1] if noun and noun.endswith("s") else None)
    if shape not in SHAPES:
        raise _parse_error(prompt, tokens, i + 2)
    region, i = _parse_region(prompt, tokens, i + 3)
    return ObjectSpec(shape=shape, colour=colour, count=count, region=region), i


def _parse_region(prompt: str, tokens: list[str], i: int) -> tuple[str | None, int]:
    """Optional region phrase at token i; errors point at the first word that breaks one."""
    matched = 0  # longest partial match, to name the offending word
    for name, words in _REGION_TOKENS:
        got = tuple(tokens[i : i + len(words)])
        if got == words:
            return name, i + len(words)
        pairs = zip(got, words, strict=False)  # got may be cut short by the prompt's end
        prefix = next((k for k, (a, b) in enumerate(pairs) if a != b), len(got))
        matched = max(matched, prefix)
    if matched:
        raise _parse_error(prompt, tokens, i + matched)
    return None, i


def parse_prompt(prompt: str) -> SceneSpec:
    """Recover the SceneSpec from a prompt; ValueError (one line) if it is not one of ours."""
    tokens = prompt.strip().lower().rstrip(".").replace(",", " , ").split()
    groups: list[ObjectSpec] = []
    i = 0
    while True:
        group, i = _parse_group(prompt, tokens, i)
        groups.append(group)
        if i == len(tokens):
            break
        if tokens[i] not in (",", "and"):
            raise _parse_error(prompt, tokens, i)
        i += 1
    try:
        return validate_spec(SceneSpec(groups=tuple(groups)))
    except ValueError as err:
        raise ValueError(f"cannot parse prompt {prompt!r}: {err}") from None


# ---------------------------------------------------------------- geometry


def inside_shape(
    shape: str, dx: np.ndarray, dy: np.ndarray, size: np.ndarray | float
) -> np.ndarray:
    """Ideal membership test for offsets (dx, dy) from the object's box centre.

    Broadcasts, so the reward can test many candidate fits at once with the
    exact same geometry the renderer uses.
    """
    if shape == "circle":
        return dx * dx + dy * dy <= size * size
    if shape == "square":
        return (np.abs(dx) <= size) & (np.abs(dy) <= size)
    if shape == "triangle":  # apex up at dy = -size, base at dy = +size, width 2*size
        return (dy <= size) & (2.0 * np.abs(dx) <= dy + size)
    raise ValueError(f"unknown shape {shape!r}")


def row_half_width(shape: str, dy: np.ndarray, size: np.ndarray | float) -> np.ndarray:
    """Half-width of the shape's row at vertical offset dy (negative: row misses it).

    Same geometry as `inside_shape` (inside iff |dx| <= half-width), in a form that
    lets the reward count an ideal mask's pixels row by row without drawing it.
    """
    dy = np.asarray(dy, dtype=np.float64)
    size = np.asarray(size, dtype=np.float64)
    within = np.abs(dy) <= size
    if shape == "circle":
        return np.where(within, np.sqrt(np.maximum(size * size - dy * dy, 0.0)), -1.0)
    if shape == "square":
        return np.where(within, size + 0.0 * dy, -1.0)
    if shape == "triangle":
        return np.where(within, (dy + size) / 2.0, -1.0)
    raise ValueError(f"unknown shape {shape!r}")


def shape_centroid_offset(shape: str, size: np.ndarray | float) -> np.ndarray | float:
    """Vertical offset (centroid - box centre) of the ideal shape; only triangles differ."""
    return size / 3.0 if shape == "triangle" else 0.0 * size


def pixel_grid(res: int = IMAGE_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates (x, y), each shaped [res, res]."""
    c = np.arange(res, dtype=np.float32) + 0.5
    return c[None, :].repeat(res, 0), c[:, None].repeat(res, 1)


_GRIDS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _grid(res: int) -> tuple[np.ndarray, np.ndarray]:
    """Cached pixel grid (read-only use)."""
    if res not in _GRIDS:
        _GRIDS[res] = pixel_grid(res)
    return _GRIDS[res]


def shape_mask(shape: str, cx: float, cy: float, size: float, res: int = IMAGE_SIZE) -> np.ndarray:
    """Ideal boolean mask [res, res] of one shape (what render draws, pixel for pixel)."""
    xs, ys = _grid(res)
    return inside_shape(shape, xs - np.float32(cx), ys - np.float32(cy), np.float32(size))


# ---------------------------------------------------------------- layout and render


def _centre_box(region: str | None, size: float, res: int) -> tuple[float, float, float, float]:
    """Allowed (xlo, xhi, ylo, yhi) for an object centre so the whole object is in region."""
    lo, hi = size + EDGE_MARGIN, res - size - EDGE_MARGIN
    half = res / 2.0
    xlo, xhi, ylo, yhi = lo, hi, lo, hi
    if region == "on the left":
        xhi = half - size - EDGE_MARGIN
    elif region == "on the right":
        xlo = half + size + EDGE_MARGIN
    elif region == "at the top":
        yhi = half - size - EDGE_MARGIN
    elif region == "at the bottom":
        ylo = half + size + EDGE_MARGIN
    return xlo, xhi, ylo, yhi


def _separated(a: Placed, b: Placed) -> bool:
    """Bounding boxes at least GAP apart along some axis (so masks never touch)."""
    need = a.size + b.size + GAP
    return abs(a.cx - b.cx) >= need or abs(a.cy - b.cy) >= need


def _try_layout(
    spec: SceneSpec, rng: np.random.Generator, base: float, res: int
) -> list[Placed] | None:
    """One rejection-sampling attempt; None if some object found no free spot."""
    placed: list[Placed] = []
    for g in spec.groups:
        for _ in range(g.count):
            size = float(base * rng.uniform(1.0 - SIZE_JITTER, 1.0 + SIZE_JITTER))
            xlo, xhi, ylo, yhi = _centre_box(g.region, size, res)
            if xlo > xhi or ylo > yhi:
                return None
            for _ in range(40):
                cand = Placed(
                    g.shape,
                    g.colour,
                    float(rng.uniform(xlo, xhi)),
                    float(rng.uniform(ylo, yhi)),
                    size,
                )
                if all(_separated(cand, p) for p in placed):
                    placed.append(cand)
                    break
            else:
                return None
    return placed


def layout(spec: SceneSpec, rng: np.random.Generator, res: int = IMAGE_SIZE) -> list[Placed]:
    """Place every object (group order, `count` consecutive entries per group).

    Objects never overlap or touch, and an object with a region lies entirely
    in that half of the image.  Sizes shrink only if a crowded spec cannot fit.
    """
    base = float(rng.uniform(*SIZE_RANGE)) * res / IMAGE_SIZE
    for attempt in range(200):
        shrink = 1.0 if attempt < 50 else max(0.5, 1.0 - 0.01 * (attempt - 49))
        placed = _try_layout(spec, rng, base * shrink, res)
        if placed is not None:
            return placed
    raise ValueError(f"cannot lay out scene {spec_to_prompt(spec)!r}")


def render(placed: list[Placed], size: int = IMAGE_SIZE) -> np.ndarray:
    """Draw objects as their exact ideal masks (no anti-aliasing): float32 [3, H, W] in [0, 1]."""
    img = np.empty((3, size, size), dtype=np.float32)
    img[:] = np.asarray(BACKGROUND, dtype=np.float32)[:, None, None]
    for p in placed:
        m = shape_mask(p.shape, p.cx, p.cy, p.size, res=size)
        img[:, m] = np.asarray(COLOURS[p.colour], dtype=np.float32)[:, None]
    return img


Captioner = Callable[[SceneSpec, np.random.Generator], str]


def sample_scene(rng: np.random.Generator, caption: Captioner | None = None) -> tuple[np.ndarray, str]:
    """One random (image [3, 64, 64], prompt) pair; ``caption`` (drawn after the layout, from the
    same generator) replaces the exact prompt, e.g. with pretraining caption noise."""
    spec = sample_spec(rng)
    image = render(layout(spec, rng))
    return image, spec_to_prompt(spec) if caption is None else caption(spec, rng)


def sample_batch(n: int, rng: np.random.Generator, caption: Captioner | None = None
                 ) -> tuple[np.ndarray, list[str]]:
    """n random scenes: images float32 [n, 3, 64, 64] and their prompts (see ``sample_scene``)."""
    images = np.empty((n, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    prompts: list[str] = []
    for i in range(n):
        images[i], prompt = sample_scene(rng, caption)
        prompts.append(prompt)
    return images, prompts
