"""The generated family of hidden tastes (trainer/bench/taste/family.py) and the statistics it is drawn
from (image_statistics.py): each statistic reads what its name says on pictures built by hand, every taste
is a deterministic score in [0, 1] that the function reward and the benchmark load by name, and the family
section of the results page reads its distribution right."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from dynamic_treerpo.trainer.bench.taste import family
from dynamic_treerpo.trainer.bench.taste import image_statistics as st
from dynamic_treerpo.trainer.bench.taste.family_page import distribution
from dynamic_treerpo.trainer.bench.taste.person import load_taste, taste_spec
from dynamic_treerpo.trainer.rewards.function import load_function


def canvas(n: int = 1) -> torch.Tensor:
    return torch.full((n, 3, 64, 64), 0.05)


def square(img: torch.Tensor, top: int, left: int, size: int, colour=(0.9, 0.1, 0.1)) -> torch.Tensor:
    for c, v in enumerate(colour):
        img[:, c, top:top + size, left:left + size] = v
    return img


def test_statistics_read_what_their_names_say() -> None:
    centred = square(canvas(), 24, 24, 16)
    off = square(canvas(), 4, 4, 16)
    assert float(st.mirror_symmetry(centred)) == pytest.approx(1.0)
    assert float(st.mirror_symmetry(off)) == pytest.approx(0.0)
    two = square(square(canvas(), 4, 4, 10), 40, 40, 10)
    assert float(st.object_count(two)) == pytest.approx(2 / 4)
    assert float(st.compactness(centred)) == pytest.approx(1.0)
    assert float(st.compactness(two)) < 0.2
    assert float(st.closeness_to(centred, 0.5, 0.5)) == pytest.approx(1.0, abs=0.02)
    assert float(st.closeness_to(off, 0.5, 0.5)) < 0.8
    blue = square(canvas(), 24, 24, 16, (0.1, 0.1, 0.9))
    red_hue, blue_hue = 0.0, 4 * math.pi / 3
    assert float(st.hue_closeness(centred, red_hue)) > 0.95 > float(st.hue_closeness(blue, red_hue))
    assert float(st.hue_closeness(blue, blue_hue)) > 0.95
    mixed = square(square(canvas(), 4, 4, 12), 40, 40, 12, (0.1, 0.9, 0.1))
    assert float(st.colour_variety(mixed)) > 0.4 > float(st.colour_variety(two))  # red and green: 0.5
    soft = torch.nn.functional.avg_pool2d(centred, 5, stride=1, padding=2)
    assert float(st.edge_sharpness(centred)) > float(st.edge_sharpness(soft))
    empty = canvas()
    for name, fn in st.STATISTICS.items():
        assert float(fn(empty)) == 0.0, name  # no ink: 0, as the named tastes do


def test_every_taste_of_the_family_is_a_deterministic_score_in_zero_one() -> None:
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(6, 3, 64, 64, generator=gen) * 0.3
    for i in range(6):
        square(images[i:i + 1], 5 + 7 * i, 3 + 5 * i, 8 + 2 * i, (0.2 + 0.1 * i, 0.8 - 0.1 * i, 0.4))
    assert len(family.FAMILY) >= 16
    kinds = {t.kind for t in family.FAMILY.values()}
    assert kinds == set(family.KINDS)
    scores = {}
    for name, taste in family.FAMILY.items():
        s = taste(images, ["two red circles"] * 6)
        assert s.shape == (6,) and bool(((s >= 0) & (s <= 1)).all()), name
        assert torch.equal(s, family.generate(int(name[-2:]))(images)), name  # drawn the same every time
        assert family.describe(name)
        scores[name] = tuple(round(v, 6) for v in s.tolist())
    assert len(set(scores.values())) == len(scores), "every taste scores the pictures differently"


def test_family_tastes_load_by_name_as_the_benchmark_and_the_function_reward_do() -> None:
    name, fn = load_taste("family_03")
    assert name == "family_03" and fn is family.FAMILY["family_03"]
    spec = taste_spec("family_03")
    assert spec == f"{family.MODULE}:family_03"
    assert load_function(spec) is family.FAMILY["family_03"]
    assert taste_spec("lower_objects").endswith("hidden_tastes:lower_objects")


def test_the_distribution_reads_median_tenth_percentile_and_worst() -> None:
    shares = [0.1 * k for k in range(1, 17)]
    d = distribution(shares)
    assert d["median"]["value"] == pytest.approx(0.85)
    assert d["10th percentile"]["value"] == pytest.approx(0.25)
    assert d["worst"]["value"] == pytest.approx(0.1)
    for row in d.values():
        assert row["low"] <= row["value"] <= row["high"]


def _published_section(key: str) -> tuple[str, Any, list[dict], dict]:
    """A marked section of docs/results-taste.md, its report command's arguments, and the stored runs and
    arms that command reads (paths from the repository root)."""
    import shlex
    from pathlib import Path

    from dynamic_treerpo.trainer import cli
    from dynamic_treerpo.trainer.bench.taste.commands import named_tastes, taste_arms
    from dynamic_treerpo.trainer.bench.taste.page import sections_of
    from dynamic_treerpo.trainer.bench.taste.storage import reload

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "results-taste.md").read_text(encoding="utf-8")
    (section,) = sections_of(page, key)
    (line,) = [x for x in section.splitlines() if x.startswith("treerpo bench taste ") and "--report" in x]
    args = cli.build_parser().parse_args(shlex.split(line)[1:])
    assert str(args.out).startswith("docs/data/") and args.section == key
    summaries = [reload(root / args.out / t) for t in named_tastes(args.tastes)]
    specs = [f"{name}={root / folder}" for name, _, folder in (a.partition("=") for a in args.arms)]
    return section, args, summaries, taste_arms(specs, named_tastes(args.tastes))


def test_the_family_section_is_rendered_from_the_stored_runs() -> None:
    """docs/results-taste.md's family section is what its report command renders from the runs stored in
    docs/data/ (no figure typed by hand), and a family not yet run whole gets no verdict on its targets."""
    from dynamic_treerpo.trainer.bench.taste.commands import taste_command
    from dynamic_treerpo.trainer.bench.taste.family_page import FAMILY_SECTION, family_markdown

    section, args, summaries, arms = _published_section(FAMILY_SECTION)
    assert family_markdown(summaries, taste_command(args), arms=arms) == section
    whole = len(summaries) == len(family.FAMILY)
    assert ("no verdict" in section) != whole


def test_the_template_section_is_rendered_from_the_stored_runs() -> None:
    """The template's section too: its row and its arm are what the report renders from docs/data/."""
    from dynamic_treerpo.trainer.bench.taste.commands import taste_command
    from dynamic_treerpo.trainer.bench.taste.family_page import TEMPLATE_SECTION, template_markdown

    section, args, summaries, arms = _published_section(TEMPLATE_SECTION)
    assert args.against is None
    assert template_markdown(summaries, taste_command(args), arms=arms) == section
