"""Fewer clicks (docs/picks.md): a single like is a whole answer, the quick linear reward, which tree to
show next (``preferences.active``), whether more picks help (``preferences.progress``), the panel's cached
guidance (``preferences.guidance``) and ``treerpo bench picking --quick``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynamic_treerpo.trainer.preferences import progress
from dynamic_treerpo.trainer.preferences.active import WARMUP, next_order, order_information
from dynamic_treerpo.trainer.preferences.guidance import Guides, TreeState, fields
from dynamic_treerpo.trainer.preferences.linear_reward import (
    Basis,
    fit_basis,
    fit_linear,
    linear_accuracy,
)
from dynamic_treerpo.trainer.preferences.pairs import Pair, tree_pairs
from dynamic_treerpo.trainer.preferences.records import Picks
from dynamic_treerpo.trainer.preferences.store import PickStore
from dynamic_treerpo.trainer.rewards.personal import fit_from_store, pooled_features
from tests.tiny_models import squares

TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Twelve stored trees of 8 leaves of the embedded model, none labelled."""
    from dynamic_treerpo.trainer.bench.taste.trees import first_plan
    from dynamic_treerpo.trainer.config.files import load_config
    from dynamic_treerpo.trainer.config.schema import TrainConfig
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
    from dynamic_treerpo.trainer.training.from_picks import model_id, store_trees

    root = tmp_path_factory.mktemp("picking")
    config = load_config(TrainConfig, None, ["tree.steps=6"])
    policy = EmbeddedPolicy.from_pretrained()
    prompts = ["a red circle", "two yellow circles", "a green square", "a blue square on the left"]
    store_trees(policy, PickStore(root, create=True), [prompts[i % 4] for i in range(12)], list(range(12)),
                first_plan(config, policy), model_id(policy, "embedded"))
    return root


def brightest(store: PickStore, tree_id: str) -> int:
    return int(store.load_images(tree_id).mean(dim=(1, 2, 3)).argmax())


def single_likes(folder: Path, root: Path, count: int) -> tuple[PickStore, list[str]]:
    """A copy of ``folder`` whose first ``count`` trees carry one like each (the brightest leaf)."""
    import shutil

    shutil.copytree(folder, root)
    store = PickStore(root)
    ids = store.tree_ids()
    for tree_id in ids[:count]:
        saved = store.save_picks(tree_id, [brightest(store, tree_id)])
        assert saved.disliked == () and len(saved.liked) == 1
    return store, ids


def test_a_single_like_is_a_whole_answer(folder: Path, tmp_path: Path) -> None:
    """One liked leaf, nothing else marked: saved, 7 pairs (liked > each unmarked leaf), fit to train on."""
    store, ids = single_likes(folder, tmp_path / "single", 6)
    picks = store.picks(ids[0])
    pairs = tree_pairs(picks, store.meta(ids[0]).leaves)
    assert store.meta(ids[0]).leaves == 8 and len(pairs) == 7
    assert {p.better for p in pairs} == {picks.liked[0]} and picks.liked[0] not in {p.worse for p in pairs}
    assert store.check() == ids[:6]
    fit = fit_from_store(store, pooled_features)
    assert fit.trees == 6 and fit.pairs == 6 * 7 and fit.held_out_pairs == 7
    with pytest.raises(ValueError, match="no leaf is marked"):
        store.save_picks(ids[7], [])


# ------------------------------------------------------------------------------ the quick linear reward


def square_trees(count: int, seed: int = 0, likes: int = 2, dislikes: int = 1
                 ) -> tuple[dict[str, torch.Tensor], dict[str, list[Pair]], dict[str, torch.Tensor]]:
    """Trees of 8 squares, features, and the picks of a person who likes larger squares (no mistakes)."""
    generator = torch.Generator().manual_seed(seed)
    feats, picks, sizes = {}, {}, {}
    for k in range(count):
        images, size = squares(8, generator, side=32, sizes=(3, 16))
        order = size.argsort(descending=True).tolist()
        tree = f"t{k:03d}"
        feats[tree], sizes[tree] = pooled_features(images), size
        disliked = tuple(order[8 - dislikes:] if dislikes else ())
        picks[tree] = tree_pairs(Picks(tuple(order[:likes]), disliked), 8)
    return feats, picks, sizes


