"""Write ``tests/fixtures/golden/``: what today's default environment computes, for every supported
version to reproduce.

Why: the pack supports transformers 4 and 5 (and diffusers, peft and huggingface_hub from their
floors). A test that compares two code paths inside one environment cannot see a version that loads a
checkpoint differently; a stored answer can. ``tests/test_same_outputs.py`` recomputes each output in
whatever environment runs it (CI runs it in the default one and in the floor one, ``make test-floor``)
and compares:

- the embedded model: a tree's leaves (tree rollout with SDE branches) for two prompts, to 1e-4;
- the scene reward of those images;
- the ``clip`` and ``pickscore`` rewards on tiny fixed-weight CLIP folders (written here once:
  ``clip/`` and ``pickscore/`` with its ``processor/``), on the same images;
- one training iteration of the embedded model (peft LoRA): the sum and absolute sum of each LoRA tensor.

Run it in the default environment (``make venv``), only when an output is meant to change:

    .venv/bin/python scripts/make_golden_outputs.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "fixtures" / "golden"
sys.path.insert(0, str(REPO))  # tests.tiny_models writes the tiny CLIP folders

PROMPTS = ["a red circle on the left and two blue squares on the right", "two green triangles"]
SEEDS = [0, 1]
TRAIN_SETTINGS = [
    "data.prompts_per_iteration=2", "tree.steps=5", "tree.depth=2", "tree.trees_per_prompt=1",
    "lora.rank=4", "lora.alpha=8.0", "seed=3",
]


def embedded_leaves() -> tuple[torch.Tensor, list[str]]:
    """The leaves of one tree per prompt (10 steps, SDE branches at steps 2 and 3) as images, and the
    prompt of each leaf."""
    from dynamic_treerpo.trainer.core.flow import make_sigmas
    from dynamic_treerpo.trainer.core.strategies import TreeConfig, build_plan
    from dynamic_treerpo.trainer.core.tree import rollout
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy

    policy = EmbeddedPolicy.from_pretrained().eval()
    config = TreeConfig(steps=10, window_start=2, depth=2, branching=2)
    plan = build_plan(config, make_sigmas("shift", config.steps, 3.0), config.window_start)
    with torch.no_grad():
        tree = rollout(policy.velocity, policy.encode(PROMPTS), plan, SEEDS, policy.latent_shape)
    leaves_per_prompt = tree.leaf_latents.shape[0] // len(PROMPTS)
    return policy.decode(tree.leaf_latents), [p for p in PROMPTS for _ in range(leaves_per_prompt)]


def lora_after_one_iteration() -> dict[str, list[float]]:
    """``{tensor: [sum, absolute sum]}`` of the LoRA after one Dynamic-TreeRPO iteration."""
    from dynamic_treerpo.trainer.config.files import load_config
    from dynamic_treerpo.trainer.config.schema import TrainConfig
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
    from dynamic_treerpo.trainer.training.session import train_steps

    config = load_config(TrainConfig, None, TRAIN_SETTINGS)
    run = train_steps(EmbeddedPolicy.from_pretrained(), config, 1)
    return {key: [float(value.double().sum()), float(value.double().abs().sum())]
            for key, value in sorted(run.weights.items())}


def write_tiny_clip_folders() -> None:
    """Fixed-weight CLIP folders in the layout of real downloads (seeded, written once)."""
    from transformers import CLIPImageProcessor

    from tests.tiny_models import tiny_hf_clip, write_small_bpe

    clip = GOLDEN / "clip"
    tiny_hf_clip(clip, write_small_bpe(clip), legacy_eos=False, seed=11)
    pick = GOLDEN / "pickscore"
    vocab = write_small_bpe(pick / "processor")
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                   image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3])
    processor.save_pretrained(pick / "processor")
    tiny_hf_clip(pick, vocab, legacy_eos=True, seed=12)


def reward_scores(images: torch.Tensor, prompts: list[str]) -> dict[str, list[float]]:
    from dynamic_treerpo.trainer.rewards.registry import get_reward

    out = {"scene": get_reward("scene")(images, prompts)["reward"].tolist()}
    for name in ("clip", "pickscore"):
        out[name] = get_reward(name, str(GOLDEN / name))(images, prompts)["reward"].tolist()
    return out


def main() -> None:
    import transformers
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    if not (GOLDEN / "clip" / "config.json").is_file():
        write_tiny_clip_folders()
    images, prompts = embedded_leaves()
    save_file({"images": images.contiguous()}, str(GOLDEN / "embedded_leaves.safetensors"))
    expected = {
        "written_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        "prompts": prompts,
        "rewards": reward_scores(images, prompts),
        "lora_after_one_iteration": lora_after_one_iteration(),
    }
    (GOLDEN / "expected.json").write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}: {images.shape[0]} leaves, rewards {', '.join(expected['rewards'])}, "
          f"{len(expected['lora_after_one_iteration'])} LoRA tensors")


if __name__ == "__main__":
    main()
