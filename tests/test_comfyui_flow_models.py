"""Training a LoRA on an SD3 MODEL that ComfyUI's own loaders read (UNETLoader, CLIPLoader,
VAELoader), inside a real ComfyUI server: the trained MODEL, the saved files and ComfyUI's
LoraLoaderModelOnly agree, and the shared base model is given back untouched."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from comfyui_server import Server, require_comfyui, start_server, stop_server
from PIL import Image
from safetensors.torch import load_file

from tests.tiny_models import tiny_clip_reward, write_comfy_sd3_files

SETTINGS = "\n".join(["data.prompts_per_iteration=2", "tree.steps=4", "tree.depth=2", "lora.rank=4",
                      "lora.alpha=8.0", "optim.lr=0.05", "model.guidance=2.0"])
PROMPTS = "a red apple on a table\na blue car in the rain"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    root = require_comfyui()
    base = tmp_path_factory.mktemp("comfyui_sd3")
    write_comfy_sd3_files(root, base / "models")
    tiny_clip_reward(base / "models" / "rewards" / "tiny_clip")
    srv = start_server(root, base)
    yield srv
    stop_server(srv)


def sd3_graph(seed: int = 3, model: list | None = None) -> dict:
    """ComfyUI's loaders -> CLIPTextEncode -> KSampler (cfg 2, Euler, 4 steps) -> VAEDecode -> save."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "tiny_sd3.safetensors",
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader",
              "inputs": {"clip_name": "clip_l_random.safetensors", "type": "sd3"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "sd3_vae_random.safetensors"}},
        "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 2}},
        "5": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["2", 0], "text": "a red apple on a table"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["2", 0], "text": ""}},
        "7": {"class_type": "KSampler", "inputs": {
            "model": model or ["1", 0], "positive": ["5", 0], "negative": ["6", 0], "latent_image": ["4", 0],
            "seed": seed, "steps": 4, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["3", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "sd3"}},
    }


def train_graph(iterations: int = 2, fmt: str = "comfyui", prefix: str = "loras/sd3_trained") -> dict:
    graph = sd3_graph()
    graph["10"] = {"class_type": "TreeRPOTrainLoRA", "inputs": {
        "model": ["1", 0], "clip": ["2", 0], "vae": ["3", 0], "latent": ["4", 0], "iterations": iterations,
        "prompts": PROMPTS, "reward": "clip", "reward_mix": "", "reward_weights": "clip=rewards/tiny_clip",
        "strategy": "dynamic_treerpo", "seed": 0, "settings": SETTINGS}}
    graph["11"] = {"class_type": "TreeRPOSaveLoRA",
                   "inputs": {"run": ["10", 2], "filename_prefix": prefix, "format": fmt}}
    graph["7"]["inputs"]["model"] = ["10", 0]
    return graph


def images(server: Server, result: dict) -> np.ndarray:
    assert result["status"]["status_str"] == "success", result["status"]
    files = result["outputs"]["9"]["images"]
    return np.stack([np.asarray(Image.open(server.base / "output" / f["subfolder"] / f["filename"]),
                                dtype=np.int16) for f in files])


def test_lora_trained_on_comfyuis_sd3_model_reloads_with_lora_loader_model_only(server: Server) -> None:
    base = images(server, server.run(sd3_graph()))
    trained = images(server, server.run(train_graph(), timeout=600))
    assert np.abs(trained - base).max() > 0  # training changed what the MODEL samples

    state = load_file(server.base / "output" / "loras" / "sd3_trained.safetensors")
    ups = [k for k in state if k.endswith("lora_up.weight")]
    assert ups and all(k.startswith("diffusion_model.joint_blocks.") for k in ups)
    assert max(float(state[k].abs().max()) for k in ups) > 0  # the LoRA learned something
    server.run(train_graph(fmt="kohya", prefix="loras/sd3_trained_kohya"), timeout=600)  # same run, cached
    kohya = load_file(server.base / "output" / "loras" / "sd3_trained_kohya.safetensors")
    assert kohya and all(k.startswith("lora_unet_joint_blocks_") for k in kohya)
    server.run(train_graph(fmt="diffusers", prefix="loras/sd3_trained_diffusers"), timeout=600)
    diffusers = load_file(server.base / "output" / "loras" / "sd3_trained_diffusers.safetensors")
    assert diffusers and all(k.startswith("transformer.transformer_blocks.") for k in diffusers)
    assert any(".attn.to_q.lora_A" in k for k in diffusers)  # fused qkv split into diffusers' q, k, v

    # ComfyUI's own loader applies either file to the base MODEL: the trained MODEL's images come
    # back, which also shows the shared base model was left without our LoRA layers
    (server.base / "models" / "loras").mkdir(parents=True, exist_ok=True)
    for name in ("sd3_trained.safetensors", "sd3_trained_kohya.safetensors"):
        saved = server.base / "output" / "loras" / name
        (server.base / "models" / "loras" / name).write_bytes(saved.read_bytes())
        graph = sd3_graph(model=["20", 0])
        graph["20"] = {"class_type": "LoraLoaderModelOnly",
                       "inputs": {"model": ["1", 0], "lora_name": name, "strength_model": 1.0}}
        graph["9"]["inputs"]["filename_prefix"] = name
        reloaded = images(server, server.run(graph))
        diff = np.abs(reloaded - trained)
        assert diff.max() <= 1 and diff.mean() < 0.05, (name, diff.max(), diff.mean())
    assert "lora key not loaded" not in server.log_text()


