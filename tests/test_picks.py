"""A person's picks as training data (docs/picks.md): the folder, the personal reward, both modes,
the ``treerpo train`` door and ``treerpo bench taste --quick``."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
from dynamic_treerpo.trainer.preferences.pairs import tree_pairs
from dynamic_treerpo.trainer.preferences.records import ModelId, Picks, PicksFormatError, TreeMeta
from dynamic_treerpo.trainer.preferences.store import PickStore
from dynamic_treerpo.trainer.rewards.personal import PersonalReward, fit_from_store, pooled_features
from dynamic_treerpo.trainer.training.factory import make_trainer
from dynamic_treerpo.trainer.training.from_picks import PicksTrainer, model_id, store_trees
from dynamic_treerpo.trainer.training.loop import Trainer
from tests.tiny_models import squares

TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]
SMALL = ["data.prompts_per_iteration=2", "data.eval_pairs=2", "sampling.eval_steps=3", "tree.steps=5",
         "tree.depth=2", "tree.trees_per_prompt=1", "lora.rank=4", "picks.trees_per_iteration=2"]
PROMPTS = ["a red circle", "a blue square on the left and a green triangle on the right",
           "two yellow circles", "a green square"]


def _small(*extra: str) -> TrainConfig:
    return load_config(TrainConfig, None, [*SMALL, *extra])


def trainer_tree(trainer: Trainer, prompt: str, seed: int):
    from dynamic_treerpo.trainer.core.tree import rollout

    p = trainer.policy
    return rollout(p.velocity, p.encode([prompt]), trainer.plan(0), [seed], p.latent_shape)


@pytest.fixture(scope="module")
def labelled_folder(tmp_path_factory) -> tuple[Path, Trainer]:
    """Eight stored trees of the embedded model; a person who likes bright leaves labels them."""
    folder = tmp_path_factory.mktemp("picks")
    trainer = Trainer(_small(), EmbeddedPolicy.from_pretrained(), evaluation=False)
    store = PickStore(folder, create=True)
    ids = store_trees(trainer.policy, store, [PROMPTS[i % 4] for i in range(8)], list(range(8)),
                      trainer.plan(0), model_id(trainer.policy, "embedded"))
    for tree_id in ids:
        brightness = store.load_images(tree_id).mean(dim=(1, 2, 3))
        order = brightness.argsort(descending=True).tolist()
        store.save_picks(tree_id, liked=order[:2], disliked=order[-1:])
    return folder, trainer


def test_a_stored_tree_reads_back_whole(labelled_folder) -> None:
    folder, trainer = labelled_folder
    store = PickStore(folder)
    tree_id = store.tree_ids()[0]
    meta = store.meta(tree_id)
    assert meta.prompt == PROMPTS[0] and meta.leaves == 4 and meta.model.kind == "embedded"
    assert meta.image_size == (64, 64) and meta.version == 1
    tree = store.load_tree(tree_id)
    again = trainer_tree(trainer, PROMPTS[0], 0)
    assert torch.equal(tree.leaf_latents, again.leaf_latents.cpu())  # the same rollout, stored exactly
    images = store.load_images(tree_id)
    assert images.shape == (4, 3, 64, 64)
    decoded = trainer.policy.decode(again.leaf_latents).float().cpu().clamp(0, 1)
    assert (images - decoded).abs().max() <= 1 / 255 + 1e-6  # the PNGs are the leaves, in 8 bits
    assert store.check(model_id(trainer.policy)) == store.tree_ids()


def test_picks_are_appended_and_the_newest_counts(labelled_folder, tmp_path: Path) -> None:
    folder, _ = labelled_folder
    store = PickStore(folder)
    tree_id = store.tree_ids()[1]
    before = len(list((folder / "trees" / tree_id / "picks").glob("*.json")))
    store.save_picks(tree_id, liked=[3], disliked=[0])
    assert len(list((folder / "trees" / tree_id / "picks").glob("*.json"))) == before + 1
    assert store.picks(tree_id).liked == (3,) and store.picks(tree_id).disliked == (0,)
    assert Picks((3,), (0,)).values(4) == [-1.0, 0.0, 0.0, 1.0]
    assert {(p.better, p.worse) for p in tree_pairs(store.picks(tree_id), 4)} == \
        {(3, 0), (3, 1), (3, 2), (1, 0), (2, 0)}


@pytest.mark.parametrize(("liked", "disliked", "message"), [
    ([], [], "no leaf is marked"),
    ([0, 1, 2, 3], [], "every leaf has the same mark"),
    ([0], [0], "both liked and disliked"),
    ([7], [], "leaf 7 does not exist"),
])
def test_picks_that_say_nothing_are_refused(labelled_folder, liked, disliked, message) -> None:
    folder, _ = labelled_folder
    store = PickStore(folder)
    with pytest.raises(ValueError, match=message):
        store.save_picks(store.tree_ids()[0], liked, disliked)


def _copy_tree(src: Path, dst: Path, tree_id: str, **changes) -> None:
    """A copy of one stored tree into ``dst`` with its tree.json fields changed."""
    import shutil

    target = dst / "trees" / tree_id
    shutil.copytree(src / "trees" / tree_id, target)
    meta = json.loads((target / "tree.json").read_text())
    for key, value in changes.items():
        if key == "fingerprint":
            meta["model"]["fingerprint"] = value
        else:
            meta[key] = value
    (target / "tree.json").write_text(json.dumps(meta))


def test_a_folder_unfit_to_train_on_is_refused_in_one_line(labelled_folder, tmp_path: Path) -> None:
    folder, trainer = labelled_folder
    ids = PickStore(folder).tree_ids()
    empty = PickStore(tmp_path / "empty", create=True)
    with pytest.raises(ValueError, match="holds no tree yet"):
        empty.check()
    with pytest.raises(FileNotFoundError, match="not a picks folder"):
        PickStore(tmp_path / "missing")
    unlabelled = tmp_path / "unlabelled"
    _copy_tree(folder, unlabelled, ids[0])
    for picks in (unlabelled / "trees" / ids[0] / "picks").glob("*.json"):
        picks.unlink()
    with pytest.raises(ValueError, match="none is labelled yet"):
        PickStore(unlabelled).check()
    mixed = tmp_path / "mixed"
    _copy_tree(folder, mixed, ids[0])
    _copy_tree(folder, mixed, ids[1], image_size=[128, 128])
    with pytest.raises(ValueError, match="mixes image sizes"):
        PickStore(mixed).check()
    other = tmp_path / "other"
    _copy_tree(folder, other, ids[0], fingerprint="0123456789abcdef")
    with pytest.raises(ValueError, match="made with another model"):
        PickStore(other).check(model_id(trainer.policy))
    future = tmp_path / "future"
    _copy_tree(folder, future, ids[0], version=2)
    with pytest.raises(PicksFormatError, match="version"):
        PickStore(future).meta(ids[0])
    # a tree written half (a crash mid-save) is invisible, never read as a record
    (folder / "trees" / ".20260101T000000000000Z_dead.partial").mkdir()
    assert ".20260101T000000000000Z_dead.partial" not in PickStore(folder).tree_ids()


def test_the_model_id_ignores_the_lora_it_trains() -> None:
    policy = EmbeddedPolicy.from_pretrained()
    a = model_id(policy)
    trainer = Trainer(_small(), policy.fresh_copy(), evaluation=False)
    b = model_id(trainer.policy)
    assert a.same_base(b) and b.lora is not None
    meta = TreeMeta("p", 0, a, 4, (64, 64), (4, 16, 16), {})
    assert TreeMeta.from_json(meta.to_json(), "x") == meta
    assert not a.same_base(ModelId("embedded", "x", "f" * 16))


def test_the_personal_reward_learns_a_taste_from_pairs() -> None:
    """A person who likes larger squares (liked 2, disliked 1 of 8): the head fitted on 40 trees' pairs
    orders the pairs of 20 unseen trees as the person would."""
    from dynamic_treerpo.trainer.rewards.personal import fit_head, pair_accuracy

    generator = torch.Generator().manual_seed(0)
    features, pairs = {}, {}
    for tree in range(60):
        images, sizes = squares(8, generator)
        order = sizes.argsort(descending=True).tolist()
        features[str(tree)] = pooled_features(images)
        pairs[str(tree)] = tree_pairs(Picks(tuple(order[:2]), tuple(order[-1:])), 8)
    fit = {k: v for k, v in features.items() if int(k) < 40}
    head = fit_head(fit, {k: pairs[k] for k in fit})
    held = {k: v for k, v in features.items() if int(k) >= 40}
    assert pair_accuracy(head, held, {k: pairs[k] for k in held}) >= 0.85
    shuffled = {k: tree_pairs(Picks((int(k) % 8,), ()), 8) for k in held}  # a taste it never saw
    assert pair_accuracy(head, held, shuffled) < 0.75


def test_the_personal_reward_of_a_folder(labelled_folder) -> None:
    folder, _ = labelled_folder
    fit = fit_from_store(PickStore(folder), pooled_features)
    assert fit.trees == 8 and fit.pairs == 8 * 5 and fit.held_out_trees == 2 and fit.held_out_pairs == 10
    assert 0.0 <= fit.held_out_accuracy <= 1.0
    reward = PersonalReward(fit, pooled_features)
    scores = reward(PickStore(folder).load_images(PickStore(folder).tree_ids()[0]), ["a red circle"] * 4)
    assert scores["reward"].shape == (4,) and torch.isfinite(scores["reward"]).all()
    every = torch.cat([reward(PickStore(folder).load_images(t), ["p"] * 4)["reward"]
                       for t in PickStore(folder).tree_ids()])
    assert abs(float(every.mean())) < 1e-4 and abs(float(every.std()) - 1) < 1e-4  # standardised there


def test_reward_mode_trains_on_fresh_rollouts(labelled_folder) -> None:
    folder, _ = labelled_folder
    config = _small(f"data.picks={folder}", "reward=picks:0.5,scene:0.5")
    trainer = make_trainer(config)
    assert type(trainer) is Trainer and set(trainer.reward.fns) == {"picks", "scene"}
    batch = trainer.rollout_and_score(0)
    assert {"reward_picks", "reward_scene"} <= set(batch.scores)
    assert trainer.reward.fns["picks"].fit.trees == 8
    row = trainer.step(0)
    assert torch.isfinite(torch.tensor([row["reward_mean"], row["loss"]])).all()


def test_online_mode_trains_the_picked_trees(labelled_folder) -> None:
    folder, _ = labelled_folder
    config = _small(f"data.picks={folder}", "reward=picks:0.5,scene:0.5", "picks.mode=online")
    trainer = make_trainer(config)
    assert isinstance(trainer, PicksTrainer)
    weights = {k: v.clone() for k, v in trainer.policy.transformer.named_parameters() if v.requires_grad}
    first, second = trainer.trees_of(0), trainer.trees_of(1)
    assert len(first) == 2 and not set(first) & set(second)  # slices of a shuffled pass
    batch = trainer.rollout_and_score(0)
    store = PickStore(folder)
    assert batch.scores["reward_picks"].tolist() == [v for t in first for v in store.picks(t).values(4)]
    assert batch.tree.leaf_node.numel() == 8 and batch.prompts == [store.meta(t).prompt for t in first]
    trainer.step(0)
    moved = [k for k, v in trainer.policy.transformer.named_parameters() if v.requires_grad
             and not torch.equal(v, weights[k])]
    assert moved, "one online iteration left every trained weight unchanged"


def test_online_mode_feeds_the_tanh_weight_its_reward_scale(labelled_folder) -> None:
    """The online trainer's targets come from the base trainer's ``targets_for``: the running spread
    of the leaf values that the tanh layer weight divides by is updated, not left at 0."""
    folder, _ = labelled_folder
    trainer = make_trainer(_small(f"data.picks={folder}", "reward=picks:0.5,scene:0.5", "picks.mode=online",
                                  "loss.prm_weight=tanh", "loss.prm_lambda=0.01"))
    assert trainer.reward_scale.ema is None
    trainer.rollout_and_score(0)
    assert trainer.reward_scale.ema is not None and trainer.reward_scale.ema > 0


def test_online_mode_refuses_a_strategy_without_a_tree(labelled_folder) -> None:
    folder, _ = labelled_folder
    with pytest.raises(ValueError, match="strategy must be dynamic_treerpo"):
        _small(f"data.picks={folder}", "reward=picks", "picks.mode=online", "strategy=mixgrpo")
    with pytest.raises(ValueError, match="needs a picks folder"):
        _small("reward=picks")


def test_train_command_reads_the_folder(labelled_folder, tmp_path: Path) -> None:
    folder, _ = labelled_folder
    out = subprocess.run([*TREERPO, "train", "--out", str(tmp_path / "run"), "--no-progress",
                          *[a for s in SMALL for a in ("--set", s)], "--set", "iterations=1",
                          "--set", "reward=picks:0.5,scene:0.5", "--set", f"data.picks={folder}"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "held-out pair accuracy" in out.stdout + out.stderr
    assert (tmp_path / "run" / "lora" / "comfyui_lora.safetensors").is_file()


def test_bench_taste_quick_measures_two_tastes_against_their_frontier(tmp_path: Path) -> None:
    """CI's run of ``treerpo bench taste --quick``: larger_objects and lower_objects (which pulls against the
    prompt), each with the method as the node runs it under the guard (at both picks weights, one run kept,
    its cost recorded), and its oracle frontier (fixed weights and the guard steering)."""
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nthe protocol's figures\n\n<!-- bench taste t, picks 0.2: begin -->\nold\n"
                    "<!-- bench taste t, picks 0.2: end -->\n")
    out = subprocess.run([*TREERPO, "bench", "taste", "--quick", "--out", str(tmp_path / "runs"),
                          "--docs", str(page)], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    for taste in ("larger_objects", "lower_objects"):
        summary = json.loads((tmp_path / "runs" / taste / "taste.json").read_text())
        assert summary["taste"] == taste and summary["trees"] == 6 and summary["complete"]
        for key in ("seeds", "budget", "oracle_gain_mean", "oracle_gain_ci95", "oracle_scene_after", "modes",
                    "per_seed", "command"):
            assert key in summary, key
        row = summary["modes"]["reward"]
        assert row["taste_after"] == pytest.approx(row["taste_before"] + row["taste_gain_mean"])
        for n in ("3", "6"):
            figures = summary["by_trees"][n]
            for key in ("frontier_gain", "share_of_frontier", "guard_change", "guard_limit", "chosen"):
                assert key in figures, (n, key)
            assert figures["guard_limit"] == 0.02 and len(figures["chosen"]) == 2
            assert all("reason" in c and c["iteration"] in (0, 1, 2) for c in figures["chosen"])
            frontier = [max(f["gain"] for f in r["frontier"].values()) for r in summary["per_seed"]]
            assert figures["frontier_gain"]["per_seed"] == pytest.approx(frontier)
            assert figures["costs"]["training_images"] > 0 and figures["costs"]["guard_images"] > 0
            assert 0.0 <= figures["on_policy_pair_accuracy"] <= 1.0
            assert figures["past_limit"]["of"] == 2
        assert set(summary["per_seed"][0]["frontier"]) == {"0.3", "0.5", "steered"}
        assert f"taste {taste}: seeds [0, 1]; oracle frontier" in out.stdout
    assert (tmp_path / "runs" / "lower_objects" / "before_after.png").is_file()
    text = page.read_text()
    assert text.startswith("# Results\n\nthe protocol's figures")
    assert "picks 0.2: begin" not in text  # an older version's sections go
    assert text.count("bench taste every taste: begin") == 1
    assert "images/results_lower_objects.png" in text and "--quick" in text
    assert "| lower_objects (against the prompt) | 3 |" in text
    again = subprocess.run([*TREERPO, "bench", "taste", "--quick", "--report", "--out",
                            str(tmp_path / "runs"), "--docs", str(page)], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert page.read_text() == text  # the section is replaced, not appended again
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- bench taste summary: begin -->\n<!-- bench taste summary: end -->\n")
    short = subprocess.run([*TREERPO, "bench", "taste", "--quick", "--report", "--out",
                            str(tmp_path / "runs"), "--readme", str(readme)],
                           capture_output=True, text=True, timeout=300)
    assert short.returncode == 0, short.stderr[-2000:]
    assert "| lower_objects (against the prompt) | " in readme.read_text()
    assert "Runs whose held-out fall went past the limit: " in readme.read_text()


def test_bench_taste_refuses_a_readme_without_its_markers_before_anything_runs(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# a README with no taste block\n")
    out = subprocess.run([*TREERPO, "bench", "taste", "--quick", "--out", str(tmp_path / "runs"),
                          "--readme", str(readme)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no taste block between" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_the_linear_head_learns_a_size_taste_from_few_trees() -> None:
    """``picks.head: linear`` (the default) and ``mlp`` both order a size taste they were not shown."""
    from dynamic_treerpo.trainer.rewards.personal import FitConfig, fit_any, pair_accuracy, pooled_features

    gen = torch.Generator().manual_seed(3)
    feats, pairs, held_feats, held_pairs = {}, {}, {}, {}
    for k in range(12):
        images, sizes = squares(8, gen)
        order = sizes.argsort(descending=True).tolist()
        target = (feats, pairs) if k < 8 else (held_feats, held_pairs)
        target[0][str(k)] = pooled_features(images)
        target[1][str(k)] = tree_pairs(Picks(tuple(order[:2]), tuple(order[-1:])), 8)
    for head in ("linear", "mlp"):
        model = fit_any(feats, pairs, FitConfig(head=head))
        assert pair_accuracy(model, held_feats, held_pairs) > 0.8, head
    with pytest.raises(ValueError, match="unknown personal-reward head"):
        fit_any(feats, pairs, FitConfig(head="forest"))
    with pytest.raises(ValueError, match=r"picks\.head: expected one of .linear., .mlp., .*got .forest."):
        _small("picks.head=forest")


def test_the_protocol_page_keeps_the_taste_section(tmp_path: Path) -> None:
    from dynamic_treerpo.trainer.bench.taste.page import marks, put_section, sections_of

    page = tmp_path / "results.md"
    (a, b), (c, d) = marks("t, picks 0.25"), marks("t, picks 0.15")
    put_section(page, "t, picks 0.25", f"{a}\nfirst\n{b}")
    put_section(page, "t, picks 0.15", f"{c}\nother\n{d}")
    put_section(page, "t, picks 0.25", f"{a}\nsecond\n{b}")
    text = page.read_text()
    assert sections_of(text) == [f"{a}\nsecond\n{b}", f"{c}\nother\n{d}"] and "first" not in text


def test_a_config_change_keeps_the_picks_options() -> None:
    config = _small("picks.mode=online", "picks.trees_per_iteration=3")
    assert replace(config, seed=1).picks.trees_per_iteration == 3
    with pytest.raises(ValueError, match="needs picks\\.backbone_weights"):
        _small("picks.backbone=pickscore")


def test_a_clip_backbone_for_real_models(tmp_path: Path) -> None:
    """``picks.backbone: pickscore`` reads PickScore's CLIP (here a tiny random one) as the features."""
    from dynamic_treerpo.trainer.rewards.personal import backbone, fit_head, pair_accuracy
    from tests.tiny_models import tiny_clip_reward

    features = backbone("pickscore", str(tiny_clip_reward(tmp_path / "clip")))
    images, sizes = squares(6, torch.Generator().manual_seed(1))
    feats = features(images)
    assert feats.shape[0] == 6 and torch.allclose(feats.norm(dim=-1), torch.ones(6), atol=1e-5)
    order = sizes.argsort(descending=True).tolist()
    pairs = {"t": tree_pairs(Picks(tuple(order[:2]), tuple(order[-1:])), 6)}
    head = fit_head({"t": feats}, pairs)
    assert pair_accuracy(head, {"t": feats}, pairs) > 0.9  # it fits what it was shown
    with pytest.raises(ValueError, match="unknown personal-reward backbone"):
        backbone("dino", "x")


