"""The embedded model's image encoder (trainer/embedded/image_tower.py) and the personal reward's
``scene-clip`` backbone over it: the shipped weights load and read scenes, and picks fit a reward on them."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dynamic_treerpo.trainer.config.schema import PicksConfig
from dynamic_treerpo.trainer.embedded.contrastive_data import augment, near_misses, sample_scenes, scene_key
from dynamic_treerpo.trainer.embedded.encoder_retrieval import near_miss_accuracy, top1_accuracy
from dynamic_treerpo.trainer.embedded.image_tower import (
    ENCODER_DIR,
    embed_images,
    load_image_tower,
    read_spec,
    shipped_image_tower,
)
from dynamic_treerpo.trainer.embedded.scenes import ObjectSpec, SceneSpec, spec_to_prompt
from dynamic_treerpo.trainer.embedded.text_tower import load_text_tower, tokenize
from dynamic_treerpo.trainer.preferences.linear_reward import fit_basis
from dynamic_treerpo.trainer.rewards.personal import (
    PersonalReward,
    backbone,
    fit_from_store,
    summary_features,
)
from dynamic_treerpo.trainer.rewards.pixel_features import SUMMARY, content_features


@pytest.fixture(scope="module")
def text_tower():
    spec = read_spec(ENCODER_DIR)
    return load_text_tower(ENCODER_DIR, spec.dim, spec.text)


@pytest.fixture(scope="module")
def held_out() -> tuple[torch.Tensor, list[SceneSpec]]:
    """Scenes no pretraining batch drew (their own seed)."""
    images, specs = sample_scenes(48, np.random.default_rng(20260317))
    return torch.from_numpy(images), specs


def test_the_shipped_encoder_gives_unit_norm_embeddings_the_same_every_time(held_out) -> None:
    images, _ = held_out
    tower = shipped_image_tower()
    assert tower is shipped_image_tower()  # loaded once per process
    first = embed_images(images, batch=16)
    assert first.shape == (48, tower.spec.dim) and first.dtype == torch.float32
    assert torch.allclose(first.norm(dim=-1), torch.ones(48), atol=1e-5)
    assert torch.equal(first, embed_images(images, batch=16))
    assert torch.allclose(first, embed_images(images, batch=48), atol=1e-5)  # batching changes nothing
    assert sum(p.numel() for p in tower.parameters()) < 500_000
    assert not any(p.requires_grad for p in tower.parameters())
    with pytest.raises(ValueError, match="64, 64"):
        embed_images(torch.rand(2, 3, 32, 32))


def test_the_shipped_encoder_finds_each_scene_s_caption(held_out, text_tower) -> None:
    """Fresh scenes, clean, blurred with noise, and redrawn by the embedded model: their own caption is the
    nearest of the set's (chance is about 1 in 40), and nearer than captions one composition error away
    (a count, the colours' binding, the sides, a shape or a colour: chance is one half)."""
    from dynamic_treerpo.trainer.embedded.contrastive_data import redraw
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy

    images, specs = held_out
    policy = EmbeddedPolicy.from_pretrained().eval()
    drawn = redraw(policy, images[:24].numpy(), [spec_to_prompt(s) for s in specs[:24]],
                   torch.Generator().manual_seed(4))
    sets = [(images, specs, 0.85), (augment(images, torch.Generator().manual_seed(3)), specs, 0.85),
            (drawn, specs[:24], 0.7)]
    for pictures, truth, top1 in sets:
        embeddings = embed_images(pictures)
        assert top1_accuracy(embeddings, truth, text_tower) > top1
        misses = near_miss_accuracy(embeddings, truth, text_tower)
        assert misses["all"] > 0.93 and min(misses.values()) > 0.85, misses


def test_near_misses_are_one_error_away_and_never_the_scene_itself() -> None:
    spec = SceneSpec((ObjectSpec("circle", "red", 1, "on the left"),
                      ObjectSpec("square", "blue", 1, "on the right")))
    misses = near_misses(spec)
    prompts = {k: {spec_to_prompt(s) for s in v} for k, v in misses.items()}
    assert prompts["binding"] == {"a blue circle on the left and a red square on the right"}
    assert prompts["region"] == {"a red circle on the right and a blue square on the left"}
    assert "two red circles on the left and a blue square on the right" in prompts["count"]
    assert all(scene_key(s) != scene_key(spec) for v in misses.values() for s in v)
    assert near_misses(SceneSpec((ObjectSpec("circle", "red", 1),)))["binding"] == []
    assert tokenize(["a red circle"])[0, :5].tolist()[3:] == [tokenize(["circle"])[0, 1].item(), 2]
    with pytest.raises(ValueError, match="unknown word 'dog'"):
        tokenize(["a red dog"])


def test_the_scene_clip_backbone_is_the_embedding_content_and_the_embedding_s_main_axes(held_out) -> None:
    images, _ = held_out
    features = backbone("scene-clip")
    assert PicksConfig(backbone="scene-clip").backbone_weights is None  # nothing to point at: it ships
    out = features(images)
    tower = shipped_image_tower()
    dim, axes = tower.spec.dim, tower.spec.principal
    assert out.shape == (48, dim + 449 + axes) and axes > 0
    embedding = embed_images(images)
    assert torch.equal(out[:, :dim], embedding)
    assert torch.allclose(out[:, dim:dim + 449], content_features(images))
    assert torch.allclose(out[:, dim + 449:], tower.principal_coordinates(embedding))
    # the linear head keeps content's summary and the main axes as they are: the backbone's last features
    assert summary_features(features) == SUMMARY + axes
    basis = fit_basis([out], dims=4, keep_last=summary_features(features))
    assert basis.directions.shape == (dim + 449 + axes, 4 + SUMMARY + axes)


def test_the_main_axes_are_fixed_on_the_model_s_drawings(held_out) -> None:
    """Unit spread and decorrelated on the drawings they were fitted on (here: a tower refitted on fresh
    scenes), the same on every call."""
    images, _ = held_out
    tower = load_image_tower()
    embedding = embed_images(images, tower)
    tower.set_principal_axes(embedding)
    coords = tower.principal_coordinates(embedding).double()
    covariance = coords.T @ coords / (coords.shape[0] - 1)
    assert torch.allclose(covariance, torch.eye(coords.shape[1], dtype=torch.float64), atol=1e-4)
    assert torch.allclose(coords.mean(dim=0), torch.zeros(coords.shape[1], dtype=torch.float64), atol=1e-5)


def test_a_personal_reward_fits_on_scene_clip_features(tmp_path: Path) -> None:
    """Picks on stored trees of the embedded model fit a personal reward over ``scene-clip``, which scores
    new images; a config names it as it names the other backbones."""
    from dynamic_treerpo.trainer.config.files import load_config
    from dynamic_treerpo.trainer.config.schema import TrainConfig
    from dynamic_treerpo.trainer.core.flow import make_sigmas
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
    from dynamic_treerpo.trainer.preferences.store import PickStore
    from dynamic_treerpo.trainer.training.from_picks import model_id, store_trees
    from dynamic_treerpo.trainer.training.plans import iteration_plan

    config = load_config(TrainConfig, None, ["tree.steps=6"])
    policy = EmbeddedPolicy.from_pretrained()
    sigmas = make_sigmas(config.sampling.schedule, config.strategy_config.steps, config.sampling.shift,
                         image_tokens=policy.image_tokens)
    plan = iteration_plan(config, sigmas, 0, policy.latent_unshuffle)
    store = PickStore(tmp_path / "picks", create=True)
    prompts = ["a red circle", "two yellow triangles", "a green square and a blue circle"]
    ids = store_trees(policy, store, [prompts[i % 3] for i in range(6)], list(range(6)), plan,
                      model_id(policy, "embedded"))
    rng = random.Random(0)
    for tree_id in ids:
        order = store.load_images(tree_id).mean(dim=(1, 2, 3)).argsort(descending=True).tolist()
        store.save_picks(tree_id, order[:2], order[-1:] if rng.random() < 0.8 else [])
    features = backbone("scene-clip")
    fit = fit_from_store(store, features)
    assert fit.trees == 6 and fit.pairs > 0 and fit.held_out_trees >= 1
    reward = PersonalReward(fit, features)
    from dynamic_treerpo.trainer.rewards.personal import build

    logs: list[str] = []
    built = build(str(store.root), backbone_name="scene-clip", log=logs.append)
    assert "on scene-clip features" in logs[0]
    leaves = store.load_images(ids[0])
    scores = reward(leaves, [prompts[0]] * leaves.shape[0])["reward"]
    assert scores.shape == (leaves.shape[0],) and torch.isfinite(scores).all()
    assert torch.equal(built(leaves, [prompts[0]] * leaves.shape[0])["reward"], scores)
    assert load_config(TrainConfig, None, ["picks.backbone=scene-clip"]).picks.backbone == "scene-clip"


def test_another_folder_of_towers_loads_as_the_shipped_one(tmp_path: Path) -> None:
    from dynamic_treerpo.trainer.embedded.image_tower import save_towers

    save_towers(tmp_path, shipped_image_tower())
    again = load_image_tower(tmp_path)
    images = torch.rand(3, 3, 64, 64)
    assert torch.equal(embed_images(images, again), embed_images(images))
    (tmp_path / "config.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not an embedded image encoder"):
        load_image_tower(tmp_path)


def test_pretraining_is_seeded_and_saves_what_the_loader_reads(tmp_path: Path, capsys) -> None:
    """A few steps of ``python -m dynamic_treerpo.trainer.embedded.image_encoder``, twice: the same weights,
    a folder the loader reads, the held-out retrieval printed and saved."""
    import json

    from dynamic_treerpo.trainer.embedded.image_encoder import main

    tiny = ["--steps", "2", "--batch", "8", "--pool", "8", "--held-out", "8", "--warmup", "1",
            "--threads", str(torch.get_num_threads())]  # in-process: leave the tests' thread count alone
    for name in ("a", "b"):
        main(["--out", str(tmp_path / name), *tiny])
    assert "held-out drawn: top1" in capsys.readouterr().out
    images = torch.rand(4, 3, 64, 64)
    first, second = (load_image_tower(tmp_path / name) for name in ("a", "b"))
    assert torch.equal(embed_images(images, first), embed_images(images, second))
    assert first.principal_axes.abs().sum() > 0  # fixed on the model's drawings at the end
    saved = json.loads((tmp_path / "a" / "retrieval.json").read_text())
    assert saved["recipe"]["steps"] == 2 and 0.0 <= saved["held_out"]["clean"]["top1"] <= 1.0
