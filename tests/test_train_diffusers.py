"""The headless trainer on FLUX.1 and SD3 folders (tiny random models written by the tests): the same
run a user starts with ``model.kind: flux|sd3``, down to a LoRA that diffusers' own pipeline loads."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import diffusers
import pytest
import torch
from packaging.version import Version

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.models.diffusers_common import FP8_DIFFUSERS
from dynamic_treerpo.trainer.training.loop import Trainer
from dynamic_treerpo.trainer.training.run import run_training
from tests.test_diffusers_models import flux_pipeline, sd3_pipeline

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "data.prompts_per_iteration=2", "data.eval_pairs=2", "data.eval_every=1", "sampling.eval_steps=2",
    "tree.steps=4", "tree.depth=2", "tree.tail=euler", "checkpoint_every=1", "lora.rank=4", "lora.alpha=8.0",
    "lora.targets=[to_q, to_k, to_v, to_out.0]", "model.height=64", "model.width=64",
    "model.dtype=float32", "model.device=cpu", "optim.lr=0.05", "iterations=1",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for kind, make in (("flux", flux_pipeline), ("sd3", sd3_pipeline)):
        out[kind] = tmp_path_factory.mktemp(kind)
        make().save_pretrained(out[kind])
    return out


@pytest.mark.parametrize("kind", ["flux", "sd3"])
def test_a_run_on_a_diffusers_folder_exports_a_lora_the_pipeline_loads(kind: str, folders, tmp_path) -> None:
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    config = load_config(TrainConfig, None, [*TINY, f"model.kind={kind}", f"model.path={folders[kind]}"])
    trainer = Trainer(config)
    assert trainer.policy.forwards_per_row == (2 if kind == "sd3" else 1)  # SD3 runs CFG 4.5 by default
    run = tmp_path / "run"
    summary = run_training(config, run, progress=False)
    assert "drift" not in summary  # no ideal renders for a latent model
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    row = rows[1]
    assert math.isfinite(float(row["reward_mean"])) and row["exact_mean"] != ""
    # 2 prompts x 4 leaves; every logged forward of SD3 counts the doubled batch
    assert int(row["scored_images"]) == 8
    rollout_rows = 2 * (1 + 2 + 4 * 2)  # roots, the tree's two layers of edges, the leaves' tails
    assert int(row["nfe_rollout"]) == trainer.policy.forwards_per_row * rollout_rows

    # diffusers' own pipeline with the exported LoRA gives the trained model's velocity
    pipe_cls = FluxPipeline if kind == "flux" else StableDiffusion3Pipeline
    pipe = pipe_cls.from_pretrained(folders[kind], torch_dtype=torch.float32, local_files_only=True)
    pipe.load_lora_weights(run / "lora", weight_name="pytorch_lora_weights.safetensors")
    resumed = Trainer(config)
    from dynamic_treerpo.trainer.training.checkpoint import load_latest

    ckpt = load_latest(run / "checkpoints")
    resumed.restore(ckpt.weights, ckpt.optimizer, ckpt.state)
    policy = resumed.policy
    policy.transformer.requires_grad_(False)
    base = Trainer(config).policy
    x = torch.randn(1, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.7])
    cond = policy.encode(["two red circles"])
    trained = policy.velocity(x, sigma, cond)
    untouched = base.velocity(x, sigma, base.encode(["two red circles"]))
    base.transformer = pipe.transformer.eval()
    loaded = base.velocity(x, sigma, cond)
    assert (trained - untouched).abs().max() > 1e-4  # training moved the model
    assert (loaded - trained).abs().max() <= 1e-5 * max(1.0, float(trained.abs().max()))


COMFY_KEYS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import comfy.utils
flux = comfy.utils.flux_to_diffusers({"depth": 1, "depth_single_blocks": 1, "hidden_size": 32})
sd3 = comfy.utils.mmdit_to_diffusers({"depth": 2, "num_blocks": 2, "x_block_self_attn_layers": [0]})
print(json.dumps({name: sorted({k[: -len(".weight")] for k in keys if k.endswith(".weight")})
                  for name, keys in (("flux", flux), ("sd3", sd3))}))
"""


