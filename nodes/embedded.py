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
from ._comfy import embedded_model_patcher, io, model_roots, models_directory
from .inputs import confined

EmbeddedType = io.Custom("TREERPO_EMBEDDED")
CATEGORY = "TreeRPO/embedded"


def _schema(node_id: str, display_name: str, inputs: list, outputs: list, **extra: Any) -> io.Schema:
    """The schema of one node of this family (category and naming shared)."""
    return io.Schema(node_id=node_id, display_name=display_name, category=CATEGORY, inputs=inputs,
                     outputs=outputs, **extra)


class TreeRPOEmbeddedLoader(io.ComfyNode):
    """Load the embedded default (the weights shipped with the pack, or a folder of the same form)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return _schema(
            "TreeRPOEmbeddedLoader", "TreeRPO Embedded Model Loader",
            [io.String.Input("weights", default="",
                             tooltip="folder written by save_pretrained; empty: the shipped one"),
             io.Float.Input("shift", default=3.0, min=1.0, max=10.0, step=0.1,
                            tooltip="sigma shift of the schedule the model was trained with")],
            [io.Model.Output(), EmbeddedType.Output(display_name="embedded")],
            description="The pack's small scenes model: MODEL for ComfyUI's samplers, plus its "
                        "text encoder and pixel decoder.")

    @classmethod
    def execute(cls, weights: str, shift: float) -> io.NodeOutput:
        folder = None
        if weights.strip():  # a relative path is under ComfyUI's models folder; none outside its folders
            path = Path(models_directory()) / weights.strip()
            folder = confined(path, model_roots(), "embedded model folder")
        policy = EmbeddedPolicy.from_pretrained(folder)
        return io.NodeOutput(embedded_model_patcher(policy, shift), policy)


class TreeRPOEmbeddedTextEncode(io.ComfyNode):
    """Encode a prompt with the embedded model's own text encoder."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return _schema("TreeRPOEmbeddedTextEncode", "TreeRPO Embedded Text Encode",
                       [EmbeddedType.Input("embedded"),
                        io.String.Input("text", multiline=True, default="two red circles")],
                       [io.Conditioning.Output()])

    @classmethod
    def execute(cls, embedded: Any, text: str) -> io.NodeOutput:
        cond = embedded.encode([text.strip()])
        return io.NodeOutput([[cond["text"], {"pooled_output": cond["pooled"]}]])


class TreeRPOEmbeddedEmptyLatent(io.ComfyNode):
    """An empty latent of the embedded model's shape (48 x 16 x 16 for 64 x 64 RGB)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return _schema("TreeRPOEmbeddedEmptyLatent", "TreeRPO Embedded Empty Latent",
                       [EmbeddedType.Input("embedded"),
                        io.Int.Input("batch_size", default=1, min=1, max=4096)],
                       [io.Latent.Output()])

    @classmethod
    def execute(cls, embedded: Any, batch_size: int) -> io.NodeOutput:
        return io.NodeOutput({"samples": torch.zeros(batch_size, *embedded.latent_shape)})


class TreeRPOEmbeddedDecode(io.ComfyNode):
    """Latent to IMAGE (the model works in folded pixel space: no VAE)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return _schema("TreeRPOEmbeddedDecode", "TreeRPO Embedded Decode",
                       [EmbeddedType.Input("embedded"), io.Latent.Input("samples")],
                       [io.Image.Output()])

    @classmethod
    def execute(cls, embedded: Any, samples: dict) -> io.NodeOutput:
        images = embedded.decode(samples["samples"])  # [B, 3, H, W] in [0, 1]
        return io.NodeOutput(images.permute(0, 2, 3, 1).contiguous())


NODES: list[type[io.ComfyNode]] = [TreeRPOEmbeddedLoader, TreeRPOEmbeddedTextEncode,
                                   TreeRPOEmbeddedEmptyLatent, TreeRPOEmbeddedDecode]