def test_a_guard_of_the_backbone_s_clip_builds_it_once(labelled_folder, tmp_path: Path, monkeypatch) -> None:
    """``picks.backbone: pickscore`` guarded by a ``pickscore`` term of the same weights: one CLIP serves
    the personal reward's features and the guard's scores (a second ~1B-parameter copy otherwise)."""
    from dynamic_treerpo.trainer.rewards import clip_family
    from dynamic_treerpo.trainer.training.build import build_reward
    from tests.tiny_models import tiny_clip_reward

    folder, _ = labelled_folder
    clip = str(tiny_clip_reward(tmp_path / "clip"))
    built, real = [], clip_family.build_pickscore
    monkeypatch.setattr(clip_family, "build_pickscore", lambda *a, **k: built.append(a) or real(*a, **k))
    picks = [f"data.picks={folder}", "picks.backbone=pickscore", f"picks.backbone_weights={clip}"]
    mix = build_reward(_small(*picks, "reward=picks:0.85,pickscore:0.15", f"reward_weights.pickscore={clip}"))
    assert len(built) == 1
    images = PickStore(folder).load_images(PickStore(folder).tree_ids()[0])
    scores = mix(images, ["a red circle"] * 4)
    assert scores["reward_picks"].shape == scores["reward_pickscore"].shape == (4,)
    # another CLIP as the guard: each is built from its own weights
    other = str(tiny_clip_reward(tmp_path / "other", seed=2))
    build_reward(_small(*picks, "reward=picks:0.85,pickscore:0.15", f"reward_weights.pickscore={other}"))
    assert len(built) == 3