def test_the_linear_reward_learns_a_taste_and_knows_how_sure_it_is() -> None:
    feats, picks, sizes = square_trees(60)
    ids = sorted(feats)
    basis = fit_basis([feats[t] for t in ids])
    x = {t: basis(feats[t]) for t in ids}
    fit, held = ids[:40], ids[40:]
    model = fit_linear({t: x[t] for t in fit}, {t: picks[t] for t in fit})
    truth = {t: [Pair(i, j) for i in range(8) for j in range(8) if sizes[t][i] > sizes[t][j]] for t in held}
    assert linear_accuracy(model, {t: x[t] for t in held}, truth) >= 0.85
    reversed_ = {t: [Pair(p.worse, p.better) for p in truth[t]] for t in held}
    assert linear_accuracy(model, {t: x[t] for t in held}, reversed_) <= 0.15
    fewer = fit_linear({t: x[t] for t in fit[:5]}, {t: picks[t] for t in fit[:5]})
    assert torch.trace(model.covariance) < torch.trace(fewer.covariance)  # more picks, surer
    again = fit_linear({t: x[t] for t in fit}, {t: picks[t] for t in fit})
    assert torch.equal(again.weights, model.weights)


# ------------------------------------------------------------------------------ which tree next


def test_order_information_is_the_doubt_about_a_pair() -> None:
    none = order_information(torch.tensor([0.0, 5.0]), torch.tensor([0.0, 0.0]))
    assert none.abs().max() < 1e-9  # a settled margin (or none at all) teaches nothing
    open_ = float(order_information(torch.tensor([0.0]), torch.tensor([1e6]))[0])
    assert open_ == pytest.approx(math.log(2), abs=0.05)  # wholly open: one bit
    assert float(order_information(torch.tensor([3.0]), torch.tensor([1.0]))[0]) < open_


def test_next_order_shows_what_the_picks_leave_open_first() -> None:
    """Picks that order leaves along feature 0: a tree varying along feature 1 (never picked on) comes
    first, one along feature 0 next, one of identical leaves last; before WARMUP trees, oldest first."""
    basis = Basis(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64),
                  torch.eye(3, dtype=torch.float64))
    generator = torch.Generator().manual_seed(0)
    features, picks = {}, {}
    for k in range(8):
        leaves = torch.zeros(8, 3)
        leaves[:, 0] = torch.randn(8, generator=generator)
        order = leaves[:, 0].argsort(descending=True).tolist()
        features[f"a{k}"], picks[f"a{k}"] = leaves, tree_pairs(Picks(tuple(order[:2]), (order[-1],)), 8)
    along_0, along_1, same = torch.zeros(8, 3), torch.zeros(8, 3), torch.ones(8, 3)
    along_0[:, 0] = torch.linspace(-1, 1, 8)
    along_1[:, 1] = torch.linspace(-1, 1, 8)
    features.update(b_same=same, c_along_0=along_0, d_along_1=along_1)
    ids = sorted(features)
    assert next_order(ids, picks, features, basis=basis) == ["d_along_1", "c_along_0", "b_same"]
    assert next_order(ids, picks, features, "oldest") == ["b_same", "c_along_0", "d_along_1"]
    few = {t: picks[t] for t in sorted(picks)[: WARMUP - 1]}
    assert next_order(ids, few, features, basis=basis)[:3] == [t for t in ids if t not in few][:3]
    with pytest.raises(ValueError, match="unknown order 'random'"):
        next_order(ids, picks, features, "random")


# ------------------------------------------------------------------------------ whether more picks help


def test_advice_says_when_more_picks_help() -> None:
    few = progress.advise(3, None)
    assert few.more_helps is None and few.text == "label 5 more trees to see how well your picks agree"
    assert progress.advise(7, None).text.startswith("label 1 more tree to")
    sizes = (10.0, 13.0, 16.0, 20.0)
    rising = progress.Curve(30, sizes, tuple(0.7 + 0.1 * math.log(s / 10) for s in sizes))
    assert rising.gain == pytest.approx(0.1 * math.log(1.5))
    flat = progress.Curve(30, sizes, (0.80, 0.81, 0.80, 0.81))
    assert abs(flat.gain) < progress.FLAT
    said = progress.advise(30, rising)
    assert said.more_helps is True and said.text == ("your picks agree with each other on 77% of held-out "
                                                     "pairs; still rising: more picks help")
    said = progress.advise(30, flat)
    assert said.more_helps is False and said.text.endswith("it has stopped rising: you can train now")
    assert progress.advise(progress.STOP_FROM - 1, flat).more_helps is True  # too few trees to call it flat
    chance = progress.Curve(30, sizes, (0.52, 0.53, 0.52, 0.52))
    assert "pick for one clear thing at a time" in progress.advise(30, chance).text


