"""Build the tiny ImageReward fixture in ``tests/fixtures/imagereward_tiny/`` with the REFERENCE package.

Why: ``image-reward`` 1.5 cannot import on the project's transformers 5, so ``trainer.rewards.imagereward``
re-implements the model on transformers 5 classes. This script runs the reference code itself (in a
throwaway environment with the old stack) on a tiny random model saved in the official layout
(``ImageReward.pt``, ``med_config.json``, BERT ``vocab.txt``), and records the scores it gives, so the
project's test can check its own implementation against the reference without any network or real weights.

What is changed in the reference, and only for size: the ViT is the reference ``VisionTransformer`` built
with tiny sizes (instead of ViT-L), the BERT tokenizer loads a tiny ``vocab.txt`` written here (instead of
downloading bert-base-uncased; the reference's own ``init_tokenizer`` still adds ``[DEC]``/``[ENC]``), and
the reward head keeps the reference ``MLP`` layer layout (Linear, Dropout, ..., Linear) with small widths.
Everything else (preprocessing, tokenisation, BLIP text encoder, score normalisation, checkpoint loading via
``ImageReward.load``) is the reference package's code. Weights are random, rounded to float16 and stored as
float16 to keep the fixture small (the reference copies them into its float32 parameters exactly).

Environment used (Python 3.11, CPU, no network except the package registry)::

    python -m venv irref
    irref/bin/pip install torch==2.14.1 torchvision==0.29.1
    irref/bin/pip install setuptools wheel
    irref/bin/pip install --no-build-isolation image-reward==1.5 timm==0.6.13 fairscale==0.4.13 \
        transformers==4.44.2 diffusers==0.30.3 accelerate==0.34.2 "huggingface_hub<0.26" \
        openai-clip==1.0.1 datasets
    irref/bin/pip install setuptools==69.5.1   # openai-clip still imports pkg_resources.packaging
    HF_HUB_OFFLINE=1 irref/bin/python scripts/make_imagereward_fixture.py

(``openai-clip``, ``diffusers``, ``datasets`` are only needed because ``import ImageReward`` imports its
CLIP/aesthetic scorers and ReFL trainer; they play no part in the scores.)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "imagereward_tiny"
SEED = 1234
VISION = {"embed_dim": 64, "depth": 2, "mlp_ratio": 2.0}  # head_dim 64 as in BLIP's ViTs -> 1 head
TEXT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
HEAD_WIDTHS = (24, 16, 12, 8)  # the reference MLP has 1024, 128, 64, 16
PROMPTS = [
    "a red cat sitting on a blue mat",
    "A Photo of a DOG, running in the park!",
    "an astronaut riding a horse on the moon, highly detailed, digital art, trending on artstation, "
    "sharp focus, studio lighting, octane render, 8k, wallpaper, masterpiece, concept art by greg",
    "café crème — unknownword xyzzy",
]

WORDS = (
    "a an the on in of at by is red blue green cat cats dog dogs sitting running park photo mat "
    "astronaut riding horse moon highly detailed digital art trending sharp focus studio lighting "
    "octane render wallpaper master concept greg cafe creme 8 k"
).split()
PIECES = ["##s", "##piece", "##k", "##station", "##ing", "##er", "##ed", "##e", "##x", "##y", "##z"]
PUNCT = [",", ".", "!", "-", "—"]


def write_vocab(path: Path) -> int:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *PUNCT, *WORDS, *PIECES,
              "x", "y", "z", "un", "##know", "##n", "##word", "art", "##stat", "##ion"]
    seen: list[str] = []
    for t in tokens:
        if t not in seen:
            seen.append(t)
    path.write_text("\n".join(seen) + "\n", encoding="utf-8")
    return len(seen)


def write_med_config(path: Path, vocab_size: int) -> None:
    cfg = {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": TEXT["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": TEXT["intermediate_size"],
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 40,
        "model_type": "bert",
        "num_attention_heads": TEXT["num_attention_heads"],
        "num_hidden_layers": TEXT["num_hidden_layers"],
        "pad_token_id": 0,
        "type_vocab_size": 2,
        "vocab_size": vocab_size + 2,  # + [DEC] and [ENC], as the real 30522 + 2 = 30524
        "encoder_width": VISION["embed_dim"],
        "add_cross_attention": True,
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


def make_images() -> dict[str, np.ndarray]:
    """Smooth synthetic pictures (compress well as PNG); two at the native 224 px, one larger and
    non-square (down-scaling + centre crop), one smaller (up-scaling)."""
    def picture(h: int, w: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.zeros((h, w, 3), np.float32)
        for c in range(3):
            fy, fx, ph = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 2 * math.pi)
            img[..., c] = 0.5 + 0.35 * np.sin(2 * math.pi * (fy * yy / h + fx * xx / w) + ph)
        cy, cx, r = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w, rng.uniform(0.15, 0.3) * min(h, w)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        img[disc] = rng.uniform(0, 1, 3)
        return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)

    return {
        "img0_224.png": picture(224, 224, 1),
        "img1_224.png": picture(224, 224, 2),
        "img2_256x320.png": picture(256, 320, 3),
        "img3_180x150.png": picture(180, 150, 4),
    }


def randomise(model: torch.nn.Module) -> None:
    """Replace the reference init (near-zero head weights) with scales that make every part of the
    network move the score, then round to float16 so the saved file holds the exact values."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                new = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            elif name.endswith("bias"):
                new = 0.1 * torch.randn(p.shape, generator=g)
            elif p.dim() >= 2 and ("patch_embed" in name or "embed" not in name):
                fan_in = p[0].numel()
                new = torch.randn(p.shape, generator=g) * (1.5 / math.sqrt(fan_in))
            else:  # embeddings, cls token, position embeddings
                new = 0.5 * torch.randn(p.shape, generator=g)
            p.copy_(new.half().float())


