"""The guard's checkpoints on the node: the trade plot, before/after images, and taking another one.

TreeRPO Train LoRA from Picks trains under the guard (``trainer.guard``): it keeps a checkpoint every
few rounds, measures taste and prompt-following on validation prompts, and returns the checkpoint the
person's limit allows. This module draws that on the node (ComfyUI's own image previews, which both
node views show, and one line of text), and TreeRPO Choose Checkpoint takes another checkpoint or
LoRA strength from the run, without training again: ComfyUI re-runs only the node whose widgets
changed, and the run carries every checkpoint it kept.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..trainer.guard.choice import Choice
from ..trainer.lora.adapters import attach_lora, load_lora_state
from ..trainer.preferences.store import PickStore
from ..trainer.training.guarded import write_figures
from ..trainer.training.session import TrainingState
from .comfy_door import (
    embedded_model_patcher,
    embedded_policy_of,
    io,
    preview_images,
    send_node_text,
    temp_directory,
)
from .training import RunType, comfy_lora, is_embedded, trained_outputs, training_outputs

CATEGORY = "TreeRPO/picks"
GUARD_TEXT = "treerpo_guard"  # the ui key of the one line that says what was chosen and why
PICKS_TEXT = "treerpo_picks"  # the ui key of the line that says which picks the run learned from


def picks_line(run: TrainingState) -> str:
    """Which picks the run learned from: how many labelled trees, and how many of them a trained model
    sampled (picked in a later round, on the model training made)."""
    folder = run.config.data.picks
    if not folder or not Path(folder).is_dir():
        return ""
    store = PickStore(Path(folder))
    labelled = [tree_id for tree_id, _ in store.labelled()]
    later = sum(store.meta(t).model.lora is not None for t in labelled)
    rounds = f" ({later} of them sampled by a trained model)" if later else ""
    return f"learned from {len(labelled)} labelled trees{rounds}"


def _image_tensor(path: Path) -> torch.Tensor:
    from PIL import Image

    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels)[None]


def guard_ui(run: TrainingState, choice: Choice) -> dict[str, Any]:
    """The node's UI after a guarded run: the trade plot and the before/after grid as previews, and the
    choice's one line (also sent as the node's text)."""
    folder = Path(tempfile.mkdtemp(prefix="treerpo_guard_", dir=temp_directory()))
    files = write_figures(run.guard, folder, choice,
                          run.picks_weights.others() if run.picks_weights is not None else ())
    images = [entry for name in ("trade", "before_after")
              for entry in preview_images(_image_tensor(files[name]), side=640)]
    line = f"chose {choice.reason}" if choice.point is not None else choice.reason
    if choice.point is not None and run.picks_weights is not None and len(run.picks_weights.weights) > 1:
        line += f"; it {run.picks_weights.line()}"
    send_node_text(line)
    return {"images": images, GUARD_TEXT: [line], PICKS_TEXT: [picks_line(run)]}


def chosen_run(run: TrainingState, choice: Choice) -> TrainingState:
    """The run with the chosen checkpoint's LoRA as its weights (the base model's: zeros)."""
    point = choice.point
    weights = (run.guard.weights(0, 0.0) if point is None
               else run.guard.weights(point.iteration, point.strength))
    return replace(run, weights=weights)


def embedded_at(run: TrainingState, weights: dict[str, torch.Tensor]) -> Any:
    """A copy of the run's embedded policy carrying ``weights`` (the run's own policy stays as it is:
    ComfyUI may hand it to other nodes from its cache)."""
    lora = run.config.lora
    with torch.inference_mode(False):
        policy = run.policy.fresh_copy()
        attach_lora(policy.transformer, lora.rank, lora.alpha, lora.targets, seed=run.config.seed)
        load_lora_state(policy.transformer, weights)
    return policy.eval()


def outputs(model: Any, run: TrainingState, choice: Choice, shift: float | None) -> io.NodeOutput:
    """The MODEL at ``choice`` (the input MODEL unchanged when the choice is the base model), the
    embedded policy, the run and ComfyUI's LORA_MODEL, with the guard's UI."""
    taken = chosen_run(run, choice)
    ui = guard_ui(run, choice)
    base = choice.point is None
    if is_embedded(model):
        policy = embedded_at(run, taken.weights)
        taken = replace(taken, policy=policy)  # what TreeRPO Save LoRA writes from
        out = model if base else embedded_model_patcher(policy, shift)
        return io.NodeOutput(out, policy, taken, {} if base else comfy_lora(taken), ui=ui)
    if base:
        return io.NodeOutput(model, None, taken, {}, ui=ui)
    trained = trained_outputs(model, taken)
    return io.NodeOutput(*trained.result, ui=ui)


class TreeRPOChooseCheckpoint(io.ComfyNode):
    """Another checkpoint or LoRA strength of a guarded picks run, without training again."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOChooseCheckpoint", display_name="TreeRPO Choose Checkpoint", category=CATEGORY,
            description="Takes another point of a run of TreeRPO Train LoRA from Picks without training "
                        "again: the run kept a checkpoint every few rounds (the plot on the training node "
                        "shows the taste against prompt-following of those the guard measured). 'checkpoint' "
                        "0 takes the one the "
                        "guard chose; 'strength' scales the LoRA (below 1: less of your taste, more of the "
                        "prompt).",
            inputs=[io.Model.Input("model", display_name="model",
                                   tooltip="the same MODEL the training node was given"),
                    RunType.Input("run", display_name="run",
                                  tooltip="the run output of TreeRPO Train LoRA from Picks"),
                    io.Int.Input("checkpoint", display_name="checkpoint (round)", default=0, min=0,
                                 max=100000,
                                 tooltip="the training round of a kept checkpoint (every few rounds; the "
                                         "plot numbers those measured); 0: the one the guard chose"),
                    io.Float.Input("strength", display_name="LoRA strength", default=1.0, min=0.0, max=2.0,
                                   step=0.05, tooltip="how strongly the checkpoint's LoRA applies (1: as "
                                                      "trained; 0: the base model)")],
            outputs=training_outputs(), is_output_node=True)

    @classmethod
    def execute(cls, model: Any, run: TrainingState, checkpoint: int, strength: float) -> io.NodeOutput:
        if run.guard is None:
            raise ValueError("run: this run kept no checkpoints (it trained with 'keep following the prompt' "
                             "off): connect a run trained under the guard")
        guard = run.guard
        if checkpoint == 0:
            choice = guard.choice
            if strength != 1.0 and choice.point is not None:
                choice = guard.take(choice.point.iteration, choice.point.strength * strength)
        else:
            choice = guard.take(checkpoint, strength)
        shift = embedded_policy_of(model)[1] if is_embedded(model) else None
        return outputs(model, run, choice, shift)


NODES: list[type[io.ComfyNode]] = [TreeRPOChooseCheckpoint]