def test_the_fingerprint_does_not_depend_on_threads() -> None:
    """The check of a folder against the connected model must not change with torch's thread count."""
    from dynamic_treerpo.trainer.preferences.identity import base_fingerprint

    transformer = EmbeddedPolicy.from_pretrained().transformer
    threads = torch.get_num_threads()
    try:
        seen = set()
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            seen.add(base_fingerprint(transformer))
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 1
    assert base_fingerprint(transformer.to(torch.bfloat16).float()) != seen.pop()  # other values, other id


def test_online_mode_refuses_trees_another_model_drew(labelled_folder, tmp_path: Path) -> None:
    """Online trains on the stored edges: they must be this model's (reward mode reads images only)."""
    folder, _ = labelled_folder
    other = tmp_path / "other"
    for tree_id in PickStore(folder).tree_ids():
        _copy_tree(folder, other, tree_id, fingerprint="0123456789abcdef")
    with pytest.raises(ValueError, match="made with another model"):
        make_trainer(_small(f"data.picks={other}", "reward=picks:0.5,scene:0.5", "picks.mode=online"))
    trainer = make_trainer(_small(f"data.picks={other}", "reward=picks:0.5,scene:0.5"))
    assert trainer.reward.fns["picks"].fit.trees == 8


def _fake_seed(seed: int, frontier_gain: float):
    """A stored seed as ``run_seed`` leaves it: its frontier and the method at 3 trees."""
    from dynamic_treerpo.trainer.bench.taste.budget import SeedResult

    base = {"iteration": 0, "strength": 1.0, "taste": 0.5, "guard": 0.45, "guard_se": 0.0,
            "test_taste": 0.5, "test_scene": 0.45}
    point = {**base, "iteration": 2, "taste": 0.6, "guard_se": 0.01, "test_taste": 0.6}
    method = {"taste": 0.6, "scene": 0.45, "accuracy": 0.8, "held_out_pairs": 4.0, "limit": 0.02,
              "chosen": {"iteration": 2, "strength": 1.0, "reason": "r", "validation_taste_gain": 0.1,
                         "validation_scene_fall": 0.0}, "points": [base, point]}
    frontier = {"0.3": {"weight": 0.3, "gain": frontier_gain, "scene_change": 0.0, "iteration": 2,
                        "strength": 1.0, "limit": 0.02, "taste": 0.5 + frontier_gain, "scene": 0.45,
                        "points": []}}
    return SeedResult(seed, 0.5, 0.45, {"taste": 0.5 + frontier_gain, "scene": 0.45, "weight": 0.3},
                      frontier, {3: method})


