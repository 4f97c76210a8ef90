"""The shipped embedded base: its per-component scores on a small fixed held-out set stay within the
ranges its model card documents, so a silent change of the weights (or of the sampler or reward
they are scored with) fails here."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.core.flow import make_sigmas
from dynamic_treerpo.trainer.embedded.captions import binding_applies, region_applies
from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
from dynamic_treerpo.trainer.embedded.scenes import parse_prompt
from dynamic_treerpo.trainer.rewards.scene_reward import scene_metrics
from dynamic_treerpo.trainer.training.evaluate import generate, held_out_pairs

PAIRS = 64
SEED = 2026
# trainer/embedded/MODEL_CARD.md, "Quality": measured value +- the tolerance below
DOCUMENTED = {
    "reward": (0.46, 0.04),
    "colour": (0.61, 0.05),
    "shape": (0.40, 0.05),
    "position": (0.76, 0.05),
    "count": (0.65, 0.05),
}


@pytest.fixture(scope="module")
def scored() -> tuple[dict[str, torch.Tensor], list[str]]:
    torch.set_num_threads(2)
    policy = EmbeddedPolicy.from_pretrained()
    pairs = held_out_pairs(PAIRS, SEED)
    prompts = [p.prompt for p in pairs]
    images = generate(policy, prompts, [p.seed for p in pairs], make_sigmas("shift", 10, 3.0))
    return scene_metrics(images, prompts), prompts


@pytest.mark.parametrize("component", sorted(DOCUMENTED))
def test_shipped_base_scores_within_its_documented_range(scored, component: str) -> None:
    metrics, _ = scored
    centre, tolerance = DOCUMENTED[component]
    value = float(metrics[component].mean())
    assert abs(value - centre) <= tolerance, f"{component} {value:.3f} outside {centre} +- {tolerance}"


def test_shipped_base_is_competent_but_follows_composition_badly(scored) -> None:
    """Room for RL: few exact scenes, and the built-in errors show where they can occur."""
    metrics, prompts = scored
    specs = [parse_prompt(p) for p in prompts]
    assert float(metrics["exact"].mean()) <= 0.15
    region = torch.tensor([region_applies(s) for s in specs])
    binding = torch.tensor([binding_applies(s) for s in specs])
    assert region.sum() >= 8 and binding.sum() >= 16
    # objects asked for on a side land on it barely more often than chance would place them
    assert float(metrics["position"][region].mean()) < 0.8
