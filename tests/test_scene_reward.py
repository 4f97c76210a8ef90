"""Scene reward: clean renders score high, noise and blanks low, partial credit is
ordered, and blocky patch artefacts / colour floods / speckles do not earn credit."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque

import numpy as np
import pytest
import torch

from dynamic_treerpo.trainer.embedded.scenes import (
    BACKGROUND,
    COLOURS,
    IMAGE_SIZE,
    SHAPES,
    ObjectSpec,
    Placed,
    SceneSpec,
    layout,
    parse_prompt,
    render,
    sample_spec,
    shape_mask,
    spec_to_prompt,
)
from dynamic_treerpo.trainer.rewards.scene_reward import (
    ideal_pixel_count,
    label_components,
    scene_metrics,
    scene_reward,
)

OPPOSITE = {
    "on the left": "on the right",
    "on the right": "on the left",
    "at the top": "at the bottom",
    "at the bottom": "at the top",
}


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _score(images: list[np.ndarray], prompts: list[str]) -> dict[str, np.ndarray]:
    out = scene_metrics(torch.from_numpy(np.stack(images)), prompts)
    return {k: v.numpy() for k, v in out.items()}


def _blank() -> np.ndarray:
    return render([])


def _from_mask(mask: np.ndarray, colour: str = "red") -> np.ndarray:
    img = _blank()
    img[:, mask] = np.asarray(COLOURS[colour], dtype=np.float32)[:, None]
    return img


def _blocks(cells: list[tuple[int, int]]) -> np.ndarray:
    """Union of 8x8 grid-aligned blocks, the native artefact of a patch generator."""
    mask = np.zeros((IMAGE_SIZE, IMAGE_SIZE), dtype=bool)
    for i, j in cells:
        mask[i * 8 : (i + 1) * 8, j * 8 : (j + 1) * 8] = True
    return mask


def _specs(seed: int, n: int, min_objects: int = 1, regions: bool = False) -> list[SceneSpec]:
    rng, out = _rng(seed), []
    while len(out) < n:
        s = sample_spec(rng)
        if s.n_objects >= min_objects and (not regions or s.groups[0].region is not None):
            out.append(s)
    return out


@pytest.fixture(scope="module")
def clean() -> tuple[list[np.ndarray], list[str], dict[str, np.ndarray]]:
    rng = _rng(100)
    specs = [sample_spec(rng) for _ in range(300)]
    images = [render(layout(parse_prompt(spec_to_prompt(s)), rng)) for s in specs]
    prompts = [spec_to_prompt(s) for s in specs]
    return images, prompts, _score(images, prompts)


def test_clean_renders_score_high(clean) -> None:
    _, _, m = clean
    assert m["reward"].mean() >= 0.95 and m["reward"].min() >= 0.9
    assert m["exact"].mean() == 1.0


def test_all_metrics_in_unit_range(clean) -> None:
    _, _, m = clean
    for k in ("reward", "exact", "colour", "shape", "position", "count", "background"):
        assert m[k].shape == (300,) and (m[k] >= 0).all() and (m[k] <= 1).all(), k


@pytest.mark.parametrize("kind", ["gauss", "gauss_mid", "uniform", "blank"])
def test_noise_and_blank_score_low(clean, kind: str) -> None:
    _, prompts, _ = clean
    gen = torch.Generator().manual_seed(0)
    shape = (len(prompts), 3, IMAGE_SIZE, IMAGE_SIZE)
    images = {
        "gauss": lambda: torch.randn(shape, generator=gen).clamp(0, 1),
        "gauss_mid": lambda: (0.5 + 0.3 * torch.randn(shape, generator=gen)).clamp(0, 1),
        "uniform": lambda: torch.rand(shape, generator=gen),
        "blank": lambda: torch.from_numpy(_blank()).expand(shape).contiguous(),
    }[kind]()
    m = scene_metrics(images, prompts)
    assert m["reward"].max() <= 0.1 and m["exact"].max() == 0.0


def _one_wrong(spec: SceneSpec, placed: list[Placed], rng, what: str) -> list[Placed]:
    """Copy of placed with one object's colour or shape changed, or one object removed."""
    i = int(rng.integers(len(placed)))
    p, out = placed[i], list(placed)
    if what == "missing":
        del out[i]
    elif what == "colour":
        other = [c for c in COLOURS if c != p.colour]
        out[i] = dataclasses.replace(p, colour=str(rng.choice(other)))
    else:
        other = [s for s in SHAPES if s != p.shape]
        out[i] = dataclasses.replace(p, shape=str(rng.choice(other)))
    return out