def test_a_resumed_taste_run_redoes_only_the_frontier_when_only_its_strengths_changed(
        tmp_path: Path, monkeypatch) -> None:
    """A ``taste.json`` made before the frontier tried lower strengths (``frontier_strengths`` 0, or absent)
    keeps its method runs and gets its frontier redone; a new seed runs whole; any other change is refused."""
    from dynamic_treerpo.trainer.bench.taste import frontier as oracle
    from dynamic_treerpo.trainer.bench.taste import run as bench
    from dynamic_treerpo.trainer.bench.taste.budget import QUICK

    budget = replace(QUICK, seeds=1, trees=3, at=(), frontier_weights=(0.3,), frontier_steer=False,
                     rounds=1)
    ran: list[int] = []
    monkeypatch.setattr(bench, "run_seed", lambda b, seed, *a, **k: ran.append(seed) or _fake_seed(seed, 0.0))
    out = tmp_path / "larger_objects"
    bench.run_taste(replace(budget, frontier_strengths=0), "larger_objects", out, log=_quiet_log)
    stored = json.loads((out / "taste.json").read_text())
    del stored["budget"]["frontier_strengths"]  # as written before the field existed
    (out / "taste.json").write_text(json.dumps(stored))
    (out / "before_after.png").write_bytes(b"grid")

    redone: list[tuple[int, int]] = []

    def frontier(b, seed, weight, *args, **kwargs):
        redone.append((seed, b.frontier_strengths))
        return {**_fake_seed(seed, 0.2).frontier["0.3"], "strength": 0.5}

    monkeypatch.setattr(oracle, "frontier_run", frontier)
    summary = bench.run_taste(replace(budget, seeds=2), "larger_objects", out, log=_quiet_log, resume=True)
    assert ran == [0, 1] and redone == [(0, 4)]  # seed 0: frontier only, with strengths; seed 1: whole
    assert summary["complete"] and summary["budget"]["frontier_strengths"] == 4
    assert summary["per_seed"][0]["frontier"]["0.3"]["gain"] == 0.2
    assert summary["per_seed"][0]["reward"][3]["taste"] == 0.6  # the method run is kept
    assert not (out / "before_after.png").exists()  # its frontier row showed another point
    with pytest.raises(ValueError, match="another budget"):
        bench.run_taste(replace(budget, seeds=2, lr=0.001), "larger_objects", out, log=_quiet_log,
                        resume=True)


