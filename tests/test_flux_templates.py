"""The FLUX.1-dev templates for a 24 GB card (``flux_pick_fp8``, ``flux_dev_train_fp8``) run end to end in
ComfyUI on tiny random weights (``scripts/template_run.py``): files of the names and layouts their loaders
and weight widgets name (FLUX.1-dev stored in fp8, CLIP-L, T5-XXL in fp8, the FLUX autoencoder, a tiny
PickScore or HPS-v2.1 CLIP), read by ComfyUI's own loaders (UNETLoader keeping the weights in fp8), and
the template's own graph validated and executed by ComfyUI's ``validate_prompt`` and ``PromptExecutor``.

The widgets are as saved, except what only sets how long a run takes: one tree per prompt, one training
round, 32-pixel images, 4 validation pairs for the picks trainer's guard. The picks template runs as a
person uses it: the first run samples and refuses training ("no picks folder yet"), a scripted person
picks through the picks store, the next run trains and draws the before/after images. That the templates
are refused for exactly their missing files, one line each, is in tests/test_workflows.py.
ComfyUI runs in a subprocess (it sets up global state)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from comfyui_server import REPO, require_comfyui
from PIL import Image

_SCRIPT = r'''
import json, sys
from pathlib import Path
scripts, work, name = sys.argv[1:4]
sys.path.insert(0, scripts)
import torch
torch.set_num_threads(1)
import template_run
stages = template_run.run_template(name, Path(work), True, torch.device("cpu"), trees_per_prompt=1,
                                   iterations=1, side=32, report=lambda _: None, guard_pairs=4)
import comfy.model_management
flux = [lm.model.model.diffusion_model for lm in comfy.model_management.current_loaded_models
        if type(lm.model.model).__name__ == "Flux"]
backbone = {}  # picks.backbone_weights of the settings box: read under the models folder, as weight widgets
if name == "flux_pick_fp8":
    import inspect, nodes
    train = nodes.NODE_CLASS_MAPPINGS["TreeRPOTrainFromPicks"]
    saved = template_run.template(name)["7"]["inputs"]
    for path in ("rewards/NoSuchCLIP", "/etc"):
        widgets = {k: v for k, v in saved.items() if k in inspect.signature(train.validate_inputs).parameters}
        widgets["settings"] = widgets["settings"].replace("picks.backbone_weights=rewards/PickScore_v1",
                                                          f"picks.backbone_weights={path}")
        try:
            backbone[path] = str(train.validate_inputs(**widgets))
        except ValueError as err:
            backbone[path] = str(err)
print("RESULT " + json.dumps({
    "stages": {s.name: {"seconds": s.seconds, "refused": s.refused, "extra": s.extra} for s in stages},
    "flux_weights": sorted({str(m.double_blocks[0].img_attn.qkv.weight.dtype) for m in flux}),
    "backbone": backbone}))
'''


def run(name: str, work: Path) -> tuple[dict, str]:
    root = require_comfyui()
    env = {**os.environ, "TREERPO_COMFYUI": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(REPO / "scripts"), str(work), name],
                          capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), done.stdout


def template(name: str) -> dict:
    return json.loads((REPO / "workflows" / "api" / f"{name}.api.json").read_text())


def pngs(folder: Path, prefix: str) -> list[np.ndarray]:
    return [np.asarray(Image.open(p).convert("RGB")) for p in sorted(folder.glob(f"{prefix}_*.png"))]


def lora_keys(path: Path) -> list[str]:
    from safetensors.torch import load_file

    return list(load_file(path))


@pytest.fixture(scope="module")
def pick_run(tmp_path_factory) -> tuple[dict, str, Path]:
    work = tmp_path_factory.mktemp("flux_pick_fp8")
    out, stdout = run("flux_pick_fp8", work)
    return out, stdout, work


def test_the_first_run_samples_every_prompt_and_refuses_training_in_one_line(pick_run) -> None:
    out, _, work = pick_run
    sample = out["stages"]["sample"]
    assert list(sample["refused"]) == ["7"], sample  # the training node; the sampler and the rest ran
    (message,) = sample["refused"]["7"]
    assert message.startswith("picks_folder: there is no picks folder 'flux_taste' yet")
    assert "\n" not in message
    saved = template("flux_pick_fp8")["6"]["inputs"]
    trees = sorted((work / "output" / "treerpo_picks" / saved["picks_folder"] / "trees").iterdir())
    metas = [json.loads((t / "tree.json").read_text()) for t in trees]
    assert sorted(m["prompt"] for m in metas) == sorted(saved["prompts"].splitlines())  # one tree each
    leaves = saved["branching"] ** saved["depth"]
    for tree, meta in zip(trees, metas, strict=True):
        assert meta["model"]["kind"] == "comfymodelpolicy" and meta["model"]["name"] == "Flux", meta["model"]
        assert meta["leaves"] == leaves and meta["image_size"] == [32, 32], meta
        sampler = meta["sampler"]
        assert (sampler["steps"], sampler["noise_level"]) == (saved["steps"], saved["noise_level"])
        assert len(list(tree.glob("leaf_*.png"))) == leaves


def test_picks_made_through_the_store_train_a_lora_with_pickscore_as_features_and_guard(pick_run) -> None:
    out, stdout, work = pick_run
    folder = work / "output" / "treerpo_picks" / "flux_taste" / "trees"
    for tree in folder.iterdir():
        (saved,) = [json.loads(p.read_text()) for p in (tree / "picks").glob("*.json")]
        assert len(saved["liked"]) == 2 and len(saved["disliked"]) == 1, saved
    assert out["stages"]["pick"]["extra"]["trees"] == len(list(folder.iterdir())) == 5
    assert out["stages"]["train"]["refused"] == {}  # picked: the whole graph is valid now
    assert "personal reward (linear head on pickscore features): fitted on 5 labelled trees" in stdout
    # the guard measured the base and the checkpoints on PickScore, at a limit in units of its spread
    assert "guard: base taste" in stdout and "(closely)" in stdout
    assert stdout.count("guard: iteration") >= 1
    assert "guard: chose" in stdout or "guard: no checkpoint" in stdout
    keys = lora_keys(work / "output" / "loras" / "treerpo_flux_taste.safetensors")
    assert keys and all(k.startswith("diffusion_model.") for k in keys)  # ComfyUI's LoRA keys
    assert any(".img_attn.qkv." in k for k in keys) and any(".linear1." in k for k in keys)  # FLUX's targets


def test_the_backbone_weights_setting_is_read_under_the_models_folder_and_refused_in_one_line(
        pick_run) -> None:
    """``picks.backbone_weights=rewards/PickScore_v1`` in the settings box found the folder the guard's
    weights widget names (the run above trained with it); a missing folder, or one outside ComfyUI's model
    folders, is refused at validation in one line naming it."""
    out, _, work = pick_run
    missing, outside = out["backbone"]["rewards/NoSuchCLIP"], out["backbone"]["/etc"]
    assert missing == f"settings: picks.backbone_weights: weights of pickscore not found: " \
                      f"{work / 'models' / 'rewards' / 'NoSuchCLIP'}", missing
    assert outside.startswith("settings: picks.backbone_weights: weights path of reward 'pickscore' /etc is "
                              "outside ComfyUI's model folders"), outside
    assert "\n" not in missing + outside


def test_the_fp8_weights_stay_fp8_and_the_before_after_images_are_drawn(pick_run) -> None:
    out, _, work = pick_run
    assert out["flux_weights"] == ["torch.float8_e4m3fn"]  # UNETLoader's weight_dtype, kept through training
    for prefix in ("treerpo/flux_picks_before", "treerpo/flux_picks_after"):
        (image,) = pngs(work / "output", prefix)
        assert image.shape == (32, 32, 3) and image.std() > 0, prefix


def test_the_fp8_train_template_trains_and_samples_on_tiny_random_weights(tmp_path: Path) -> None:
    out, _ = run("flux_dev_train_fp8", tmp_path)
    assert list(out["stages"]) == ["files", "train", "compare"] and out["stages"]["train"]["refused"] == {}
    assert out["flux_weights"] == ["torch.float8_e4m3fn"]
    keys = lora_keys(tmp_path / "output" / "loras" / "treerpo_flux_dev_fp8.safetensors")
    assert keys and all(k.startswith("diffusion_model.") for k in keys)
    (history,) = pngs(tmp_path / "output", "treerpo/flux_fp8_train_history")
    (trained,) = pngs(tmp_path / "output", "treerpo/flux_fp8_trained")
    assert history.std() > 0 and trained.shape == (32, 32, 3)
