"""Nodes that load and run the embedded default model in ComfyUI.

ComfyUI's own loaders cannot read it: it is a pixel-space, clean-image-predicting transformer
with its own small text encoder, none of which ComfyUI's model detection knows. These nodes
wrap the same ``EmbeddedPolicy`` the trainer uses; sampling then goes through ComfyUI's own
samplers (``KSampler``, ``SamplerCustomAdvanced``) and LoRAs through ``LoraLoaderModelOnly``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..trainer.embedded.policy import EmbeddedPolicy
from .comfy_door import embedded_model_patcher, io, model_roots, models_directory
from .inputs import check_embedded_text, confined

EmbeddedType = io.Custom("TREERPO_EMBEDDED")
CATEGORY = "TreeRPO/embedded"


def _schema(node_id: str, display_name: str, inputs: list, outputs: list, **extra: Any) -> io.Schema:
    """The schema of one node of this family (category and naming shared)."""
    return io.Schema(node_id=node_id, display_name=display_name, category=CATEGORY, inputs=inputs,
                     outputs=outputs, **extra)


def embedded_folder(weights: str) -> str:
    """The folder of embedded weights named by the widget: under ComfyUI's models folder when relative,
    inside its model folders, and holding a saved model (checked before anything runs)."""
    path = confined(Path(models_directory()) / weights.strip(), model_roots(), "embedded model folder")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"embedded model folder {weights.strip()!r} not found (looked at {path})")
    if not (Path(path) / "embedded.json").is_file():
        raise FileNotFoundError(f"{path} holds no saved embedded model (no embedded.json): write one with "
                                "EmbeddedPolicy.save_pretrained, or leave weights empty for the shipped one")
    return path


def embedded_conditioning(embedded: Any, text: str) -> list:
    """CONDITIONING of ``text`` by the embedded model's own text encoder (tokens and pooled vector)."""
    cond = embedded.encode([text.strip()])
    return [[cond["text"], {"pooled_output": cond["pooled"]}]]


class TreeRPOEmbeddedLoader(io.ComfyNode):
    """Load the embedded default (the weights shipped with the pack, or a folder of the same form)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return _schema(
            "TreeRPOEmbeddedLoader", "TreeRPO Embedded Model Loader",
            [io.String.Input("weights", display_name="weights folder (empty: built-in model)", default="",
                             placeholder="empty: the built-in model shipped with the pack",
                             tooltip="leave empty for the built-in model shipped with the pack; or name "
                                     "a folder of the same kind (written by its save_pretrained) under "
                                     "ComfyUI's models folder"),
             io.Float.Input("shift", display_name="noise schedule shift", default=3.0, min=1.0, max=10.0,
                            step=0.1,
                            tooltip="how the steps are spread over the noise levels (sigma shift); keep the "
                                    "3.0 it was trained with")],
            [io.Model.Output(), EmbeddedType.Output(display_name="embedded",
                                                    tooltip="its text encoder and decoder, for the other "
                                                            "TreeRPO Embedded nodes")],
            description="Loads the pack's small built-in model, which draws 64x64 pictures of coloured "
                        "shapes ('two red circles', 'a blue square on the left'). It runs on a CPU in "
                        "seconds: try sampling and training here before moving to a big model. The MODEL "
                        "works with ComfyUI's own samplers and LoRA loader.")

    @classmethod
    def validate_inputs(cls, weights: str) -> bool | str:
        if not weights.strip():
            return True
        try:
            embedded_folder(weights)
        except (ValueError, FileNotFoundError) as err:
            return str(err)  # ComfyUI prefixes the input's name
        return True

    @classmethod
    def execute(cls, weights: str, shift: float) -> io.NodeOutput:
        folder = embedded_folder(weights) if weights.strip() else None
        policy = EmbeddedPolicy.from_pretrained(folder)
        return io.NodeOutput(embedded_model_patcher(policy, shift), policy)


class TreeRPOEmbeddedTextEncode(io.ComfyNode):
    """Encode a prompt with the embedded model's own text encoder."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return _schema("TreeRPOEmbeddedTextEncode", "TreeRPO Embedded Text Encode",
                       [EmbeddedType.Input("embedded", display_name="embedded model",
                                           tooltip="the embedded output of TreeRPO Embedded Model Loader"),
                        io.String.Input("text", display_name="prompt", multiline=True,
                                        default="two red circles",
                                        tooltip="a scene in the model's words, e.g. 'a red circle on "
                                                "the left and a blue square on the right'")],
                       [io.Conditioning.Output()],
                       description="Turns a prompt into conditioning for the built-in model (its own text "
                                   "encoder). It knows only the words of its scenes: shapes, colours, places "
                                   "and 'two'; other words are refused before anything runs, with the list.")

    @classmethod
    def validate_inputs(cls, text: str) -> bool | str:
        try:
            check_embedded_text(text, "text")
        except ValueError as err:
            return str(err).removeprefix("text: ")  # ComfyUI prefixes the input's name
        return True

    @classmethod
    def execute(cls, embedded: Any, text: str) -> io.NodeOutput:
        return io.NodeOutput(embedded_conditioning(embedded, text))


class TreeRPOEmbeddedEmptyLatent(io.ComfyNode):
    """An empty latent of the embedded model's shape (48 x 16 x 16 for 64 x 64 RGB)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return _schema("TreeRPOEmbeddedEmptyLatent", "TreeRPO Embedded Empty Latent",
                       [EmbeddedType.Input("embedded", display_name="embedded model",
                                           tooltip="the embedded output of TreeRPO Embedded Model Loader"),
                        io.Int.Input("batch_size", display_name="images", default=1, min=1, max=4096,
                                     tooltip="how many images (batch size)")],
                       [io.Latent.Output()],
                       description="An empty starting image of the built-in model's size (64x64 pixels, "
                                   "stored as 48 x 16 x 16) for ComfyUI's samplers.")

    @classmethod
    def execute(cls, embedded: Any, batch_size: int) -> io.NodeOutput:
        return io.NodeOutput({"samples": torch.zeros(batch_size, *embedded.latent_shape)})


class TreeRPOEmbeddedDecode(io.ComfyNode):
    """Latent to IMAGE (the model works in folded pixel space: no VAE)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return _schema("TreeRPOEmbeddedDecode", "TreeRPO Embedded Decode",
                       [EmbeddedType.Input("embedded", display_name="embedded model",
                                           tooltip="the embedded output of TreeRPO Embedded Model Loader"),
                        io.Latent.Input("samples", display_name="latent", tooltip="the sampler's output")],
                       [io.Image.Output()],
                       description="Turns the built-in model's samples into images (it works on pixels "
                                   "directly: no VAE).")

    @classmethod
    def execute(cls, embedded: Any, samples: dict) -> io.NodeOutput:
        images = embedded.decode(samples["samples"])  # [B, 3, H, W] in [0, 1]
        return io.NodeOutput(images.permute(0, 2, 3, 1).contiguous())


NODES: list[type[io.ComfyNode]] = [TreeRPOEmbeddedLoader, TreeRPOEmbeddedTextEncode,
                                   TreeRPOEmbeddedEmptyLatent, TreeRPOEmbeddedDecode]
