"""Several rewards as one: the spec, the binding of weights paths, the group-normalised sum and the
raw weighted sum."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.rewards.mix import RewardMix, bind_weights, parse_reward_spec


def test_spec_weights_default_to_one_and_bad_specs_fail() -> None:
    terms = parse_reward_spec("hps-v2.1:0.7, clip:0.3,ocr")
    assert [(t.name, t.weight) for t in terms] == [("hps-v2.1", 0.7), ("clip", 0.3), ("ocr", 1.0)]
    for spec, message in [("hps", "unknown reward 'hps'"), ("clip,clip", "named twice"),
                          ("clip:x", "is not a number"), ("clip:0", "must be > 0"), ("clip,", "empty")]:
        with pytest.raises(ValueError, match=message):
            parse_reward_spec(spec)


def test_bare_paths_go_to_rewards_that_need_weights_in_order() -> None:
    # scene and ocr need no weights, so the two bare paths go to hps-v2.1 and clip
    assert bind_weights(["scene", "hps-v2.1", "ocr", "clip"], ["a.pt", "clipdir"]) == {
        "hps-v2.1": "a.pt", "clip": "clipdir"}
    assert bind_weights(["hps-v2.1", "clip"], ["clip=c", "h.pt"]) == {"clip": "c", "hps-v2.1": "h.pt"}
    with pytest.raises(ValueError, match="no reward to go to"):
        bind_weights(["clip"], ["a", "b"])
    with pytest.raises(ValueError, match="two weights paths"):
        bind_weights(["clip"], ["clip=a", "clip=b"])


def test_group_normalisation_makes_scales_irrelevant_and_weights_count(monkeypatch) -> None:
    from dynamic_treerpo.trainer.rewards import registry

    a = torch.tensor([0.30, 0.31, 0.32, 0.29, 0.30, 0.31])   # a narrow reward (HPS-like)
    b = torch.tensor([3.0, 1.0, 2.0, -1.0, 1.0, 0.0])        # a wide one (ImageReward-like)
    monkeypatch.setitem(registry.REWARDS, "a", registry.RewardEntry("scene_reward", False, ""))
    monkeypatch.setitem(registry.REWARDS, "b", registry.RewardEntry("scene_reward", False, ""))
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    scores = {"reward_a": a, "reward_b": b}
    out = RewardMix("a,b").training_signal(scores, groups)
    # the narrow reward's ranking weighs as much as the wide one's
    za = torch.tensor([-1.2247, 0.0, 1.2247, -1.2247, 0.0, 1.2247])
    zb = torch.tensor([1.2247, -1.2247, 0.0, -1.2247, 1.2247, 0.0])
    assert torch.allclose(out, za + zb, atol=1e-3)
    heavy = RewardMix("a:3,b:1").training_signal(scores, groups)
    assert torch.allclose(heavy, 3 * za + zb, atol=1e-3)
    # a reward constant within a group carries no ranking there
    flat = RewardMix("a,b").training_signal({"reward_a": torch.ones(6), "reward_b": b}, groups)
    assert torch.allclose(flat, zb, atol=1e-3)


def test_the_raw_rule_is_the_reported_reward(monkeypatch) -> None:
    """Flow-GRPO's and DiffusionNFT's rule: the weighted sum of the raw scores, the ``reward`` a mix
    reports, so their global std keeps the spread between prompts."""
    from dynamic_treerpo.trainer.rewards import registry

    monkeypatch.setitem(registry.REWARDS, "scene2", registry.RewardEntry("scene_reward", False, ""))
    mix = RewardMix("scene:0.5,scene2:0.5")
    scores = {"reward_scene": torch.tensor([0.2, 0.4, 0.9, 1.0]),
              "reward_scene2": torch.tensor([1.0, 0.0, 0.5, 0.5])}
    groups = torch.tensor([0, 0, 1, 1])
    raw = mix.training_signal(scores, groups, "raw")
    assert raw.tolist() == pytest.approx([0.6, 0.2, 0.7, 0.75])
    images, prompts = torch.zeros(2, 3, 64, 64), ["a red circle", "a blue square"]
    out = mix(images, prompts)
    assert torch.allclose(mix.training_signal(out, torch.tensor([0, 1]), "raw"), out["reward"])
    assert not torch.allclose(mix.training_signal(scores, groups), raw)  # the default: per-term normalised


def test_mix_of_one_reward_is_that_reward_and_of_two_reports_each(monkeypatch) -> None:
    images = torch.zeros(2, 3, 64, 64)
    prompts = ["a red circle", "a blue square"]
    single = RewardMix("scene")
    out = single(images, prompts)
    assert set(out) >= {"reward", "exact"}
    assert torch.equal(single.training_signal(out, torch.tensor([0, 1])), out["reward"].float())

    from dynamic_treerpo.trainer.rewards import registry

    fake = registry.RewardEntry("scene_reward", False, "")
    monkeypatch.setitem(registry.REWARDS, "scene2", fake)
    both = RewardMix("scene:2,scene2:1")
    mixed = both(images, prompts)
    assert torch.allclose(mixed["reward"], 3 * mixed["reward_scene"])
    assert "scene_exact" in mixed and "scene2_exact" in mixed
    with pytest.raises(ValueError, match="not in"):
        RewardMix("scene", {"clip": "x"})


def test_every_registered_reward_has_its_builder() -> None:
    from importlib import import_module

    from dynamic_treerpo.trainer.rewards import registry

    assert set(registry.reward_names()) == {"scene", "clip", "pickscore", "hps-v2.1", "imagereward", "ocr",
                                            "function", "picks"}
    for name in registry.reward_names():
        entry = registry.reward_entry(name)
        module = import_module(f"dynamic_treerpo.trainer.rewards.{entry.module}")
        assert callable(getattr(module, entry.builder)), name
        if entry.needs_weights:  # a missing path names the reward and where to get its files
            with pytest.raises(ValueError, match=f"reward '{name}' needs its weights"):
                registry.get_reward(name)
