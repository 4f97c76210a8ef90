"""The embedded model's image encoder: a small CNN from a 64x64 picture to a unit-norm embedding.

Why: real models give the personal reward a CLIP image embedding to fit a taste on; the embedded model's
scenes had only hand-made pixel statistics. This tower is trained CLIP-style against the scene
grammar's captions (``image_encoder.py`` reproduces it), so its embedding says what is drawn, how many,
in which colour and where, and reads the embedded model's own blurry drawings as their clean scenes.

Layout: the picture in ``[-1, 1]`` with two coordinate channels (so where an object is survives the
convolutions), a stride-2 stem to 32x32, then stages at 16x16, 8x8 and 4x4 (3x3 convolutions, group
norm, GELU, a residual convolution at 16x16 and 8x8), a 1x1 reduction and a linear map of the flattened
4x4 map: a flattened map keeps place, where global pooling would forget it. Plain torch, no randomness at
inference, loaded once per process from ``weights/image_encoder`` (``shipped_image_tower``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..utils.atomic import atomic_save_safetensors, atomic_write_text
from .scenes import IMAGE_SIZE

ENCODER_DIR = Path(__file__).resolve().parent / "weights" / "image_encoder"
FORMAT = "dynamic-treerpo-embedded-image-encoder"
IMAGE_FILE = "image_tower.safetensors"
TEXT_FILE = "text_tower.safetensors"
CONFIG_FILE = "config.json"
BATCH = 128  # images per forward when embedding many: fast on one CPU thread, small in memory


@dataclass(frozen=True)
class TowerSpec:
    """The image tower's shape (saved as ``config.json`` beside its weights)."""

    widths: tuple[int, int, int, int] = (24, 48, 96, 128)
    reduced: int = 32  # channels of the 4x4 map before it is flattened
    dim: int = 128  # embedding size
    groups: int = 8
    principal: int = 8  # main axes of the embedding over the model's drawings (``principal_coordinates``)
    text: dict[str, int] = field(default_factory=dict)  # the text tower's shape


def _conv(cin: int, cout: int, stride: int, groups: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.GroupNorm(groups, cout), nn.GELU())


class ImageTower(nn.Module):
    """``[B, 3, 64, 64]`` in ``[0, 1]`` -> ``[B, dim]`` unit-norm embeddings."""

    def __init__(self, spec: TowerSpec = TowerSpec()) -> None:
        super().__init__()
        a, b, c, d = spec.widths
        g = spec.groups
        self.spec = spec
        self.stem = _conv(5, a, 2, g)  # 64 -> 32
        self.down16, self.res16 = _conv(a, b, 2, g), _conv(b, b, 1, g)
        self.down8, self.res8 = _conv(b, c, 2, g), _conv(c, c, 1, g)
        self.down4 = _conv(c, d, 2, g)
        self.reduce = nn.Conv2d(d, spec.reduced, 1)
        side = IMAGE_SIZE // 16
        self.project = nn.Linear(spec.reduced * side * side, spec.dim)
        axis = (torch.arange(IMAGE_SIZE, dtype=torch.float32) + 0.5) / IMAGE_SIZE * 2.0 - 1.0
        coords = torch.stack([axis.view(-1, 1).expand(IMAGE_SIZE, IMAGE_SIZE),
                              axis.view(1, -1).expand(IMAGE_SIZE, IMAGE_SIZE)])
        self.register_buffer("coords", coords, persistent=False)
        self.register_buffer("principal_mean", torch.zeros(spec.dim))
        self.register_buffer("principal_axes", torch.zeros(spec.principal, spec.dim))

    def forward(self, images: Tensor) -> Tensor:
        if tuple(images.shape[1:]) != (3, IMAGE_SIZE, IMAGE_SIZE):
            raise ValueError(f"the embedded image encoder reads [B, 3, {IMAGE_SIZE}, {IMAGE_SIZE}] pictures, "
                             f"got {list(images.shape)}")
        x = images.float().clamp(0.0, 1.0) * 2.0 - 1.0
        x = torch.cat([x, self.coords.expand(x.shape[0], -1, -1, -1)], dim=1)
        x = self.down16(self.stem(x))
        x = x + self.res16(x)
        x = self.down8(x)
        x = x + self.res8(x)
        x = self.reduce(self.down4(x))
        return F.normalize(self.project(x.flatten(1)), dim=-1)


    @torch.no_grad()
    def set_principal_axes(self, embeddings: Tensor) -> None:
        """Fix ``principal_coordinates`` on ``embeddings`` (the embedded model's drawings): their mean and
        main axes, each scaled to unit spread and signed so that its largest entry is positive."""
        e = embeddings.double()
        mean = e.mean(dim=0)
        _, singular, vh = torch.linalg.svd(e - mean, full_matrices=False)
        axes = vh[: self.spec.principal]
        axes = axes * torch.sign(axes.gather(1, axes.abs().argmax(dim=1, keepdim=True)))
        scale = singular[: self.spec.principal] / (e.shape[0] - 1) ** 0.5
        self.principal_mean.copy_(mean.float())
        self.principal_axes.copy_((axes / scale.view(-1, 1)).float())

    def principal_coordinates(self, embeddings: Tensor) -> Tensor:
        """``[B, dim]`` -> ``[B, principal]``: the embedding along its main axes on the model's drawings.
        Why: a few fixed, decorrelated summaries of what is drawn, which a linear head can keep as they
        are beside the directions it finds among many pixel features (``rewards/scene_clip.py``)."""
        return (embeddings.float() - self.principal_mean) @ self.principal_axes.T


