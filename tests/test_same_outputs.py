"""The same images, scores and LoRA on every supported version, against stored answers.

``tests/fixtures/golden/`` holds what the default environment computed (``scripts/make_golden_outputs.py``
says how it was made). CI runs these tests in the default environment and in the floor one
(``make test-floor``: the lowest supported transformers, tokenizers, diffusers, peft and
huggingface_hub), so a version that loads a checkpoint differently, or tokenizes or pools differently,
fails here instead of giving silently different images.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dynamic_treerpo.trainer.compat.transformers_api import (
    CLIP_TEXT_PREFIX,
    load_clip_text_model,
    save_clip_text_model,
)
from dynamic_treerpo.trainer.embedded.policy import WEIGHTS_DIR

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "fixtures" / "golden"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text(encoding="utf-8"))
sys.path.insert(0, str(REPO / "scripts"))
import make_golden_outputs as golden  # noqa: E402  (the script that wrote the answers computes them again)


@pytest.fixture(scope="module")
def leaves() -> tuple[torch.Tensor, list[str]]:
    return golden.embedded_leaves()


def test_the_embedded_model_draws_the_stored_images(leaves) -> None:
    images, prompts = leaves
    stored = load_file(str(GOLDEN / "embedded_leaves.safetensors"))["images"]
    assert prompts == EXPECTED["prompts"]
    assert images.shape == stored.shape
    assert float((images - stored).abs().max()) < 1e-4
    # the two prompts draw different images: an encoder that ignored its weights would not
    half = images.shape[0] // 2
    assert float((images[:half] - images[half:]).abs().mean()) > 0.02


@pytest.mark.parametrize("name", ["scene", "clip", "pickscore"])
def test_rewards_give_the_stored_scores(leaves, name: str) -> None:
    from dynamic_treerpo.trainer.rewards.registry import get_reward

    images, prompts = leaves
    weights = None if name == "scene" else str(GOLDEN / name)
    scores = get_reward(name, weights)(images, prompts)["reward"]
    expected = torch.tensor(EXPECTED["rewards"][name])
    assert scores.shape == expected.shape
    assert float((scores - expected).abs().max()) < 1e-4, (scores, expected)
    assert float(expected.std()) > 1e-3  # the stored scores tell the images apart


def test_one_training_iteration_gives_the_stored_lora() -> None:
    sums = golden.lora_after_one_iteration()
    expected = EXPECTED["lora_after_one_iteration"]
    assert sorted(sums) == sorted(expected)
    for key, (total, absolute) in sums.items():
        want_total, want_abs = expected[key]
        assert abs(absolute - want_abs) <= 1e-4 * max(1.0, want_abs), key
        assert abs(total - want_total) <= 1e-4 * max(1.0, want_abs), key
    assert any(abs(a) > 0 for _, a in expected.values())  # B moved: the iteration trained something


def test_text_encoder_files_are_in_the_layout_both_versions_read() -> None:
    keys = load_file(str(WEIGHTS_DIR / "text_encoder" / "model.safetensors")).keys()
    assert keys and all(k.startswith(CLIP_TEXT_PREFIX) for k in keys)


def test_text_encoder_loads_either_layout_and_refuses_a_mismatch(tmp_path: Path) -> None:
    model = load_clip_text_model(WEIGHTS_DIR / "text_encoder")
    save_clip_text_model(model, tmp_path / "saved")
    again = load_clip_text_model(tmp_path / "saved")
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    flat = {k.removeprefix(CLIP_TEXT_PREFIX): v
            for k, v in load_file(str(tmp_path / "saved" / "model.safetensors")).items()}
    save_file(flat, str(tmp_path / "saved" / "model.safetensors"))  # transformers 5's own layout
    flat_model = load_clip_text_model(tmp_path / "saved")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                   flat_model.state_dict().values(), strict=True))
    del flat["final_layer_norm.weight"]
    save_file(flat, str(tmp_path / "saved" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing text_model\.final_layer_norm\.weight") as err:
        load_clip_text_model(tmp_path / "saved")
    assert "\n" not in str(err.value)