def _all_wrong(spec: SceneSpec, rng) -> list[Placed]:
    """Unrequested colours, other shapes and (if any) the opposite regions for everything."""
    swapped = SceneSpec(
        tuple(dataclasses.replace(g, region=OPPOSITE.get(g.region)) for g in spec.groups)
    )
    unused = [c for c in COLOURS if c not in {g.colour for g in spec.groups}]
    return [
        dataclasses.replace(
            p,
            colour=str(rng.choice(unused)),
            shape=str(rng.choice([s for s in SHAPES if s != p.shape])),
        )
        for p in layout(swapped, rng)
    ]


@pytest.mark.parametrize("what", ["colour", "shape", "missing"])
def test_partial_credit_is_ordered(what: str) -> None:
    rng = _rng({"colour": 1, "shape": 2, "missing": 3}[what])
    specs = _specs(10, 80, min_objects=2 if what == "missing" else 1)
    prompts = [spec_to_prompt(s) for s in specs]
    good, bad, worst = [], [], []
    for s in specs:
        placed = layout(s, rng)
        good.append(render(placed))
        bad.append(render(_one_wrong(s, placed, rng, what)))
        worst.append(render(_all_wrong(s, rng)))
    g, b, w = (_score(x, prompts) for x in (good, bad, worst))
    blank = _score([_blank()] * len(prompts), prompts)
    assert (g["reward"] > b["reward"] + 0.05).all()
    assert (b["reward"] > w["reward"] + 0.05).all()
    assert (b["reward"] > blank["reward"] + 0.05).all()
    assert b["exact"].max() == 0.0 and w["exact"].max() == 0.0
    component = {"colour": "colour", "shape": "shape", "missing": "count"}[what]
    assert (g[component] > b[component]).all()


def test_wrong_region_gets_partial_credit() -> None:
    rng = _rng(4)
    specs = _specs(11, 60, regions=True)
    prompts = [spec_to_prompt(s) for s in specs]
    good, bad, worst = [], [], []
    for s in specs:
        good.append(render(layout(s, rng)))
        swapped = tuple(dataclasses.replace(g, region=OPPOSITE[g.region]) for g in s.groups)
        bad.append(render(layout(SceneSpec(swapped), rng)))
        worst.append(render(_all_wrong(s, rng)))
    g, b, w = (_score(x, prompts) for x in (good, bad, worst))
    assert (g["reward"] > b["reward"] + 0.05).all() and (b["reward"] > w["reward"] + 0.05).all()
    assert b["exact"].max() == 0
    # Where the two groups differ in colour, the wrong side is the only reading of the image. Where
    # they share it, "circle on the wrong side" and "wrong shape on the right side" cost the same
    # (a region weighs as much as a shape), so only the sum of the two credits is pinned.
    apart = torch.tensor([len({gr.colour for gr in s.groups}) == 2 for s in specs])
    assert apart.sum() >= 30
    assert (b["position"][apart] < 0.1).all() and (b["shape"][apart] > 0.9).all()
    assert (b["position"][~apart] + b["shape"][~apart] < 1.75).all()