def save_towers(folder: Path, image: ImageTower, text: nn.Module | None = None) -> None:
    """Write ``config.json`` and the towers' safetensors (the text tower only serves retrieval checks)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "version": 1, "image_size": IMAGE_SIZE, **asdict(image.spec)}
    if text is not None:
        config["text"] = dict(text.shape)
    atomic_save_safetensors(image.state_dict(), folder / IMAGE_FILE)
    if text is not None:
        atomic_save_safetensors(text.state_dict(), folder / TEXT_FILE)
    atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True) + "\n")


def read_spec(folder: Path) -> TowerSpec:
    """The tower spec of ``folder``'s ``config.json``; a one-line error when it is missing or foreign."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"embedded image encoder missing: {path} (rebuild it with "
                                "`python -m dynamic_treerpo.trainer.embedded.image_encoder --out FOLDER`)")
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not an embedded image encoder (format {data.get('format')!r})")
    return TowerSpec(tuple(data["widths"]), data["reduced"], data["dim"], data["groups"], data["principal"],
                     data.get("text", {}))


def load_image_tower(folder: str | Path | None = None) -> ImageTower:
    """The image tower saved in ``folder`` (default: the shipped one), in eval mode, frozen."""
    from safetensors.torch import load_file

    root = Path(folder) if folder is not None else ENCODER_DIR
    tower = ImageTower(read_spec(root))
    tower.load_state_dict(load_file(str(root / IMAGE_FILE)))
    return tower.eval().requires_grad_(False)


@lru_cache(maxsize=1)
def shipped_image_tower() -> ImageTower:
    """The shipped tower, loaded once per process (every personal reward of a run shares it)."""
    return load_image_tower()


@torch.no_grad()
def embed_images(images: Tensor, tower: ImageTower | None = None, batch: int = BATCH) -> Tensor:
    """``[B, 3, 64, 64]`` in ``[0, 1]`` -> ``[B, dim]`` float32 on the CPU, ``batch`` images per forward."""
    tower = tower if tower is not None else shipped_image_tower()
    images = images.float().cpu()
    if images.shape[0] == 0:
        return torch.zeros(0, tower.spec.dim)
    return torch.cat([tower(images[i:i + batch]) for i in range(0, images.shape[0], batch)])