def main() -> None:
    import ImageReward as RM

    ir_mod = sys.modules["ImageReward.ImageReward"]  # the package re-exports a class of the same name
    import ImageReward.models.BLIP.blip as blip_mod
    import ImageReward.models.BLIP.blip_pretrain as pre_mod
    import transformers
    from ImageReward.models.BLIP.vit import VisionTransformer

    torch.manual_seed(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    vocab_size = write_vocab(OUT / "vocab.txt")
    write_med_config(OUT / "med_config.json", vocab_size)

    class LocalBert:  # stands in for the hub download in the reference's init_tokenizer
        @staticmethod
        def from_pretrained(_name: str) -> transformers.BertTokenizer:
            return transformers.BertTokenizer(str(OUT / "vocab.txt"))

    def tiny_vit(vit: str, image_size: int, *args: object, **kwargs: object):
        v = VisionTransformer(img_size=image_size, patch_size=16, embed_dim=VISION["embed_dim"],
                              depth=VISION["depth"], num_heads=VISION["embed_dim"] // 64,
                              mlp_ratio=VISION["mlp_ratio"])
        return v, VISION["embed_dim"]

    class TinyMLP(ir_mod.MLP):  # the reference layer layout, small widths
        def __init__(self, input_size: int) -> None:
            torch.nn.Module.__init__(self)
            self.input_size = input_size
            a, b, c, d = HEAD_WIDTHS
            nn = torch.nn
            self.layers = nn.Sequential(
                nn.Linear(input_size, a), nn.Dropout(0.2), nn.Linear(a, b), nn.Dropout(0.2),
                nn.Linear(b, c), nn.Dropout(0.1), nn.Linear(c, d), nn.Linear(d, 1),
            )

    blip_mod.BertTokenizer = LocalBert
    pre_mod.create_vit = tiny_vit
    ir_mod.MLP = lambda _size: TinyMLP(TEXT["hidden_size"])

    model = ir_mod.ImageReward(med_config=str(OUT / "med_config.json"), device="cpu")
    randomise(model)
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    torch.save(state, OUT / "ImageReward.pt")

    # Score with a fresh model loaded through the reference's own loader.
    ref = RM.load(str(OUT / "ImageReward.pt"), device="cpu", med_config=str(OUT / "med_config.json"))
    ref.eval()
    images = make_images()
    for name, arr in images.items():
        Image.fromarray(arr).save(OUT / name, optimize=True)
    names = sorted(images)
    scores = []
    with torch.no_grad():
        for name in names:
            pil = Image.open(OUT / name)
            scores.append([float(ref.score(p, pil)) for p in PROMPTS])
    tok = ref.blip.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35)
    expected = {
        "about": "image-reward 1.5 ImageReward.score(prompt, PIL image) on this tiny random model",
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "timm": __import__("timm").__version__,
            "pillow": Image.__version__,
            "image-reward": "1.5",
        },
        "prompts": PROMPTS,
        "images": names,
        "scores": scores,  # scores[i][j]: image names[i] with PROMPTS[j]
        "input_ids": tok["input_ids"],
        "attention_mask": tok["attention_mask"],
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in OUT.iterdir())
    print(f"wrote {OUT} ({size / 1024:.0f} KiB)")
    for name, row in zip(names, scores, strict=True):
        print(name, " ".join(f"{s:+.5f}" for s in row))


if __name__ == "__main__":
    main()