def test_extra_objects_are_penalised() -> None:
    rng = _rng(5)
    specs = [s for s in _specs(12, 200) if s.n_objects <= 2][:60]
    prompts = [spec_to_prompt(s) for s in specs]
    good, extra = [], []
    for s in specs:
        placed = layout(s, rng)
        good.append(render(placed))
        # an extra copy of one requested object, placed with the generator's own spacing rules
        groups = [dataclasses.replace(g, region=None) for g in s.groups]
        more = SceneSpec((*groups, dataclasses.replace(groups[0], count=1)))
        extra.append(render(layout(more, rng)))
    g, e = _score(good, prompts), _score(extra, prompts)
    assert (e["reward"] < g["reward"] - 0.15).all() and e["exact"].max() == 0.0
    assert (e["count"] < 1.0).all()


def test_count_two_needs_two() -> None:
    rng = _rng(6)
    two = layout(parse_prompt("two red circles"), rng)
    three = layout(SceneSpec((ObjectSpec("circle", "red", 2), ObjectSpec("circle", "red", 1))), rng)
    m = _score([render(two), render(two[:1]), render(three)], ["two red circles"] * 3)
    assert m["reward"][0] > 0.95 and 0.3 < m["reward"][1] < 0.7 and 0.3 < m["reward"][2] < 0.8
    assert m["count"][0] == 1.0 and m["count"][1] < 1.0 and m["count"][2] < 1.0
    assert m["exact"].tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("name", "cells"),
    [
        ("square16", [(2, 2), (2, 3), (3, 2), (3, 3)]),
        ("square24", [(i, j) for i in (2, 3, 4) for j in (2, 3, 4)]),
        ("l_shape", [(2, 2), (3, 2), (3, 3)]),
        ("l_shape_flipped", [(2, 3), (3, 2), (3, 3)]),
        ("plus", [(2, 3), (3, 2), (3, 3), (3, 4), (4, 3)]),
        ("bar", [(3, 1), (3, 2), (3, 3), (3, 4)]),
    ],
)
def test_blocky_patch_artefacts_are_not_circles_or_triangles(name: str, cells) -> None:
    blob = _from_mask(_blocks(cells))
    real = _score([render([Placed("circle", "red", 28.0, 28.0, 10.0)])], ["a red circle"])
    m = _score([blob] * 2, ["a red circle", "a red triangle"])
    assert real["shape"][0] >= 0.9 and real["reward"][0] >= 0.95
    assert (m["shape"] < 0.6).all(), m["shape"]
    assert (m["reward"] < real["reward"][0] - 0.3).all(), m["reward"]
    assert m["exact"].max() == 0.0


def test_l_shape_gets_no_shape_credit_for_any_shape() -> None:
    blob = _from_mask(_blocks([(2, 2), (3, 2), (3, 3)]))
    m = _score([blob] * 3, [f"a red {s}" for s in SHAPES])
    assert (m["shape"] < 0.6).all(), m["shape"]


def test_real_shapes_score_as_themselves_not_as_others() -> None:
    rng = _rng(7)
    images, prompts, own = [], [], []
    for _ in range(30):
        for shape in SHAPES:
            p = Placed(shape, "green", *rng.uniform(20, 44, 2), rng.uniform(7.5, 12))
            for asked in SHAPES:
                images.append(render([p]))
                prompts.append(f"a green {asked}")
                own.append(asked == shape)
    m = _score(images, prompts)
    own = np.asarray(own)
    assert (m["shape"][own] >= 0.9).all() and (m["shape"][~own] <= 0.45).all()


def _blur(img: np.ndarray, sigma: float) -> np.ndarray:
    r = int(3 * sigma) + 1
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k = torch.tensor(k / k.sum(), dtype=torch.float32)
    x = torch.nn.functional.pad(torch.from_numpy(img)[None], (r, r, r, r), mode="replicate")
    x = torch.nn.functional.conv2d(x, k.view(1, 1, 1, -1).repeat(3, 1, 1, 1), groups=3)
    x = torch.nn.functional.conv2d(x, k.view(1, 1, -1, 1).repeat(3, 1, 1, 1), groups=3)
    return x[0].numpy()


