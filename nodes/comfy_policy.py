"""A ComfyUI MODEL (any rectified-flow image model from ComfyUI's own loaders) as the trainer's policy.

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

Nothing here is written per family: the conditioning goes through the model's own ``extra_conds``
(as KSampler does), guidance is the model's guidance embedding when it has one and classifier-free
guidance otherwise, and the LoRA targets are the Linear layers of the model's transformer blocks.
The only per-family data are defaults: the CFG scale of each family's reference workflow, and the
attention/MLP target lists of FLUX and SD3, kept so that their LoRAs match the headless trainer's.
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
from .comfy_door import FlowFamily, decode_images, denoise, flow_family, load_for_training, prompt_model_conds

# The CFG scale of each family's reference workflow (ComfyUI's templates, the model cards); a model
# with a guidance embedding samples at CFG 1 with ComfyUI's own default guidance value.
DEFAULT_CFG = {"Flux": 1.0, "FluxSchnell": 1.0, "Flux2": 1.0, "Chroma": 4.0, "SD3": 4.5, "QwenImage": 2.5,
               "Lumina2": 4.0, "ZImage": 1.0, "HiDream": 5.0, "AuraFlow": 3.5, "HunyuanImage21": 3.5}
FALLBACK_CFG = 4.0
LORA_TARGETS = {  # FLUX's and SD3's attention and MLP projections (the headless trainer's targets)
    "flux": ("img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj", "img_mlp.0", "img_mlp.2",
             "txt_mlp.0", "txt_mlp.2", "linear1", "linear2"),
    "sd3": ("attn.qkv", "attn.proj", "attn2.qkv", "attn2.proj", "mlp.fc1", "mlp.fc2"),
}
CURATED = {"Flux": "flux", "FluxSchnell": "flux", "SD3": "sd3"}  # their LoRAs also export to diffusers


def _blocks(transformer: nn.Module) -> list[tuple[str, nn.Module]]:
    """The transformer blocks: items of the model's top-level ModuleLists that hold two Linear layers or
    more (attention and MLP), as ``("double_blocks.3", block)``; lists of single projections (HiDream's
    caption projections) are not blocks."""
    out = []
    for list_name, items in transformer.named_children():
        if isinstance(items, nn.ModuleList):
            for index, block in enumerate(items):
                if sum(isinstance(m, nn.Linear) for m in block.modules()) >= 2:
                    out.append((f"{list_name}.{index}", block))
    return out


def block_linear_names(blocks: list[tuple[str, nn.Module]]) -> list[str]:
    """Every Linear layer inside the blocks (:func:`_blocks`), named relative to its block (as
    ``img_attn.qkv``), in order: ComfyUI's own LoRA training node adapts every weight layer; the blocks'
    Linears are where LoRAs are trained."""
    names: list[str] = []
    for _, block in blocks:
        for name, module in block.named_modules():
            if isinstance(module, nn.Linear) and name and name not in names:
                names.append(name)
    return names


def lora_targets(transformer: nn.Module, family: str) -> tuple[str, ...]:
    """The default LoRA targets of a MODEL: FLUX's and SD3's usual projections, else every Linear of
    the blocks. peft matches a target as a name suffix, so a block-relative name that also ends a
    module outside the blocks (Lumina2's final ``adaLN_modulation.1``, Z-Image's SiLU
    ``adaLN_modulation.0``) is given as full names instead."""
    if family in CURATED:
        return LORA_TARGETS[CURATED[family]]
    blocks = _blocks(transformer)
    names = block_linear_names(blocks)
    if not names:
        raise ValueError(f"{family}: no Linear layer inside the model's blocks to train a LoRA on")
    inside = {f"{prefix}.{name}" for prefix, block in blocks
              for name, m in block.named_modules() if isinstance(m, nn.Linear) and name}
    outside = [full for full, _ in transformer.named_modules() if full and full not in inside]  # any kind
    clash = {n for n in names for full in outside if full == n or full.endswith("." + n)}
    full_names = sorted((f for f in inside if f.split(".", 2)[2] in clash),
                        key=lambda f: [int(p) if p.isdigit() else p for p in f.split(".")])
    return (*[n for n in names if n not in clash], *full_names)


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
    """A rectified-flow MODEL: a guidance embedding (one forward per row) or classifier-free guidance
    (two forwards per row, the negative prompt empty as in ComfyUI's templates; none at CFG 1).

    ``guidance``: the guidance embedding's value when the model has one (None: ComfyUI's own default,
    as a bare CLIPTextEncode gives), else the CFG scale (None: the family's :data:`DEFAULT_CFG`)."""

    def __init__(self, model: Any, clip: Any, vae: Any, latent_shape: Sequence[int],
                 guidance: float | None = None, negative_prompt: str = "", family: FlowFamily | None = None
                 ) -> None:
        self.info: FlowFamily = family or flow_family(model)  # given when the caller has read it already
        self.family = self.info.name
        self.model, self.clip, self.vae = model, clip, vae
        self.latent_shape = tuple(int(n) for n in latent_shape)
        p = self.info.patch  # (C, H, W), or (C, 1, H, W) for a family that samples one-frame videos (Qwen)
        shape_ok = len(self.latent_shape) == 3 or (len(self.latent_shape) == 4 and self.latent_shape[1] == 1)
        if not shape_ok or self.latent_shape[-2] % p or self.latent_shape[-1] % p:
            raise ValueError(f"the latent is {'x'.join(map(str, self.latent_shape))}: {self.family} takes "
                             f"channels x height x width with sides a multiple of {p}")
        if self.info.guidance_embedding:
            self.guidance, self.cfg = guidance, 1.0
        else:
            self.guidance = None
            self.cfg = DEFAULT_CFG.get(self.family, FALLBACK_CFG) if guidance is None else float(guidance)
        self.forwards_per_row = 1 if self.cfg == 1.0 else 2
        self.image_tokens = self.latent_shape[-2] * self.latent_shape[-1] // (p * p)
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
