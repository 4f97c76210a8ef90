"""A ComfyUI MODEL (FLUX or SD3 from ComfyUI's own loaders) as the trainer's policy.

The trainer needs four things of a model (``trainer.policy.Policy``); here they come from
ComfyUI's objects: prompts through the CLIP (as CLIPTextEncode), velocities through the MODEL's
``apply_model`` (``v = (x - denoised) / sigma``, what a rectified-flow model's denoised output
means), images through the VAE (as VAEDecode). Latents live in the model's space (after
``process_latent_in``), where the noise is standard normal.

The diffusion model is shared with every other node that received the MODEL, so training changes
it only for the duration of a step (:meth:`ComfyModelPolicy.training`): the LoRA layers and block
checkpointing come off again, and the trained LoRA leaves as ComfyUI weight patches. ComfyUI's
blocks add into activations in place, which autograd cannot differentiate: training runs them
under ``trainer.autograd_safe.out_of_place_updates``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from ..trainer.lora.adapters import detach_lora
from ..trainer.models.autograd_safe import out_of_place_updates
from ..trainer.models.block_checkpoint import checkpointed_blocks
from ..trainer.models.policy import PolicyBase
from ._comfy import decode_images, denoise, flow_family, load_for_training, prompt_model_conds

DEFAULT_GUIDANCE = {"flux": 3.5, "sd3": 4.5}  # FLUX's guidance embedding; SD3's CFG scale
LORA_TARGETS = {  # the attention and MLP projections, in ComfyUI's (the original) module names
    "flux": ("img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj", "img_mlp.0", "img_mlp.2",
             "txt_mlp.0", "txt_mlp.2", "linear1", "linear2"),
    "sd3": ("attn.qkv", "attn.proj", "attn2.qkv", "attn2.proj", "mlp.fc1", "mlp.fc2"),
}
SAMPLING = {"flux": ("flux", None), "sd3": ("shift", 3.0)}  # schedule and shift as ComfyUI samples them


def _plain_tensors(module: nn.Module) -> None:
    """ComfyUI loads models inside ``torch.inference_mode``; autograd cannot save such tensors for
    backward, so each is replaced by an ordinary copy (same values)."""
    with torch.inference_mode(False):
        for sub in module.modules():
            for name, param in list(sub._parameters.items()):
                if param is not None and param.is_inference():
                    sub._parameters[name] = nn.Parameter(param.clone(), requires_grad=param.requires_grad)
            for name, buffer in list(sub._buffers.items()):
                if buffer is not None and buffer.is_inference():
                    sub._buffers[name] = buffer.clone()


class ComfyModelPolicy(PolicyBase):
    """FLUX (guidance embedding) or SD3 (classifier-free guidance, two forwards per row)."""

    def __init__(self, model: Any, clip: Any, vae: Any, latent_shape: Sequence[int],
                 guidance: float | None = None, negative_prompt: str = "") -> None:
        self.family = flow_family(model)
        self.model, self.clip, self.vae = model, clip, vae
        self.latent_shape = tuple(int(n) for n in latent_shape)
        if len(self.latent_shape) != 3 or self.latent_shape[1] % 2 or self.latent_shape[2] % 2:
            raise ValueError(f"the latent is {'x'.join(map(str, self.latent_shape))}: {self.family.upper()} "
                             "takes channels x height x width with even sides (images a multiple of 16 px)")
        scale = DEFAULT_GUIDANCE[self.family] if guidance is None else float(guidance)
        self.guidance = scale if self.family == "flux" else None
        self.cfg = 1.0 if self.family == "flux" else scale
        self.forwards_per_row = 1 if self.cfg == 1.0 else 2
        self.image_tokens = self.latent_shape[1] * self.latent_shape[2] // 4  # 2x2 patches
        self.device = load_for_training(model)
        self.transformer: nn.Module = model.model.diffusion_model
        _plain_tensors(self.transformer)
        self._conds: list[dict[str, Any]] = []
        self._ids: dict[str, int] = {}
        self._negative = self._prompt_id(negative_prompt) if self.cfg != 1.0 else None

    # ------------------------------------------------------------------ Policy
    def _prompt_id(self, text: str) -> int:
        if text not in self._ids:
            self._ids[text] = len(self._conds)
            conds = prompt_model_conds(self.model, self.clip, text, self.latent_shape, self.guidance)
            self._conds.append(conds)
        return self._ids[text]

    def encode(self, prompts: Sequence[str]) -> dict[str, Tensor]:
        """Rows of prompt ids; the encoded conditioning stays cached here (it is not a tensor)."""
        return {"prompt": torch.tensor([self._prompt_id(p) for p in prompts], dtype=torch.long)}

    def _conditioned(self, x: Tensor, sigma: Tensor, ids: Tensor) -> Tensor:
        """Velocities of rows that may belong to several prompts: one model call per prompt."""
        order = torch.argsort(ids, stable=True)
        pieces = []
        for pid in ids[order].unique_consecutive():
            rows = order[ids[order] == pid].to(x.device)
            xr, sr = x.index_select(0, rows), sigma.index_select(0, rows)
            denoised = denoise(self.model, xr, sr, self._conds[int(pid)])
            pieces.append((xr - denoised.float()) / sr.reshape(-1, *([1] * (x.dim() - 1))))
        return torch.cat(pieces).index_select(0, torch.argsort(order).to(x.device))

    def velocity(self, x: Tensor, sigma: Tensor, cond: dict[str, Tensor]) -> Tensor:
        x = x.float().to(self.device)
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=self.device).reshape(-1).expand(x.shape[0])
        v = self._conditioned(x, sigma, cond["prompt"])
        if self._negative is None:
            return v
        v_neg = self._conditioned(x, sigma, torch.full_like(cond["prompt"], self._negative))
        return v_neg + self.cfg * (v - v_neg)

    def decode(self, latents: Tensor) -> Tensor:
        return decode_images(self.model, self.vae, latents.to(self.device))

    def trainable_parameters(self) -> Iterable[nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]

    def train(self, mode: bool = True) -> ComfyModelPolicy:
        self.transformer.train(mode)
        return self

    def eval(self) -> ComfyModelPolicy:
        return self.train(False)

    # ------------------------------------------------------------------ the shared model
    @contextmanager
    def training(self, checkpointing: bool = False) -> Iterator[ComfyModelPolicy]:
        """While training: augmented assignments autograd can differentiate (ComfyUI's blocks add
        in place), and block checkpointing if asked. On exit (also on error) the shared diffusion
        model is given back as it came: LoRA layers removed, blocks restored, frozen, in eval mode."""
        blocks = checkpointed_blocks(self.transformer) if checkpointing else nullcontext()
        try:
            with out_of_place_updates(), blocks:
                yield self
        finally:
            detach_lora(self.transformer)
            self.transformer.requires_grad_(False)
            self.transformer.eval()