def _quiet_log(_: str) -> None:
    return None


def test_the_taste_summary_counts_runs_past_the_limit_and_reads_the_second_round() -> None:
    """The risk count (runs whose test fall went past the limit), the steered frontier arm among the
    weights, and a two-round run's figures: the first reward's accuracy on the trained model's trees beside
    its accuracy on more of the base model's."""
    from dynamic_treerpo.trainer.bench.taste.budget import QUICK
    from dynamic_treerpo.trainer.bench.taste.summary import format_summary, summarise

    seeds = [_fake_seed(s, 0.2) for s in range(3)]
    seeds[1].reward[3]["scene"] = 0.45 - 0.03  # past the limit of 0.02
    for s in seeds:
        s.frontier["steered"] = {**s.frontier["0.3"], "weight": "steered", "gain": 0.25}
        s.reward[3]["rounds"] = [
            {"trees": 1, "model": "base", "chosen": [2, 1.0], "taste": 0.55, "scene": 0.45},
            {"trees": 2, "model": "round 1 at 2@1", "first_reward_accuracy": 0.6,
             "first_reward_accuracy_on_base_trees": 0.8}]
    summary = summarise(seeds, replace(QUICK, rounds=2, as_node=False), "larger_objects")
    row = summary["by_trees"]["3"]
    assert row["past_limit"] == {"runs": 1, "of": 3}
    assert list(summary["frontier"]["by_weight"]) == ["0.3", "steered"]
    assert row["frontier_gain"]["mean"] == pytest.approx(0.25)  # the best arm, here the steered one
    assert row["rounds"]["first_reward_on_policy_accuracy"] == pytest.approx(0.6)
    assert row["rounds"]["first_reward_base_accuracy"] == pytest.approx(0.8)
    assert row["rounds"]["first_round_taste_gain"]["mean"] == pytest.approx(0.05)
    text = format_summary(summary)
    assert "past it in 1 of 3 runs" in text and "0.60 on the trained model's trees, 0.80 on the base" in text