def test_the_learning_curve_reads_how_well_picks_agree() -> None:
    feats, picks, _ = square_trees(40)
    ids = sorted(feats)
    curve = progress.learning_curve(ids, picks, feats)
    assert curve.trees == 40 and curve.accuracy > 0.85 and curve.sizes[0] < curve.sizes[-1] == 32
    assert progress.learning_curve(ids, picks, feats) == curve  # the same state, the same answer
    generator = torch.Generator().manual_seed(1)
    noise = {t: tree_pairs(Picks((int(torch.randint(0, 8, (1,), generator=generator)),)), 8) for t in ids}
    assert progress.learning_curve(ids, noise, feats).accuracy < 0.65  # picks that agree on nothing
    advice = progress.folder_advice(ids, picks, feats)
    assert advice.more_helps is not None and advice.trees == 40 and "agree with each other" in advice.text


# ------------------------------------------------------------------------------ the panel's guidance


def state_of(store: PickStore) -> tuple[TreeState, ...]:
    out = []
    for tree_id in store.tree_ids():
        picks = store.picks(tree_id)
        out.append(TreeState(tree_id, store.meta(tree_id).leaves, picks.liked if picks else None,
                             picks.disliked if picks else ()))
    return tuple(out)


def test_guidance_is_computed_once_per_folder_state(folder: Path, tmp_path: Path) -> None:
    root = tmp_path / "guided"
    store, ids = single_likes(folder, root, 9)
    guides = Guides(pooled_features)
    state = state_of(store)
    first = guides.request(root, state).result(timeout=120)
    guide = guides.guide(root)
    assert guide.computed == 1 and guides.latest(root) is first
    assert set(first.active_order) == set(ids[9:]) and first.advice.trees == 9
    assert "agree with each other" in first.advice.text and first.advice.more_helps is True
    again = guides.request(root, state_of(store))  # a poll, nothing changed: no fit
    assert again.done() and again.result() is first and guide.computed == 1
    # the same order as the pure function of the folder state
    pairs = {t: tree_pairs(store.picks(t), 8) for t in ids[:9]}
    feats = {t: pooled_features(store.load_images(t)).double() for t in ids}
    assert list(first.active_order) == next_order(ids, pairs, feats, "active")
    # a save changes the state: computed again; until then the last answer, brought up to date
    store.save_picks(ids[9], [0], [1])
    newer = state_of(store)
    stale = fields(newer, first, "active")
    assert stale["next_order"] == [t for t in first.active_order if t != ids[9]]
    assert stale["advice"] == {"text": first.advice.text, "more_helps": True, "trees": 9}
    assert fields(newer, first, "oldest")["next_order"] == ids[10:]
    fresh = guides.request(root, newer).result(timeout=120)
    assert guide.computed == 2 and fresh.advice.trees == 10 and set(fresh.active_order) == set(ids[10:])
    assert fields(newer, None, "active")["advice"]["more_helps"] is None  # nothing computed yet
    with pytest.raises(ValueError, match="unknown order"):
        fields(newer, fresh, "newest")


def test_guidance_without_enough_picks_reads_no_leaf(tmp_path: Path) -> None:
    """Below WARMUP labelled trees, nothing is fitted and no image is read (the folder need not exist)."""
    guides = Guides(lambda images: pytest.fail("features read too early"))
    state = (TreeState("20260101T000000000000Z_00000001", 8, (2,)),
             TreeState("20260101T000000000000Z_00000002", 8, None))
    guidance = guides.request(tmp_path / "nowhere", state).result(timeout=30)
    assert guidance.active_order == ("20260101T000000000000Z_00000002",)
    assert guidance.advice.more_helps is None and guidance.advice.text.startswith("label 7 more trees")


# ------------------------------------------------------------------------------ the benchmark


def test_bench_picking_quick_prints_the_comparison(tmp_path: Path) -> None:
    out = subprocess.run([*TREERPO, "bench", "picking", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "picking.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["command"] == "treerpo bench picking --quick"
    rows = {(r["likes"], r["dislikes"], r["trees"]): r for r in summary["rows"]}
    assert set(rows) == {(2, 1, 6), (2, 1, 10), (1, 0, 6), (1, 0, 10)}
    for row in rows.values():
        for key in ("oldest", "active", "linear_oldest"):
            assert all(0.0 <= v <= 1.0 for v in row[key]["per_seed"]) and len(row[key]["per_seed"]) == 2
        pairs = zip(row["active"]["per_seed"], row["oldest"]["per_seed"], strict=True)
        difference = [a - o for a, o in pairs]
        assert row["active_minus_oldest"]["mean"] == pytest.approx(sum(difference) / 2)
    assert len(summary["per_run"]) == 4 and all(r["advice_by_trees"] for r in summary["per_run"])
    assert "active - oldest" in out.stdout and "stopped rising" in out.stdout
    assert "larger_objects  1+/0-" in out.stdout
