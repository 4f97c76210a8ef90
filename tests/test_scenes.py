"""Procedural scene generator: determinism, prompt grammar, layout and rendering."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamic_treerpo.trainer.embedded.scenes import (
    BACKGROUND,
    COLOURS,
    IMAGE_SIZE,
    REGIONS,
    SHAPES,
    VOCABULARY,
    ObjectSpec,
    Placed,
    SceneSpec,
    inside_shape,
    layout,
    parse_prompt,
    render,
    row_half_width,
    sample_batch,
    sample_spec,
    shape_mask,
    spec_to_prompt,
    validate_spec,
)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_palette_is_separable() -> None:
    """Nearest-colour segmentation needs well separated colours, far from the background."""
    cols = np.asarray(list(COLOURS.values()))
    assert 4 <= len(cols) <= 6 and cols.min() >= 0 and cols.max() <= 1
    for a, b in itertools.combinations(cols, 2):
        assert np.linalg.norm(a - b) >= 0.6
    assert np.linalg.norm(cols - np.asarray(BACKGROUND), axis=1).min() >= 0.6


def test_sample_batch_is_deterministic() -> None:
    a_img, a_txt = sample_batch(32, _rng(7))
    b_img, b_txt = sample_batch(32, _rng(7))
    c_img, c_txt = sample_batch(32, _rng(8))
    assert a_txt == b_txt and np.array_equal(a_img, b_img)
    assert a_txt != c_txt or not np.array_equal(a_img, c_img)


def test_sample_batch_shapes_and_range() -> None:
    images, prompts = sample_batch(16, _rng(1))
    assert images.shape == (16, 3, IMAGE_SIZE, IMAGE_SIZE) and images.dtype == np.float32
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert len(prompts) == 16 and all(isinstance(p, str) for p in prompts)


def test_generation_is_fast() -> None:
    """The brief asks ~1000 scenes/s on one core; assert a lenient floor against CI noise."""
    rng = _rng(2)
    sample_batch(10, rng)
    start = time.perf_counter()
    sample_batch(500, rng)
    rate = 500 / (time.perf_counter() - start)
    assert rate >= 300, f"{rate:.0f} scenes/s"


def test_prompt_round_trip_500_samples() -> None:
    rng = _rng(3)
    for _ in range(500):
        spec = sample_spec(rng)
        assert parse_prompt(spec_to_prompt(spec)) == spec
        assert 1 <= spec.n_objects <= 3


_group = st.builds(
    ObjectSpec,
    shape=st.sampled_from(SHAPES),
    colour=st.sampled_from(tuple(COLOURS)),
    count=st.sampled_from((1, 2)),
    region=st.sampled_from((None, *REGIONS)),
)


def _valid(spec: SceneSpec) -> bool:
    try:
        validate_spec(spec)
    except ValueError:
        return False
    return True


@settings(max_examples=100, deadline=None)
@given(st.lists(_group, min_size=1, max_size=3).map(lambda g: SceneSpec(tuple(g))).filter(_valid))
def test_prompt_round_trip_any_valid_spec(spec: SceneSpec) -> None:
    assert parse_prompt(spec_to_prompt(spec)) == spec


def test_every_prompt_word_is_covered() -> None:
    rng = _rng(4)
    seen: set[str] = set()
    for _ in range(2000):
        words = spec_to_prompt(sample_spec(rng)).replace(",", " ").split()
        assert set(words) <= VOCABULARY
        seen.update(words)
    assert seen == VOCABULARY


def test_sampled_specs_cover_structures() -> None:
    rng = _rng(5)
    specs = [sample_spec(rng) for _ in range(1000)]
    assert {s.n_objects for s in specs} == {1, 2, 3}
    assert {len(s.groups) for s in specs} == {1, 2, 3}
    regions = {g.region for s in specs for g in s.groups}
    assert regions == {None, *REGIONS}
    for s in specs:  # regions only for two-group scenes, and then on both groups, opposite
        rs = [g.region for g in s.groups]
        if any(rs):
            assert len(rs) == 2 and all(rs) and rs[0] != rs[1]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a red circle", (ObjectSpec("circle", "red", 1),)),
        ("two blue squares", (ObjectSpec("square", "blue", 2),)),
        (
            "a green triangle on the left and a yellow circle on the right",
            (
                ObjectSpec("triangle", "green", 1, "on the left"),
                ObjectSpec("circle", "yellow", 1, "on the right"),
            ),
        ),
        (
            "two red circles and a blue square",
            (ObjectSpec("circle", "red", 2), ObjectSpec("square", "blue", 1)),
        ),
        (
            "a red circle, a purple square and a red triangle",
            (
                ObjectSpec("circle", "red", 1),
                ObjectSpec("square", "purple", 1),
                ObjectSpec("triangle", "red", 1),
            ),
        ),
        ("  A Red Circle. ", (ObjectSpec("circle", "red", 1),)),
    ],
)
def test_parse_prompt_examples(prompt: str, expected: tuple[ObjectSpec, ...]) -> None:
    assert parse_prompt(prompt) == SceneSpec(expected)


@pytest.mark.parametrize(
    ("prompt", "word"),
    [
        ("a red hexagon", "hexagon"),
        ("a crimson circle", "crimson"),
        ("three red circles", "three"),
        ("a red circle or a blue square", "or"),
        ("a red circle in the middle", "in"),
        ("a red circles", "circles"),
        ("two red circle", "circle"),
        ("a red red circle", "red"),
        ("a red circle on the left and a blue square on the up", "up"),
    ],
)
def test_parse_prompt_names_bad_word(prompt: str, word: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_prompt(prompt)
    msg = str(err.value)
    assert "\n" not in msg and repr(word) in msg


@pytest.mark.parametrize(
    "prompt",
    [
        "",
        "a red",
        "a red circle and",
        "a red circle and a red circle",
        "two red circles and two blue squares",
        "a red circle on the left and a blue square on the left",
    ],
)
def test_parse_prompt_rejects_malformed(prompt: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_prompt(prompt)
    assert "\n" not in str(err.value)


def _in_region(mask: np.ndarray, region: str) -> bool:
    half = IMAGE_SIZE // 2
    return {
        "on the left": not mask[:, half:].any(),
        "on the right": not mask[:, :half].any(),
        "at the top": not mask[half:, :].any(),
        "at the bottom": not mask[:half, :].any(),
    }[region]


def test_layout_respects_regions_counts_and_spacing() -> None:
    rng = _rng(6)
    for _ in range(300):
        spec = sample_spec(rng)
        placed = layout(spec, rng)
        wanted = [(g.shape, g.colour, g.region) for g in spec.groups for _ in range(g.count)]
        assert [(p.shape, p.colour) for p in placed] == [w[:2] for w in wanted]
        masks = [shape_mask(p.shape, p.cx, p.cy, p.size) for p in placed]
        for p, m, (_, _, region) in zip(placed, masks, wanted, strict=True):
            assert 7.0 <= p.size <= 12.0
            assert p.size + 0.5 <= p.cx <= IMAGE_SIZE - p.size - 0.5  # fully inside the image
            assert p.size + 0.5 <= p.cy <= IMAGE_SIZE - p.size - 0.5
            assert m.sum() > 50
            if region is not None:
                assert _in_region(m, region)
        for a, b in itertools.combinations(placed, 2):  # boxes >= 2 px apart: separate blobs
            gap = max(abs(a.cx - b.cx), abs(a.cy - b.cy)) - a.size - b.size
            assert gap >= 2.0


def test_layout_is_deterministic_and_jittered() -> None:
    spec = parse_prompt("two red circles and a blue square")
    assert layout(spec, _rng(9)) == layout(spec, _rng(9))
    assert layout(spec, _rng(9)) != layout(spec, _rng(10))


def test_render_draws_exact_ideal_masks() -> None:
    placed = [
        Placed("circle", "red", 16.3, 20.7, 9.2),
        Placed("triangle", "blue", 45.0, 44.1, 10.4),
    ]
    img = render(placed)
    assert img.shape == (3, IMAGE_SIZE, IMAGE_SIZE) and img.dtype == np.float32
    union = np.zeros((IMAGE_SIZE, IMAGE_SIZE), dtype=bool)
    for p in placed:
        m = shape_mask(p.shape, p.cx, p.cy, p.size)
        assert np.allclose(img[:, m], np.asarray(COLOURS[p.colour])[:, None])
        union |= m
    assert np.allclose(img[:, ~union], np.asarray(BACKGROUND)[:, None])


def test_shapes_are_distinguishable_and_box_bounded() -> None:
    masks = {s: shape_mask(s, 32.0, 32.0, 10.0) for s in SHAPES}
    for a, b in itertools.combinations(SHAPES, 2):
        iou = (masks[a] & masks[b]).sum() / (masks[a] | masks[b]).sum()
        assert iou < 0.8, (a, b, iou)
    for m in masks.values():  # everything inside the size box [cx - r, cx + r]^2
        ys, xs = np.nonzero(m)
        assert xs.min() >= 22 and xs.max() <= 41 and ys.min() >= 22 and ys.max() <= 41
    tri = masks["triangle"]
    assert tri[23].sum() < tri[40].sum()  # apex up, base down


def test_row_half_width_agrees_with_inside_shape() -> None:
    rng = _rng(11)
    dy = rng.uniform(-14, 14, 2000)
    dx = rng.uniform(-14, 14, 2000)
    size = rng.uniform(4, 12, 2000)
    for s in SHAPES:
        by_rows = np.abs(dx) <= row_half_width(s, dy, size)
        assert np.array_equal(by_rows, inside_shape(s, dx, dy, size))


def test_unknown_shape_is_an_error() -> None:
    with pytest.raises(ValueError):
        shape_mask("hexagon", 10, 10, 5)