def test_a_taste_run_records_its_code_and_refuses_to_resume_across_a_code_change(
        tmp_path: Path, monkeypatch) -> None:
    """Every seed records the code version that ran it; a resume under other code (a changed file of the
    code that trains or samples) is refused in one line, and the stored seeds are left as they were."""
    from dynamic_treerpo.trainer.bench.common import provenance
    from dynamic_treerpo.trainer.bench.taste import run as bench
    from dynamic_treerpo.trainer.bench.taste.budget import QUICK

    budget = replace(QUICK, seeds=1, trees=3, at=(), frontier_weights=(0.3,), frontier_steer=False,
                     rounds=1)
    monkeypatch.setattr(bench, "run_seed", lambda b, seed, *a, **k: _fake_seed(seed, 0.1))
    out = tmp_path / "larger_objects"
    summary = bench.run_taste(budget, "larger_objects", out, log=_quiet_log)
    assert [v["code"] for v in summary["code"]] == [provenance.code_fingerprint()]
    assert summary["per_seed"][0]["code"]["code"] == provenance.code_fingerprint()
    before = (out / "taste.json").read_text()
    other = {**provenance.provenance(), "code": "0123456789abcdef"}
    monkeypatch.setattr(bench, "provenance", lambda: other)
    with pytest.raises(ValueError, match=r"made by other code .*one code version") as refused:
        bench.run_taste(replace(budget, seeds=2), "larger_objects", out, log=_quiet_log, resume=True)
    assert "\n" not in str(refused.value) and (out / "taste.json").read_text() == before
    monkeypatch.setattr(bench, "provenance", provenance.provenance)
    with pytest.raises(ValueError, match="other --set options"):  # the same code, other options
        bench.run_taste(replace(budget, seeds=2), "larger_objects", out, ["lora.rank=8"], log=_quiet_log,
                        resume=True)