def test_blurry_and_faint_blobs_get_reduced_credit() -> None:
    sharp = render([Placed("circle", "red", 32.0, 32.0, 10.0)])
    bg = np.asarray(BACKGROUND, dtype=np.float32)[:, None, None]
    faint = [sharp * a + (1 - a) * bg for a in (0.85, 0.75, 0.7, 0.6)]
    m = _score([sharp, _blur(sharp, 1.5), _blur(sharp, 3.0), *faint], ["a red circle"] * 7)
    r = m["reward"]
    assert r[0] >= 0.99
    assert r[0] > r[1] > r[2] > 0.5  # blur costs colour purity at the rim, shape survives
    assert r[0] > r[3] > r[4] > r[5] > r[6]  # fainter: monotonically less
    assert r[6] <= 0.1


def test_speckled_noisy_background_earns_nothing() -> None:
    rng = _rng(8)
    palette = np.asarray(list(COLOURS.values()), dtype=np.float32)
    images, prompts = [], []
    for s in _specs(13, 100):
        img = _blank() + rng.normal(0.0, 0.08, (3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
        for _ in range(80):  # palette-coloured specks of 1-3 px
            y, x = rng.integers(0, IMAGE_SIZE - 3, 2)
            k = int(rng.integers(1, 4))
            img[:, y : y + k, x : x + k] = palette[rng.integers(len(palette))][:, None, None]
        images.append(np.clip(img, 0, 1))
        prompts.append(spec_to_prompt(s))
    m = _score(images, prompts)
    assert m["reward"].max() <= 0.1 and m["exact"].max() == 0.0


def test_clean_objects_on_noisy_background_still_score_well_but_lower() -> None:
    rng = _rng(9)
    specs = _specs(14, 40)
    prompts = [spec_to_prompt(s) for s in specs]
    clean = [render(layout(s, rng)) for s in specs]
    noisy = [np.clip(c + rng.normal(0, 0.06, c.shape).astype(np.float32), 0, 1) for c in clean]
    a, b = _score(clean, prompts), _score(noisy, prompts)
    assert (b["reward"] < a["reward"]).all() and (b["reward"] > 0.8).all()


def test_colour_flood_is_not_an_object() -> None:
    flood = np.broadcast_to(
        np.asarray(COLOURS["red"], dtype=np.float32)[:, None, None], (3, IMAGE_SIZE, IMAGE_SIZE)
    ).copy()
    half = _blank()
    half[:, :, :32] = flood[:, :, :32]
    m = _score([flood, half], ["a red circle", "a red square"])
    assert (m["reward"] <= 0.3).all() and m["exact"].max() == 0.0


def test_out_of_range_and_nan_inputs_are_handled() -> None:
    rng = _rng(10)
    s = parse_prompt("a blue square and two yellow triangles")
    img = torch.from_numpy(render(layout(s, rng)))
    wild = img * 3.0 - 1.0  # pushes channels beyond [0, 1]; clamping keeps the colours
    wild[0, 0, 0] = float("nan")
    r = scene_reward(torch.stack([img, wild]), [spec_to_prompt(s)] * 2)
    assert torch.isfinite(r).all() and (r >= 0).all() and (r <= 1).all()
    assert r[0] >= 0.95


def test_deterministic_and_independent_of_batch(clean) -> None:
    images, prompts, m = clean
    x = torch.from_numpy(np.stack(images[:16]))
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(1))
    mixed = torch.cat([x, noise])
    a = scene_metrics(mixed, prompts[:16] * 2)
    b = scene_metrics(mixed, prompts[:16] * 2)
    for k in a:
        assert torch.equal(a[k], b[k])
    single = torch.stack([scene_reward(x[i : i + 1], prompts[i : i + 1])[0] for i in range(16)])
    assert torch.allclose(single, a["reward"][:16]) and torch.allclose(
        a["reward"][:16], torch.from_numpy(m["reward"][:16])
    )


def test_reward_keeps_device_and_dtype() -> None:
    x = torch.from_numpy(_blank())[None].to(torch.bfloat16)
    r = scene_reward(x, ["a red circle"])
    assert r.dtype == torch.float32 and r.shape == (1,) and r.device == x.device


def test_bad_inputs_raise() -> None:
    x = torch.from_numpy(_blank())[None]
    with pytest.raises(ValueError, match="hexagon"):
        scene_reward(x, ["a red hexagon"])
    with pytest.raises(ValueError):
        scene_reward(x, ["a red circle", "a red circle"])
    with pytest.raises(ValueError):
        scene_reward(torch.zeros(1, 3, 32, 32), ["a red circle"])


def test_speed_at_least_200_images_per_second(clean) -> None:
    images, prompts, _ = clean
    x = torch.from_numpy(np.stack(images[:64]))
    scene_reward(x, prompts[:64])
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        scene_reward(x, prompts[:64])
        best = min(best, time.perf_counter() - start)
    assert 64 / best >= 200, f"{64 / best:.0f} images/s"


def _flood_fill_labels(cls: np.ndarray) -> np.ndarray:
    """Reference 8-connected labelling of equal non-negative values (slow, obvious)."""
    out = np.zeros(cls.shape, dtype=np.int64)
    h, w = cls.shape
    n = 0
    for y, x in itertools.product(range(h), range(w)):
        if cls[y, x] < 0 or out[y, x]:
            continue
        n += 1
        out[y, x] = n
        todo = deque([(y, x)])
        while todo:
            cy, cx = todo.popleft()
            for dy, dx in itertools.product((-1, 0, 1), repeat=2):
                ny, nx = cy + dy, cx + dx
                if 0 <= ny < h and 0 <= nx < w and not out[ny, nx] and cls[ny, nx] == cls[y, x]:
                    out[ny, nx] = n
                    todo.append((ny, nx))
    return out


@pytest.mark.parametrize("density", [0.2, 0.5, 0.8])
def test_label_components_matches_flood_fill(density: float) -> None:
    rng = _rng(int(density * 10))
    cls = np.where(rng.random((3, 24, 24)) < density, rng.integers(0, 3, (3, 24, 24)), -1)
    labels = label_components(cls)
    for b in range(3):
        ref = _flood_fill_labels(cls[b])
        pairs = set(zip(ref[ref > 0].tolist(), labels[b][ref > 0].tolist(), strict=True))
        assert len(pairs) == ref.max() == len({p[1] for p in pairs})
        assert ((labels[b] > 0) == (ref > 0)).all()
    assert not set(np.unique(labels[0])[1:]) & set(np.unique(labels[1])[1:])


def test_label_components_handles_long_snakes() -> None:
    cls = np.full((1, 64, 64), -1)
    for i in range(0, 64, 2):  # one serpentine 1-px path through the whole image
        cls[0, i, :] = 2
        if i + 1 < 64:
            cls[0, i + 1, 63 if i % 4 == 0 else 0] = 2
    labels = label_components(cls)
    assert len(np.unique(labels[labels > 0])) == 1


def test_ideal_pixel_count_matches_drawn_masks() -> None:
    rng = _rng(11)
    for shape in SHAPES:
        cx, cy = rng.uniform(-5, 69, 200), rng.uniform(-5, 69, 200)
        size = rng.uniform(3, 16, 200)
        counted = ideal_pixel_count(shape, cx, cy, size)
        drawn = [shape_mask(shape, a, b, r).sum() for a, b, r in zip(cx, cy, size, strict=True)]
        assert np.abs(counted - np.asarray(drawn)).max() <= 1  # float32 vs float64 edge ties
        assert np.mean(counted == np.asarray(drawn)) > 0.97
