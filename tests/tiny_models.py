"""Tiny random models that tests write to folders, in the layouts real checkpoints have.

Nothing here is trained: the tests check plumbing (loading, keys, shapes, gradients, formats),
and a random model in the real layout exercises the same code as the real one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import CLIPConfig, CLIPModel


def write_small_bpe(folder: Path) -> int:
    """A byte-level BPE vocabulary: 256 byte symbols, the same ending a word, 3 merges, then the two
    special tokens last (as in OpenAI's vocabulary). Returns the vocabulary size."""
    from tokenizers.pre_tokenizers import ByteLevel

    chars = sorted(ByteLevel.alphabet())
    merges = [("e", "d</w>"), ("r", "ed</w>"), ("c", "i")]
    tokens = [*chars, *(c + "</w>" for c in chars), *("".join(m) for m in merges),
              "<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                       encoding="utf-8")
    return len(tokens)


def tiny_hf_clip(folder: Path, vocab: int, legacy_eos: bool, seed: int) -> CLIPModel:
    torch.manual_seed(seed)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, bos_token_id=vocab - 2,
                         eos_token_id=2 if legacy_eos else vocab - 1, pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16, logit_scale_init_value=4.0)
    model = CLIPModel(cfg).eval()
    model.save_pretrained(folder)
    return model


def tiny_clip_reward(folder: Path, seed: int = 1) -> Path:
    """A transformers CLIP folder the ``clip`` reward loads (its scores differ between images)."""
    tiny_hf_clip(folder, write_small_bpe(folder), legacy_eos=False, seed=seed)
    return folder


# ---------------------------------------------------------------- ComfyUI model files
# Written by ComfyUI's own classes (in a subprocess: importing ComfyUI sets up global state), in
# the layouts its loaders detect: UNETLoader (SD3 MMDiT, depth 2), CLIPLoader (CLIP-L, type sd3),
# VAELoader (the 16-channel SD3 autoencoder). Detection fixes the text encoder's and the VAE's
# sizes, so those two are full-size (random); the diffusion model is tiny.
_COMFY_FILES_SCRIPT = r'''
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import torch
from safetensors.torch import save_file
import comfy.options
comfy.options.enable_args_parsing(False)
import comfy.cli_args
comfy.cli_args.args.cpu = True
import comfy.sd1_clip, comfy.supported_models
from comfy.ldm.models.autoencoder import AutoencodingEngine

out = Path(sys.argv[2])
generator = torch.Generator().manual_seed(0)

def initialised(module, std):
    """ComfyUI's layers skip initialisation: give every weight a value (norms 1, biases 0)."""
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if not t.is_floating_point():
                continue
            if t.dim() == 1:
                t.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                t.copy_(torch.randn(t.shape, generator=generator) * std)
    return {k: v.to(torch.float16).contiguous() for k, v in module.state_dict().items()}

def save(state, folder, name):
    (out / folder).mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / folder / name))

unet = {"in_channels": 16, "out_channels": 16, "patch_size": 2, "depth": 2, "num_patches": 4096,
        "pos_embed_max_size": 64, "adm_in_channels": 2048, "pos_embed_scaling_factor": None,
        "qk_norm": None, "x_block_self_attn_layers": [], "input_size": None,
        "context_embedder_config": {"target": "torch.nn.Linear",
                                    "params": {"in_features": 4096, "out_features": 128}}}
model = comfy.supported_models.SD3(unet).get_model({}, device=torch.device("cpu"))
save(initialised(model.diffusion_model, 0.02), "diffusion_models", "tiny_sd3.safetensors")
clip = comfy.sd1_clip.SDClipModel(device="cpu", dtype=torch.float32)
save(initialised(clip.transformer, 0.02), "text_encoders", "clip_l_random.safetensors")
ddconfig = {"double_z": True, "z_channels": 16, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
            "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}
part = "comfy.ldm.modules.diffusionmodules.model."
regularizer = {"target": "comfy.ldm.models.autoencoder.DiagonalGaussianRegularizer"}
vae = AutoencodingEngine(regularizer_config=regularizer,
                         encoder_config={"target": part + "Encoder", "params": ddconfig},
                         decoder_config={"target": part + "Decoder", "params": ddconfig})
save(initialised(vae, 0.05), "vae", "sd3_vae_random.safetensors")
'''

SD3_FILES = {"unet": "tiny_sd3.safetensors", "clip": "clip_l_random.safetensors",
             "vae": "sd3_vae_random.safetensors"}


def write_comfy_sd3_files(comfyui: Path, models: Path) -> dict[str, str]:
    """Write the SD3 model, text encoder and VAE files under ``models`` (ComfyUI's models folder
    layout); returns their file names by loader."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _COMFY_FILES_SCRIPT, str(comfyui), str(models)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"writing the ComfyUI test models failed: {done.stderr[-2000:]}")
    return dict(SD3_FILES)


def squares(count: int, generator: torch.Generator, side: int = 64, sizes: tuple[int, int] = (6, 30)
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` dark ``side``-pixel pictures with one red square each, of a random size in ``sizes``
    (the upper end excluded) and a random place, and the sizes: a taste for size to learn."""
    images = torch.full((count, 3, side, side), 0.1)
    sizes = torch.randint(*sizes, (count,), generator=generator)
    for i, size in enumerate(sizes.tolist()):
        y, x = torch.randint(0, side - size, (2,), generator=generator).tolist()
        images[i, 0, y:y + size, x:x + size] = 0.9
    return images, sizes.float()