def test_an_ablation_takes_the_frontier_of_a_run_of_the_same_code_and_budget(
        tmp_path: Path, monkeypatch) -> None:
    """``--frontier-from``: each seed gets the stored frontier of that seed (not trained again) when the
    source ran the same code, frontier budget and frontier-read options; otherwise one-line refusals."""
    from dynamic_treerpo.trainer.bench.taste import run as bench
    from dynamic_treerpo.trainer.bench.taste.budget import QUICK

    budget = replace(QUICK, seeds=2, trees=3, at=(), frontier_weights=(0.3,), frontier_steer=False,
                     rounds=1)
    given: dict[int, object] = {}

    def seed_run(b, seed, taste, folder, extra, log, grid=None, frontier=None, pieces=None):
        given[seed] = frontier
        return _fake_seed(seed, 0.1 + seed)

    monkeypatch.setattr(bench, "run_seed", seed_run)
    source = tmp_path / "main" / "larger_objects"
    bench.run_taste(budget, "larger_objects", source, ["lora.rank=4"], log=_quiet_log)
    assert given == {0: None, 1: None}
    ablation = replace(budget, seeds=3, mistakes=0.0, rounds=1)
    extra = ["lora.rank=4", "guard.pairs=128", "guard.search=line",  # options the frontier does not read
             "experimental.picks.pessimism=1", "guard.validation=held_out"]
    bench.run_taste(ablation, "larger_objects", tmp_path / "clean" / "larger_objects", extra, log=_quiet_log,
                    frontier_from=source / "taste.json")
    assert given[0]["0.3"]["gain"] == 0.1 and given[1]["0.3"]["gain"] == 1.1 and given[2] is None
    with pytest.raises(ValueError, match="trained its frontier with another budget"):
        bench.run_taste(replace(ablation, lr=0.001), "larger_objects", tmp_path / "x", extra,
                        log=_quiet_log, frontier_from=source / "taste.json")
    with pytest.raises(ValueError, match="other --set options that its frontier reads"):
        bench.run_taste(ablation, "larger_objects", tmp_path / "y", ["lora.rank=8"], log=_quiet_log,
                        frontier_from=source / "taste.json")
    with pytest.raises(ValueError, match="does not exist"):
        bench.run_taste(ablation, "larger_objects", tmp_path / "z", extra, log=_quiet_log,
                        frontier_from=tmp_path / "none" / "taste.json")