def test_training_sd3_without_its_vae_fails_with_one_line(server: Server) -> None:
    graph = train_graph(prefix="loras/never")
    del graph["10"]["inputs"]["vae"]
    result = server.run(graph)
    assert result["status"]["status_str"] == "error"
    messages = [m for kind, m in result["status"]["messages"] if kind == "execution_error"]
    assert messages and "needs its clip and vae inputs connected" in messages[0]["exception_message"]
    assert server.get("/system_stats")  # still serving


def test_two_chained_steps_train_the_same_lora_as_one_and_the_trained_model_cannot_continue(
        server: Server) -> None:
    """Step 1 (1 iteration) -> step 2 (1 more, ``previous``) on the base MODEL saves the LoRA that one
    2-iteration step saves; continuing from the MODEL that already carries the LoRA is refused."""
    one = train_graph(prefix="loras/sd3_one_step")
    server.run(one, timeout=600)
    chained = train_graph(iterations=1, prefix="loras/sd3_two_steps")
    chained["30"] = dict(chained["10"], inputs=dict(chained["10"]["inputs"], previous=["10", 2]))
    chained["11"]["inputs"]["run"] = ["30", 2]
    chained["7"]["inputs"]["model"] = ["30", 0]
    result = server.run(chained, timeout=600)
    assert result["status"]["status_str"] == "success", result["status"]
    a = load_file(server.base / "output" / "loras" / "sd3_one_step.safetensors")
    b = load_file(server.base / "output" / "loras" / "sd3_two_steps.safetensors")
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6

    chained["30"]["inputs"]["model"] = ["10", 0]  # the MODEL with step 1's LoRA applied
    result = server.run(chained)
    assert result["status"]["status_str"] == "error"
    messages = [m for kind, m in result["status"]["messages"] if kind == "execution_error"]
    assert "connect the base MODEL" in messages[0]["exception_message"]


def test_unetloaders_fp8_weights_train_the_lora_of_their_upcast_values(server: Server) -> None:
    """UNETLoader with weight_dtype fp8_e4m3fn keeps SD3's weights in float8 (ComfyUI casts each layer as it
    runs): the LoRA trained over them equals, to 1e-4 of its largest entry, the one trained over a file
    holding the same values in float16 and loaded as they are."""
    import torch
    from safetensors.torch import save_file

    folder = server.base / "models" / "diffusion_models"
    state = load_file(folder / "tiny_sd3.safetensors")
    rounded = {k: v.to(torch.float8_e4m3fn).to(v.dtype) if v.is_floating_point() else v
               for k, v in state.items()}
    assert any(not torch.equal(rounded[k], state[k]) for k in state)  # fp8 does change the values
    save_file(rounded, str(folder / "tiny_sd3_fp8_values.safetensors"))

    fp8 = train_graph(prefix="loras/sd3_fp8")
    fp8["1"]["inputs"]["weight_dtype"] = "fp8_e4m3fn"
    upcast = train_graph(prefix="loras/sd3_fp8_values")
    upcast["1"]["inputs"]["unet_name"] = "tiny_sd3_fp8_values.safetensors"
    for graph in (fp8, upcast):
        result = server.run(graph, timeout=600)
        assert result["status"]["status_str"] == "success", result["status"]
    assert "model weight dtype torch.float8_e4m3fn" in server.log_text()  # stored as fp8, cast per layer
    a = load_file(server.base / "output" / "loras" / "sd3_fp8.safetensors")
    b = load_file(server.base / "output" / "loras" / "sd3_fp8_values.safetensors")
    assert a.keys() == b.keys() and all(v.dtype == torch.float32 for k, v in a.items() if "lora_" in k)
    scale = max(float(v.abs().max()) for k, v in b.items() if "lora_up" in k)
    assert scale > 0
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-4 * scale
