"""Every rectified-flow image family ComfyUI 0.3.75 carries, trained through the pack's own nodes on a
tiny random instance built from ComfyUI's own model classes (``tests/comfy_families.py``):

- one TreeRPO Train LoRA iteration changes what the MODEL predicts, and leaves the shared base as it was;
- the saved LoRA (ComfyUI and kohya keys), applied by ComfyUI's own ``LoraLoaderModelOnly``, gives the
  trained MODEL's predictions back, with no "lora key not loaded";
- the Tree Sampler and Best of Tree run on the family;
- over float8_e4m3fn base weights (UNETLoader's fp8 ``weight_dtype``) a LoRA trains to the one trained
  over the same weights upcast to float32.

The text encoders and VAEs are stand-ins shaped as each family's own (fixed random conditioning per
text, a fixed projection of the latent to RGB): these checks concern the diffusion model, the
conditioning path through ``extra_conds`` and the LoRA keys. ``tests/test_comfyui_flow_models.py``
runs SD3 with ComfyUI's real loaders, text encoder and VAE in a server. ComfyUI runs in a subprocess
(it sets up global state), with the pack loaded by file path as ComfyUI loads it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from comfyui_server import REPO, require_comfyui

TESTS = Path(__file__).resolve().parent

_SCRIPT = r'''
import json, logging, shutil, sys, time
from pathlib import Path
comfy_root, pack_root, tests_dir, work, wanted, fp8_wanted = sys.argv[1:7]
sys.path.insert(0, comfy_root)
sys.path.insert(0, tests_dir)
import torch
torch.set_num_threads(2)
import comfy.options
comfy.options.enable_args_parsing(False)
import comfy.cli_args
comfy.cli_args.args.cpu = True
import comfy.model_management, comfy.utils
import folder_paths
work = Path(work)
folder_paths.models_dir = str(work / "models")
folder_paths.add_model_folder_path("loras", str(work / "models" / "loras"), is_default=True)
folder_paths.set_output_directory(str(work / "output"))
folder_paths.set_temp_directory(str(work / "temp"))
import nodes as comfy_nodes  # ComfyUI's own nodes: LoraLoaderModelOnly

from comfy_families import StandInClip, StandInVae, latent_shape, load_pack, tiny_model
load_pack(pack_root)
from treerpo_pack.nodes.comfy_door import denoise, flow_family, latent_shape_of, prompt_model_conds
from treerpo_pack.nodes.sampling import TreeRPOBestOfTree, TreeRPOTreeSampler
from treerpo_pack.nodes.comfy_policy import ComfyModelPolicy
from treerpo_pack.nodes.training import TreeRPOSaveLoRA, TreeRPOTrainLoRA
from treerpo_pack.trainer.lora.adapters import attach_lora, load_lora_state

class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []
    def emit(self, record):
        self.lines.append(record.getMessage())
caught = Warnings()
logging.getLogger().addHandler(caught)

SETTINGS = "\n".join(["data.prompts_per_iteration=2", "tree.steps=4", "tree.depth=2", "lora.rank=4",
                      "lora.alpha=8.0", "optim.lr=0.05"])
PROMPTS = "a red apple on a table\na blue car in the rain"
REWARD = dict(reward="clip", reward_mix="", reward_weights="clip=rewards/tiny_clip")

def predict(model, x, sigma, conds):
    comfy.model_management.load_models_gpu([model], force_full_load=True)  # patches applied, as samplers do
    with torch.no_grad():
        return denoise(model, x, sigma, conds).float()

def train(model, clip, vae, latent, seed=0, prefix=None):
    out = TreeRPOTrainLoRA.execute(model=model, iterations=1, prompts=PROMPTS, strategy="dynamic_treerpo",
                                   seed=seed, settings=SETTINGS, clip=clip, vae=vae, latent=latent, **REWARD)
    return out.args

def peft_prediction(base, clip, vae, shape, run, x, sigma, conds):
    """The trained model as training saw it (the run's LoRA weights in peft layers on the base), and the
    guidance the policy used (CFG scale, forwards per row)."""
    policy = ComfyModelPolicy(base.clone(), clip, vae, shape)
    lora = run.config.lora
    with torch.inference_mode(False), torch.no_grad(), policy.training():
        attach_lora(policy.transformer, lora.rank, lora.alpha, lora.targets)
        load_lora_state(policy.transformer, run.weights)
        return denoise(policy.model, x, sigma, conds).float(), (policy.cfg, policy.forwards_per_row)

def reload(base, run, fmt, name):
    saved = Path(TreeRPOSaveLoRA.execute(run=run, filename_prefix=f"loras/{name}", format=fmt).args[0])
    shutil.copy(saved, work / "models" / "loras" / saved.name)
    return comfy_nodes.LoraLoaderModelOnly().load_lora_model_only(base, saved.name, 1.0)[0], saved

results = {}
for family in wanted.split(","):
    t0 = time.perf_counter()
    row = results[family] = {}
    try:
        base = tiny_model(family, seed=0)
        clip, vae = StandInClip(family), StandInVae(family)
        latent = {"samples": torch.zeros(1, *latent_shape(family))}  # as the family's empty-latent node
        shape = latent_shape_of(base, latent)  # the model's own (Qwen-Image: one frame of a video)
        info = flow_family(base)
        row.update(name=info.name, guidance_embedding=info.guidance_embedding, shift=info.shift)
        g = torch.Generator().manual_seed(5)
        x = torch.randn(2, *shape, generator=g)
        sigma = torch.tensor([0.8, 0.4])
        conds = prompt_model_conds(base, clip, "a red apple on a table", shape, None)
        before = predict(base, x, sigma, conds)
        row["scale"] = float(before.abs().max())
        caught.lines.clear()
        trained, _, run, lora = train(base, clip, vae, latent)
        row["lora_modules"] = len([k for k in lora if k.endswith(".lora_up.weight")])
        row["lora_targets"] = list(run.config.lora.targets)
        row["lora_norm"] = float(sum(float(v.float().norm()) for k, v in lora.items() if "lora_up" in k))
        after = predict(trained, x, sigma, conds)
        row["trained_change"] = float((after - before).abs().max())
        row["base_restored"] = float((predict(base, x, sigma, conds) - before).abs().max())
        trained_peft, (row["cfg"], row["forwards_per_row"]) = peft_prediction(base, clip, vae, shape, run, x,
                                                                              sigma, conds)
        row["peft_vs_trained"] = float((trained_peft - after).abs().max())
        for fmt in ("comfyui", "kohya"):
            reloaded, saved = reload(base, run, fmt, f"{family}_{fmt}")
            reloaded_out = predict(reloaded, x, sigma, conds)
            row[f"{fmt}_reload_diff"] = float((reloaded_out - after).abs().max())
            row[f"{fmt}_reload_vs_peft"] = float((reloaded_out - trained_peft).abs().max())
        row["lora_key_not_loaded"] = [m for m in caught.lines if "lora key not loaded" in m][:3]
        try:
            TreeRPOSaveLoRA.execute(run=run, filename_prefix=f"loras/{family}_diffusers", format="diffusers")
            row["diffusers"] = "saved"
        except ValueError as err:
            row["diffusers"] = str(err)
        positive = clip.encode_from_tokens_scheduled(clip.tokenize("a red apple on a table"))
        negative = clip.encode_from_tokens_scheduled(clip.tokenize(""))
        cfg = 1.0 if info.guidance_embedding else 2.0
        sampling = dict(model=trained, latent=latent, seed=1, steps=4, cfg=cfg, depth=2, branching=2,
                        window_start=0, noise_level=0.6)
        leaves, tree = TreeRPOTreeSampler.execute(**sampling, positive=positive, negative=negative,
                                                  noise_growth=0.5, sde_kind="flow_grpo").args
        row["tree_leaves"] = list(leaves["samples"].shape)
        row["tree_finite"] = bool(torch.isfinite(leaves["samples"]).all())
        best, images, scores, table = TreeRPOBestOfTree.execute(**sampling, prompt="a red apple on a table",
                                                                negative_prompt="", clip=clip, vae=vae,
                                                                **REWARD).args
        row["best_shape"] = list(best.shape)
        row["best_scores"] = scores
        row["best_is_max"] = bool(float(best.sub(images[max(range(len(scores)), key=scores.__getitem__)])
                                        .abs().max()) == 0.0)
    except Exception as err:
        import traceback
        traceback.print_exc()
        row["error"] = f"{type(err).__name__}: {err}"
    row["seconds"] = round(time.perf_counter() - t0, 2)

for family in [f for f in fp8_wanted.split(",") if f]:
    row = results[f"{family}_fp8"] = {}
    try:
        fp8 = tiny_model(family, seed=0, dtype=torch.float8_e4m3fn)
        stored = {p.dtype for p in fp8.model.diffusion_model.parameters()}
        row["stored"] = sorted(str(d) for d in stored)
        upcast = tiny_model(family, seed=0)
        state = {k: v.float() for k, v in fp8.model.diffusion_model.state_dict().items()}
        with torch.inference_mode():
            upcast.model.diffusion_model.load_state_dict(state)
        clip, vae = StandInClip(family), StandInVae(family)
        latent = {"samples": torch.zeros(1, *latent_shape(family))}
        a = train(fp8, clip, vae, latent)[2].weights
        b = train(upcast, clip, vae, latent)[2].weights
        row["scale"] = max(float(v.abs().max()) for v in b.values())
        row["max_diff"] = max(float((a[k] - b[k]).abs().max()) for k in b)
        row["lora_dtypes"] = sorted({str(v.dtype) for v in a.values()})
        row["still_fp8"] = {p.dtype for p in fp8.model.diffusion_model.parameters()} == stored
    except Exception as err:
        import traceback
        traceback.print_exc()
        row["error"] = f"{type(err).__name__}: {err}"
import comfy.model_patcher, comfy.supported_models
refused = results["refused"] = {}
cpu = torch.device("cpu")
for name, config in (("SDXL", {"in_channels": 4, "adm_in_channels": 2816}), ("ACEStep", {})):
    config = getattr(comfy.supported_models, name)({"disable_unet_model_creation": True, **config})
    other = comfy.model_patcher.ModelPatcher(config.get_model({}, device=cpu), load_device=cpu,
                                             offload_device=cpu)
    messages = []
    empty = {"samples": torch.zeros(1, 4, 8, 8)}
    tree = dict(positive=[], negative=[], latent=empty, seed=0, steps=4, cfg=1.0, depth=2, branching=2,
                window_start=0, noise_level=0.6, noise_growth=0.5, sde_kind="flow_grpo")
    for run_node in (lambda: train(other, StandInClip("SD3"), StandInVae("SD3"), empty),
                     lambda: TreeRPOTreeSampler.execute(model=other, **tree)):
        try:
            run_node()
            messages.append(None)
        except ValueError as err:
            messages.append(str(err))
    refused[name] = messages
print("RESULT " + json.dumps(results))
'''

FAMILIES = ("Flux", "FluxSchnell", "Flux2", "Chroma", "SD3", "QwenImage", "Lumina2", "ZImage", "HiDream",
            "AuraFlow", "HunyuanImage21")
FP8_FAMILIES = ("Flux", "QwenImage")
# the CFG scale of each family's reference workflow (ComfyUI's templates, the model cards)
REFERENCE_CFG = {"FluxSchnell": 1.0, "Chroma": 4.0, "SD3": 4.5, "QwenImage": 2.5, "Lumina2": 4.0,
                 "ZImage": 1.0, "HiDream": 5.0, "AuraFlow": 3.5, "HunyuanImage21": 3.5}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    from tests.tiny_models import tiny_clip_reward

    root = require_comfyui()
    work = tmp_path_factory.mktemp("comfy_families")
    for folder in ("models/loras", "output", "temp"):
        (work / folder).mkdir(parents=True)
    tiny_clip_reward(work / "models" / "rewards" / "tiny_clip")
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(root), str(REPO), str(TESTS), str(work),
                           ",".join(FAMILIES), ",".join(FP8_FAMILIES)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    errors = {k: v["error"] for k, v in out.items() if k != "refused" and "error" in v}
    assert not errors, (errors, done.stderr[-4000:])
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_one_training_iteration_changes_the_model_and_gives_the_base_back(results, family) -> None:
    row = results[family]
    assert row["name"] == family
    assert row["lora_modules"] >= 2 and row["lora_norm"] > 0
    assert row["trained_change"] > 1e-3 * row["scale"], row  # the MODEL predicts something else now
    assert row["base_restored"] <= 1e-6 * row["scale"], row  # the shared base was handed back as it came


@pytest.mark.parametrize("family", FAMILIES)
def test_the_saved_lora_reloads_with_comfyuis_lora_loader(results, family) -> None:
    row = results[family]
    assert row["peft_vs_trained"] <= 1e-4 * row["scale"], row  # the node's MODEL is the trained model
    for fmt in ("comfyui", "kohya"):  # the file in ComfyUI's loader: the node's MODEL and the peft model
        assert row[f"{fmt}_reload_diff"] <= 1e-5 * row["scale"], (fmt, row)
        assert row[f"{fmt}_reload_vs_peft"] <= 1e-4 * row["scale"], (fmt, row)
    assert row["lora_key_not_loaded"] == []
    if family in ("Flux", "FluxSchnell", "SD3"):
        assert row["diffusers"] == "saved"
    else:  # a one-line refusal naming the family, not a file ComfyUI would half load
        assert family in row["diffusers"] and "comfyui or kohya" in row["diffusers"]


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_sampler_and_best_of_tree_run(results, family) -> None:
    row = results[family]
    assert row["tree_leaves"][0] == 4 and row["tree_finite"]  # binary branching, depth 2
    assert row["best_shape"][0] == 1 and len(row["best_scores"]) == 4 and row["best_is_max"]


def test_guidance_and_schedule_are_read_from_each_model(results) -> None:
    """FLUX.1-dev and FLUX.2-dev carry a guidance embedding (the others take CFG), and the sigma shift is
    the one ComfyUI samples each family with (FLUX's ``mu`` form as ``k = e^mu``)."""
    import math

    embedded = {f for f in FAMILIES if results[f]["guidance_embedding"]}
    assert embedded == {"Flux", "Flux2"}
    for family in FAMILIES:  # CFG at the family's reference scale, two forwards a row (one at CFG 1)
        cfg, forwards = results[family]["cfg"], results[family]["forwards_per_row"]
        expected = 1.0 if family in embedded else REFERENCE_CFG[family]
        assert (cfg, forwards) == (expected, 1 + (expected != 1.0)), family
    shifts = {f: results[f]["shift"] for f in FAMILIES}
    assert shifts["SD3"] == pytest.approx(3.0) and shifts["Flux"] == pytest.approx(math.exp(1.15))
    assert shifts["Flux2"] == pytest.approx(math.exp(2.02)) and shifts["AuraFlow"] == pytest.approx(1.73)
    assert shifts["FluxSchnell"] == pytest.approx(1.0) and shifts["Lumina2"] == pytest.approx(6.0)


def test_models_that_are_not_rectified_flow_images_are_refused_by_name(results) -> None:
    """SDXL predicts noise (EPS) and ACE-Step makes audio: training and the tree sampler refuse them in one
    line that names the family, before anything runs."""
    for name, reason in (("SDXL", "not a rectified-flow model (it predicts EPS)"),
                         ("ACEStep", "makes audio")):
        messages = results["refused"][name]
        assert len(messages) == 2 and all(m is not None and m.startswith(name) and reason in m
                                          and "\n" not in m for m in messages), messages


@pytest.mark.parametrize("family", FP8_FAMILIES)
def test_a_lora_over_fp8_weights_equals_the_one_over_their_upcast_values(results, family) -> None:
    """UNETLoader's fp8_e4m3fn weights stay fp8 (ComfyUI casts each layer as it runs); the LoRA trains in
    float32 and matches the run over float32 copies of the same values to 1e-4 of its largest entry."""
    row = results[f"{family}_fp8"]
    assert "torch.float8_e4m3fn" in row["stored"] and row["still_fp8"]
    assert row["lora_dtypes"] == ["torch.float32"]
    assert row["scale"] > 0
    assert row["max_diff"] <= 1e-4 * row["scale"], row