def test_a_one_round_taste_run_measures_its_reward_on_the_trained_models_trees(tmp_path: Path) -> None:
    """At every tree count, the chosen model samples trees that the person labels, and the personal
    reward's pair accuracy on them is reported beside its accuracy on base trees; the run records the
    options it was given and its code version, and the page names that version."""
    from dynamic_treerpo.trainer.bench.common.provenance import code_fingerprint

    page = tmp_path / "results.md"
    page.write_text("# Results\n")
    out = subprocess.run([*TREERPO, "bench", "taste", "--quick", "--rounds", "1", "--seeds", "1", "--tastes",
                          "larger_objects", "--out", str(tmp_path / "runs"), "--docs", str(page)],
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "runs" / "larger_objects" / "taste.json").read_text())
    for n in ("3", "6"):
        check = summary["per_seed"][0]["reward"][n]["on_policy"]
        assert check["trees"] == int(n) and 0.0 <= check["accuracy"] <= 1.0  # min(8, n) trees
        assert summary["by_trees"][n]["on_policy_pair_accuracy"] == pytest.approx(check["accuracy"])
    assert "on the trained model's" in out.stdout
    assert summary["extra"] == ["tree.steps=6", "sampling.eval_steps=3", "lora.rank=4"]
    assert [v["code"] for v in summary["code"]] == [code_fingerprint()]
    assert f"(code {code_fingerprint()})" in page.read_text()


def test_a_taste_run_stopped_inside_a_seed_resumes_there_to_the_same_figures(
        tmp_path: Path, monkeypatch) -> None:
    """Each finished frontier arm and tree count is kept until its seed is whole: a run stopped inside a
    seed resumes without training those again, and ends with the figures of a run never stopped."""
    from dynamic_treerpo.trainer.bench.taste import frontier as oracle
    from dynamic_treerpo.trainer.bench.taste import run as bench
    from dynamic_treerpo.trainer.bench.taste.budget import QUICK, QUICK_OVERRIDES

    budget = replace(QUICK, seeds=1, frontier_steer=False, rounds=1, frontier_weights=(0.3,))
    extra = list(QUICK_OVERRIDES)
    whole = bench.run_taste(budget, "larger_objects", tmp_path / "whole", extra, log=_quiet_log)
    node_round = bench.node_round
    calls = {"frontier": 0, "method": 0}

    def stopping(b, seed, store, ids, *args, **kwargs):
        if len(ids) == 6:  # the second tree count: the process is stopped here
            raise KeyboardInterrupt
        return node_round(b, seed, store, ids, *args, **kwargs)

    out = tmp_path / "stopped"
    monkeypatch.setattr(bench, "node_round", stopping)
    with pytest.raises(KeyboardInterrupt):
        bench.run_taste(budget, "larger_objects", out, extra, log=_quiet_log)
    assert sorted(p.name for p in (out / ".seed0.pieces").iterdir()) == [
        "code.json", "frontier_0.3.json", "frontier_0.3.pt", "trees_3.json"]  # the grid's frontier row too
    frontier_run = oracle.frontier_run

    def counting_frontier(*args, **kwargs):
        calls["frontier"] += 1
        return frontier_run(*args, **kwargs)

    def counting_method(*args, **kwargs):
        calls["method"] += 1
        return node_round(*args, **kwargs)

    monkeypatch.setattr(oracle, "frontier_run", counting_frontier)
    monkeypatch.setattr(bench, "node_round", counting_method)
    resumed = bench.run_taste(budget, "larger_objects", out, extra, log=_quiet_log, resume=True)
    assert calls == {"frontier": 0, "method": 1}  # only the tree count that had not finished
    assert not (out / ".seed0.pieces").exists() and not list(out.glob("tmp*"))
    def strip(rows: list[dict]) -> list[dict]:  # the figures, without the code version and the seconds spent
        def figures(run: dict) -> dict:
            return {k: v for k, v in run.items() if k != "costs"}

        return [{**{k: v for k, v in r.items() if k != "code"},
                 "reward": {n: figures(run) for n, run in r["reward"].items()}} for r in rows]

    assert strip(resumed["per_seed"]) == strip(whole["per_seed"])
    assert (out / "before_after.png").is_file()
