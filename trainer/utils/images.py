"""Reading image files as the tensors the rewards take: one loader for every place that reads images
(``treerpo score``'s folders, a picks folder's leaves)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor


def load_images(files: Sequence[Path]) -> Tensor:
    """``[B, 3, H, W]`` RGB in ``[0, 1]``; every image must have the first one's size."""
    arrays, size = [], None
    for file in files:
        try:
            with Image.open(file) as img:
                rgb = img.convert("RGB")
        except (UnidentifiedImageError, OSError) as err:
            raise ValueError(f"{file} is not a readable image ({err})") from None
        if size is None:
            size = rgb.size
        elif rgb.size != size:
            raise ValueError(f"{file} is {rgb.size[0]}x{rgb.size[1]}, the first image "
                             f"{size[0]}x{size[1]}: score images of one size at a time")
        arrays.append(np.asarray(rgb, dtype=np.float32) / 255.0)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
