"""The ComfyUI MODEL policy on ComfyUI's own FLUX model class (whose blocks add into their inputs
in place): its LoRA gradients match finite differences, training hands the shared model back
unchanged, and the trained LoRA applied by ComfyUI as weight patches gives the trained velocities.

ComfyUI is imported in a subprocess (it sets up global state), with the pack loaded by file path
as ComfyUI loads it. The text encoder is a stand-in (fixed random embeddings per prompt): these
checks concern the diffusion model; tests/test_comfyui_flow_models.py runs real loaders.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from comfyui_server import REPO, require_comfyui

_SCRIPT = r'''
import hashlib, importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
import torch
import comfy.options
comfy.options.enable_args_parsing(False)
import comfy.cli_args
comfy.cli_args.args.cpu = True
import comfy.model_management, comfy.model_patcher, comfy.supported_models

spec = importlib.util.spec_from_file_location("treerpo_pack", sys.argv[2] + "/__init__.py",
                                              submodule_search_locations=[sys.argv[2]])
pack = importlib.util.module_from_spec(spec)
sys.modules["treerpo_pack"] = pack
spec.loader.exec_module(pack)
from treerpo_pack.nodes.comfy_door import lora_patched
from treerpo_pack.nodes.comfy_policy import LORA_TARGETS, ComfyModelPolicy
from treerpo_pack.trainer.lora.adapters import attach_lora, lora_state_dict
from treerpo_pack.trainer.lora.keys import COMFYUI_PREFIX, comfyui_state

class StandInClip:
    """tokenize / encode_from_tokens_scheduled as ComfyUI's CLIP has them: fixed random rows per text."""
    def tokenize(self, text):
        return text
    def encode_from_tokens_scheduled(self, text):
        seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
        g = torch.Generator().manual_seed(seed)
        return [[torch.randn(1, 5, 32, generator=g), {"pooled_output": torch.randn(1, 32, generator=g)}]]

config = {"image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16,
          "vec_in_dim": 32, "context_in_dim": 32, "hidden_size": 32, "mlp_ratio": 4.0, "num_heads": 2,
          "depth": 2, "depth_single_blocks": 2, "axes_dim": [4, 6, 6], "theta": 10000, "patch_size": 2,
          "qkv_bias": True}
cpu = torch.device("cpu")
g = torch.Generator().manual_seed(0)
with torch.inference_mode():  # as ComfyUI's loaders run
    base = comfy.supported_models.Flux(config).get_model({}, device=cpu)
    for name, t in base.diffusion_model.state_dict().items():
        norm = t.dim() == 1 and name.endswith("weight")
        t.copy_(torch.ones_like(t) if norm else torch.randn(t.shape, generator=g) * 0.2)
    model = comfy.model_patcher.ModelPatcher(base, load_device=cpu, offload_device=cpu)
    policy = ComfyModelPolicy(model.clone(), StandInClip(), None, (16, 8, 8))

out = {"family": policy.family}
try:
    with torch.inference_mode():
        ComfyModelPolicy(model.clone(), StandInClip(), None, (16, 7, 8))
    out["odd_latent_error"] = None
except ValueError as err:
    out["odd_latent_error"] = str(err)
x = torch.randn(3, 16, 8, 8, generator=g)
sigma = torch.tensor([0.9, 0.5, 0.3])
w = torch.randn(3, 16, 8, 8, generator=g)
cond = policy.encode(["a cat", "two dogs"])
cond["prompt"] = torch.tensor([0, 1, 0])  # rows of two prompts in one batch
with torch.no_grad():
    before = policy.velocity(x, sigma, cond)
    types_before = sorted({type(m).__name__ for m in policy.transformer.modules()})
def gradient_check(checkpointing):
    """Directional derivative of a loss along a random LoRA direction: autograd vs finite differences."""
    with torch.inference_mode(False), torch.enable_grad(), policy.training(checkpointing):
        attach_lora(policy.transformer, 4, 8.0, LORA_TARGETS["flux"], seed=0)
        params = list(policy.trainable_parameters())
        with torch.no_grad():
            for name, p in policy.transformer.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
        loss = lambda: (policy.velocity(x, sigma, cond) * w).sum()
        loss().backward()
        direction = [torch.randn(p.shape, generator=torch.Generator().manual_seed(i))
                     for i, p in enumerate(params)]
        analytic = sum(float((p.grad * d).sum()) for p, d in zip(params, direction))
        eps = 1e-3
        with torch.no_grad():
            for p, d in zip(params, direction): p.add_(eps * d)
            plus = float(loss())
            for p, d in zip(params, direction): p.sub_(2 * eps * d)
            minus = float(loss())
            for p, d in zip(params, direction): p.add_(eps * d)
            trained = policy.velocity(x, sigma, cond)
        lora = comfyui_state(lora_state_dict(policy.transformer), 8.0, COMFYUI_PREFIX)
        return {"analytic": analytic, "numeric": (plus - minus) / (2 * eps), "lora_modules": len(params) // 2,
                "trained": trained, "lora": lora}

plain, checkpointed = gradient_check(False), gradient_check(True)
out["plain"] = {k: v for k, v in plain.items() if k not in ("trained", "lora")}
out["checkpointed"] = {k: v for k, v in checkpointed.items() if k not in ("trained", "lora")}
trained, lora = checkpointed["trained"], checkpointed["lora"]
with torch.no_grad():
    after = policy.velocity(x, sigma, cond)
    out["restored_max_diff"] = float((after - before).abs().max())
    out["types_restored"] = sorted({type(m).__name__ for m in policy.transformer.modules()}) == types_before
    out["lora_changes_velocity"] = float((trained - before).abs().max())
    patched = lora_patched(model, lora)
    comfy.model_management.load_models_gpu([patched], force_full_load=True)  # as a sampler loads it
    out["patched_max_diff"] = float((policy.velocity(x, sigma, cond) - trained).abs().max())
    out["scale"] = float(trained.abs().max())
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def result() -> dict:
    root = require_comfyui()
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(root), str(REPO)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("mode", ["plain", "checkpointed"])
def test_lora_gradients_through_comfyuis_flux_blocks_match_finite_differences(result, mode) -> None:
    """ComfyUI's FLUX blocks add in place; with and without block checkpointing the gradient is
    the true one (checkpointing alone got it 30% wrong before the out-of-place guard)."""
    check = result[mode]
    assert result["family"] == "Flux"
    assert check["lora_modules"] >= 10
    assert abs(check["analytic"]) > 1.0
    assert abs(check["analytic"] - check["numeric"]) <= 5e-3 * abs(check["numeric"]), check


def test_training_gives_the_shared_model_back_unchanged(result) -> None:
    assert result["types_restored"]
    assert result["restored_max_diff"] <= 1e-6 * result["scale"]


def test_comfyui_patches_of_the_trained_lora_give_the_trained_velocities(result) -> None:
    assert result["lora_changes_velocity"] > 1e-2 * result["scale"]  # not a vacuous comparison
    assert result["patched_max_diff"] <= 1e-5 * result["scale"], result


def test_a_latent_with_odd_sides_is_refused_in_one_line(result) -> None:
    assert result["odd_latent_error"] is not None
    assert "16x7x8" in result["odd_latent_error"] and "multiple of 2" in result["odd_latent_error"]