def test_the_comfyui_file_uses_the_keys_comfyui_maps_onto_flux_and_sd3(folders, tmp_path) -> None:
    """ComfyUI's FLUX/SD3 models have their own layout; its LoRA loader maps ``transformer.<diffusers
    module>`` onto it. Every module of our export must be one ComfyUI maps, and carry its alpha."""
    import json
    import subprocess
    import sys

    from comfyui_server import require_comfyui
    from safetensors.torch import load_file

    root = require_comfyui()
    out = subprocess.run([sys.executable, "-c", COMFY_KEYS, str(root)], capture_output=True, text=True,
                         timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    mapped = json.loads(out.stdout.strip().splitlines()[-1])
    for kind in ("flux", "sd3"):
        config = load_config(TrainConfig, None, [*TINY, f"model.kind={kind}", f"model.path={folders[kind]}",
                                                 "iterations=0"])
        run_training(config, tmp_path / kind, progress=False)
        state = load_file(tmp_path / kind / "lora" / "comfyui_lora.safetensors")
        modules = {k[: -len(".lora_down.weight")] for k in state if k.endswith(".lora_down.weight")}
        assert modules and all(m.startswith("transformer.") for m in modules)
        unknown = sorted(modules - {f"transformer.{k}" for k in mapped[kind]})
        assert not unknown, f"{kind}: ComfyUI maps no model key for {unknown[:3]}"
        assert all(f"{m}.alpha" in state and float(state[f"{m}.alpha"]) == 8.0 for m in modules)


def test_a_missing_model_folder_fails_in_one_line_before_any_work(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "dynamic_treerpo.trainer", "train",
                          "--out", str(tmp_path / "r"),
                          "--set", "model.kind=flux", "--set", f"model.path={tmp_path / 'nowhere'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("treerpo train: error: ") and "nowhere" in last and "FLUX.1-dev" in last, last
    assert not (tmp_path / "r" / "metrics.csv").exists()


@pytest.mark.skipif(Version(diffusers.__version__) < Version(FP8_DIFFUSERS),
                    reason=f"fp8 storage needs diffusers>={FP8_DIFFUSERS}; below, tests/test_versions.py "
                           "checks that model.quantize: fp8 is refused in one line")
def test_fp8_weights_train_the_lora_of_their_upcast_values(folders) -> None:
    """``model.quantize=fp8`` keeps the transformer's layer weights in float8_e4m3fn (half of bf16's
    bytes) and trains the same LoRA, to 1e-5 of its largest entry, as a float32 model holding those
    very values: storage changes the memory, not the training."""
    from dataclasses import replace

    from dynamic_treerpo.trainer.training.build import build_policy
    from dynamic_treerpo.trainer.training.session import train_steps

    config = load_config(TrainConfig, None, [*TINY, "model.kind=flux", f"model.path={folders['flux']}",
                                             "model.quantize=fp8", "optim.lr=0.01"])
    fp8 = build_policy(config)
    stored = {p.dtype for p in fp8.transformer.parameters()}
    assert torch.float8_e4m3fn in stored and fp8.dtype == torch.float32
    plain_config = replace(config, model=replace(config.model, quantize="none"))
    plain = build_policy(plain_config)
    with torch.no_grad():  # the float32 model gets the values the fp8 model holds
        for (name, weight), (other, target) in zip(fp8.transformer.named_parameters(),
                                                   plain.transformer.named_parameters(), strict=True):
            assert name == other
            target.copy_(weight.float())
    fp8_bytes = sum(p.numel() * p.element_size() for p in fp8.transformer.parameters())
    plain_bytes = sum(p.numel() * p.element_size() for p in plain.transformer.parameters())
    a = train_steps(fp8, config, 1).weights
    b = train_steps(plain, plain_config, 1).weights
    assert a.keys() == b.keys() and all(v.dtype == torch.float32 for v in a.values())
    scale = max(float(v.abs().max()) for v in b.values())
    assert scale > 0  # the LoRA learned something
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5 * scale
    assert {p.dtype for p in fp8.transformer.parameters() if not p.requires_grad} == stored  # still fp8
    assert fp8_bytes < 0.45 * plain_bytes


def test_quantize_is_refused_for_the_embedded_model_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"model\.quantize applies to flux and sd3"):
        load_config(TrainConfig, None, ["model.quantize=fp8"])
    with pytest.raises(ValueError, match=r"model\.quantize: expected one of 'none', 'fp8'"):
        load_config(TrainConfig, None, ["model.kind=flux", "model.path=x", "model.quantize=int4"])
