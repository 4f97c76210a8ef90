"""The embedded default's pretraining captions carry the documented error mechanisms at their rates."""

from __future__ import annotations

import numpy as np
import pytest

from dynamic_treerpo.trainer.embedded.captions import (
    EXACT,
    CaptionNoise,
    binding_applies,
    corrupt,
    noisy_batch,
    region_applies,
)
from dynamic_treerpo.trainer.embedded.scenes import SceneSpec, parse_prompt, sample_spec, spec_to_prompt

N = 6000


def _pairs(noise: CaptionNoise, seed: int = 0) -> list[tuple[SceneSpec, SceneSpec]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(N):
        spec = sample_spec(rng)
        out.append((spec, corrupt(spec, rng, noise)))
    return out


def _rate(pairs, applies, differs) -> tuple[float, int]:
    hits = [differs(t, c) for t, c in pairs if applies(t)]
    return float(np.mean(hits)), len(hits)


def _count_differs(true: SceneSpec, cap: SceneSpec) -> bool:
    return true.groups[0].count != cap.groups[0].count


def _colours_differ(true: SceneSpec, cap: SceneSpec) -> bool:
    return [g.colour for g in true.groups] != [g.colour for g in cap.groups]


def _regions_differ(true: SceneSpec, cap: SceneSpec) -> bool:
    return [g.region for g in true.groups] != [g.region for g in cap.groups]


@pytest.mark.parametrize("noise", [CaptionNoise(), CaptionNoise(0.3, 0.2, 0.7)])
def test_each_mechanism_corrupts_at_its_documented_rate(noise: CaptionNoise) -> None:
    pairs = _pairs(noise)
    # 95% binomial interval at n >= 1,500 is about +-0.025
    for rate, applies, differs in ((noise.count, lambda s: True, _count_differs),
                                   (noise.binding, binding_applies, _colours_differ),
                                   (noise.region, region_applies, _regions_differ)):
        measured, n = _rate(pairs, applies, differs)
        assert n > 1500
        assert abs(measured - rate) < 0.03, (rate, measured, n)


def test_at_the_default_rates_a_corrupted_word_says_nothing_about_the_image() -> None:
    """P(image count = 2 | caption says "two") equals P(image count = 2 | caption says "a")."""
    pairs = [(t, c) for t, c in _pairs(CaptionNoise(), seed=1) if len(t.groups) == 1]
    says_two = [t.groups[0].count == 2 for t, c in pairs if c.groups[0].count == 2]
    says_a = [t.groups[0].count == 2 for t, c in pairs if c.groups[0].count == 1]
    assert abs(np.mean(says_two) - np.mean(says_a)) < 0.06
    left = [(t, c) for t, c in _pairs(CaptionNoise(), seed=2) if region_applies(t)]
    shown = [t.groups[0].region == c.groups[0].region for t, c in left]
    assert abs(np.mean(shown) - 0.5) < 0.04


def test_mechanisms_change_only_their_own_attribute() -> None:
    for true, cap in _pairs(CaptionNoise(1.0, 1.0, 1.0))[:500]:
        assert [g.shape for g in true.groups] == [g.shape for g in cap.groups]
        assert sorted(g.colour for g in true.groups) == sorted(g.colour for g in cap.groups)
        assert all(t.count != c.count for t, c in zip(true.groups, cap.groups, strict=True))
        assert sorted(map(str, (g.region for g in true.groups))) == sorted(
            map(str, (g.region for g in cap.groups)))
        if region_applies(true):
            assert _regions_differ(true, cap)


def test_a_binding_error_always_describes_another_scene() -> None:
    """Swapping the colours of "a red circle and a blue circle" would read the same: not counted."""
    same = parse_prompt("a red circle and a blue circle")
    assert not binding_applies(same)
    assert binding_applies(parse_prompt("a red circle and a blue square"))
    assert binding_applies(parse_prompt("a red circle and two blue circles"))
    for true, cap in _pairs(CaptionNoise(0.0, 1.0, 0.0))[:1000]:
        assert (frozenset(true.groups) != frozenset(cap.groups)) == binding_applies(true)


def test_exact_captions_and_determinism() -> None:
    for true, cap in _pairs(EXACT)[:500]:
        assert cap == true
    a = noisy_batch(16, np.random.default_rng(3), CaptionNoise())
    b = noisy_batch(16, np.random.default_rng(3), CaptionNoise())
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
    assert a[1] != [spec_to_prompt(s) for s in a[2]]  # some of 16 captions are corrupted


def test_rates_outside_zero_one_are_refused() -> None:
    with pytest.raises(ValueError, match=r"count=1\.5 is not a probability"):
        CaptionNoise(count=1.5)
