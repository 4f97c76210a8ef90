"""Training nodes: LayerTuning-RL / Dynamic-TreeRPO steps on a MODEL (the embedded one, or any
rectified-flow image model from ComfyUI's own loaders), LoRA export and the history plot. Each is a
thin wrapper over ``trainer.training.session`` and ``trainer.lora``, the code the headless trainer
runs, so a workflow trains exactly as ``treerpo train`` does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..trainer.config.files import load_config
from ..trainer.config.schema import TrainConfig
from ..trainer.core.strategies import STRATEGIES
from ..trainer.lora.files import (
    save_comfyui_lora,
    save_comfyui_state,
    save_diffusers_lora,
    save_diffusers_state,
    save_kohya_file,
)
from ..trainer.lora.keys import COMFYUI_PREFIX, comfyui_state
from ..trainer.lora.kohya import native_to_diffusers
from ..trainer.training.loop import check_plan
from ..trainer.training.session import TrainingState, train_steps
from ._comfy import (
    embedded_model_patcher,
    embedded_policy_of,
    flow_family,
    io,
    latent_shape_of,
    lora_patched,
    model_roots,
    models_directory,
    output_directory,
    progress_bar,
    temp_directory,
)
from .comfy_policy import CURATED, ComfyModelPolicy, lora_targets
from .embedded import EmbeddedType
from .inputs import check_rewards, parse_lines, parse_weights

RunType = io.Custom("TREERPO_RUN")
LoraModelType = io.Custom("LORA_MODEL")  # ComfyUI's own: a state dict in its LoRA keys
CATEGORY = "TreeRPO/training"
FORMATS = ["comfyui", "diffusers", "kohya"]


TRAINED_MARK = "treerpo_trained"  # in model_options of a MODEL that carries a run's LoRA


def model_defaults(model: Any) -> list[str]:
    """Options a ComfyUI MODEL changes from the embedded model's defaults (the settings widget still
    overrides them): LoRA targets in the model's own module names, and the sigma schedule it samples
    with (its shift, including a ModelSampling node's patch)."""
    family = flow_family(model)
    targets = lora_targets(model.model.diffusion_model, family.name)
    return [f"lora.targets=[{','.join(targets)}]", "sampling.schedule=shift",
            f"sampling.shift={family.shift:.6g}"]


def node_config(iterations: int, prompts: list[str], reward: str, reward_weights: dict[str, str],
                strategy: str, seed: int, settings: str, defaults: Sequence[str] = ()) -> TrainConfig:
    """The trainer's config from the node's widgets; ``settings`` holds ``key=value`` lines for every
    other option (the keys of configs/default.yaml), validated by the same loader."""
    overrides = [f"iterations={iterations}", f"strategy={strategy}", f"seed={seed}",
                 *defaults, *parse_lines(settings)]
    config = load_config(TrainConfig, None, overrides)
    data = config.data
    if prompts:
        folder = Path(tempfile.mkdtemp(prefix="treerpo_prompts_", dir=temp_directory()))
        file = folder / "prompts.txt"
        file.write_text("\n".join(prompts) + "\n", encoding="utf-8")
        data = replace(data, prompts=str(file))
    return replace(config, reward=reward, reward_weights=reward_weights, data=data)


class TreeRPOTrainLoRA(io.ComfyNode):
    """K training iterations (tree rollout, reward, advantages, loss, optimizer) of a LoRA."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOTrainLoRA", display_name="TreeRPO Train LoRA (steps)", category=CATEGORY,
            description="Fine-tune a LoRA with Dynamic-TreeRPO (or a baseline) for some iterations. "
                        "Chain nodes through 'previous' to continue a run.",
            inputs=[
                io.Model.Input("model", tooltip="the embedded model (TreeRPO Embedded Model Loader), or a "
                                                "flow model (FLUX, SD3, Qwen-Image...) from ComfyUI's "
                                                "loaders with its clip and vae"),
                io.Int.Input("iterations", default=4, min=1, max=100000),
                io.String.Input("prompts", multiline=True, default="",
                                tooltip="one prompt per line; empty: generated scenes"),
                io.String.Input("reward", default="scene",
                                tooltip="a reward name, or several with weights: hps-v2.1:0.7,ocr:0.3"),
                io.String.Input("reward_weights", multiline=True, default="",
                                tooltip="name=path lines: the local weights of model rewards"),
                io.Combo.Input("strategy", options=list(STRATEGIES), default="dynamic_treerpo"),
                io.Int.Input("seed", default=0, min=0, max=2**31 - 1),
                io.String.Input("settings", multiline=True, default="",
                                tooltip="key=value lines for any other option, e.g. tree.depth=3 "
                                        "(the keys of configs/default.yaml)"),
                RunType.Input("previous", optional=True, tooltip="continue this run"),
                io.Clip.Input("clip", optional=True, tooltip="a loader's MODEL: encodes the prompts"),
                io.Vae.Input("vae", optional=True, tooltip="a loader's MODEL: decodes images for the reward"),
                io.Latent.Input("latent", optional=True,
                                tooltip="a loader's MODEL: an empty latent of the training size (default: "
                                        "model.height x model.width of the settings)"),
            ],
            outputs=[io.Model.Output(display_name="model", tooltip="the input MODEL with the trained LoRA"),
                     EmbeddedType.Output(display_name="embedded", tooltip="embedded model runs only"),
                     RunType.Output(display_name="run"),
                     LoraModelType.Output(display_name="lora",
                                          tooltip="for ComfyUI's own Save LoRA Weights and Load LoRA Model")])

    @classmethod
    def validate_inputs(cls, reward: str, reward_weights: str, settings: str, strategy: str) -> bool | str:
        # named parameters only: with **kwargs ComfyUI would skip its own min/max checks
        try:
            weights = check_rewards(reward, reward_weights, models_directory(), model_roots())
            check_plan(node_config(1, [], reward, weights, strategy, 0, settings))
        except (ValueError, TypeError, FileNotFoundError) as err:
            return str(err)
        return True

    @classmethod
    def execute(cls, model: Any, iterations: int, prompts: str, reward: str, reward_weights: str,
                strategy: str, seed: int, settings: str, previous: TrainingState | None = None,
                clip: Any = None, vae: Any = None, latent: dict | None = None) -> io.NodeOutput:
        weights = parse_weights(reward_weights, models_directory(), model_roots())
        bar = progress_bar(iterations)

        def on_iteration(done: int, _row: dict) -> None:
            bar.update_absolute(done, iterations)

        if getattr(model.model, "__dict__", {}).get("policy") is not None:  # the embedded model
            policy, shift = embedded_policy_of(model)
            config = node_config(iterations, parse_lines(prompts), reward, weights, strategy, seed, settings)
            run = train_steps(policy.fresh_copy(), config, iterations, previous, on_iteration=on_iteration)
            lora = comfyui_state(run.weights, run.config.lora.alpha, COMFYUI_PREFIX)
            return io.NodeOutput(embedded_model_patcher(run.policy, shift), run.policy, run, lora)

        family = flow_family(model).name
        if clip is None or vae is None:
            raise ValueError(f"training a {family} MODEL needs its clip and vae inputs connected")
        if previous is not None and model.model_options.get(TRAINED_MARK):
            raise ValueError("to continue a run, connect the base MODEL: this one already carries the "
                             "run's LoRA")
        config = node_config(iterations, parse_lines(prompts), reward, weights, strategy, seed, settings,
                             model_defaults(model))
        m = config.model
        empty = {"samples": torch.zeros(1, 4, m.height // 8, m.width // 8)}
        shape = latent_shape_of(model, latent if latent is not None else empty)
        policy = ComfyModelPolicy(model.clone(), clip, vae, shape, m.guidance)
        with policy.training(checkpointing=m.gradient_checkpointing):
            run = train_steps(policy, config, iterations, previous, on_iteration=on_iteration)
        lora = comfyui_state(run.weights, run.config.lora.alpha, COMFYUI_PREFIX)
        trained = lora_patched(model, lora)
        trained.model_options[TRAINED_MARK] = True
        return io.NodeOutput(trained, None, run, lora)


def confined_path(prefix: str, suffix: str) -> Path:
    """``<output>/<prefix><suffix>``, refused when the name leaves the output folder."""
    root = Path(output_directory()).resolve()
    name = prefix.strip() or "treerpo_lora"
    path = (root / f"{name}{suffix}").resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"file name {prefix!r} leaves ComfyUI's output folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class TreeRPOSaveLoRA(io.ComfyNode):
    """Save the run's LoRA into ComfyUI's output folder in the chosen key format."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOSaveLoRA", display_name="TreeRPO Save LoRA", category=CATEGORY,
            description="comfyui: diffusion_model.* keys with .alpha (LoraLoaderModelOnly); "
                        "diffusers: pipe.load_lora_weights; kohya: lora_unet_* keys (sd-scripts, ComfyUI).",
            inputs=[RunType.Input("run"),
                    io.String.Input("filename_prefix", default="loras/treerpo_lora"),
                    io.Combo.Input("format", options=FORMATS, default="comfyui")],
            outputs=[io.String.Output(display_name="path")], is_output_node=True)

    @classmethod
    def validate_inputs(cls, filename_prefix: str) -> bool | str:
        if ".." in Path(filename_prefix).parts or Path(filename_prefix).is_absolute():
            return f"file name {filename_prefix!r} leaves ComfyUI's output folder"
        return True

    @classmethod
    def execute(cls, run: TrainingState, filename_prefix: str, format: str) -> io.NodeOutput:
        if run.policy is None:
            raise ValueError("this run holds no trained model to save")
        path = confined_path(filename_prefix, ".safetensors")
        family = getattr(run.policy, "family", None)
        if family is not None:  # a MODEL of ComfyUI's loaders: the LoRA is in its own module names
            return io.NodeOutput(str(save_native_lora(path, run, format)))
        transformer = run.policy.transformer
        if format == "comfyui":
            save_comfyui_lora(path, transformer, COMFYUI_PREFIX)
        elif format == "kohya":
            save_kohya_file(path, transformer, kind="embedded")
        else:
            save_diffusers_lora(path, transformer)
        return io.NodeOutput(str(path))


def save_native_lora(path: Path, run: TrainingState, format: str) -> Path:
    """A LoRA trained on a ComfyUI MODEL's own modules: ComfyUI keys (``diffusion_model.<module>``, which
    ComfyUI's lora.py maps for every family), kohya keys (``lora_unet_<module>``: the original layer
    names, as sd-scripts writes them), or, for FLUX and SD3, diffusers module names (fused layers
    split exactly)."""
    alpha, rank = run.config.lora.alpha, run.config.lora.rank
    family = run.policy.family
    if format == "diffusers" and family not in CURATED:
        raise ValueError(f"the diffusers format is written for FLUX and SD3 LoRAs; save this {family} LoRA "
                         "as comfyui or kohya")
    if format == "comfyui":
        return save_comfyui_state(path, run.weights, rank, alpha)
    if format == "kohya":
        return save_kohya_file(path, run.weights, alpha=alpha, kind="native")
    return save_diffusers_state(path, *native_to_diffusers(run.weights, alpha, CURATED[family]))


class TreeRPOPlotHistory(io.ComfyNode):
    """Reward and loss curves of a run, as an IMAGE."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(node_id="TreeRPOPlotHistory", display_name="TreeRPO Plot History",
                         category=CATEGORY, inputs=[RunType.Input("run")],
                         outputs=[io.Image.Output()])

    @classmethod
    def execute(cls, run: TrainingState) -> io.NodeOutput:
        from PIL import Image

        from ..trainer.training.logs import plot_curves

        rows = [{k: str(v) for k, v in row.items()} for row in run.history]
        with tempfile.TemporaryDirectory(dir=temp_directory()) as tmp:
            file = Path(tmp) / "history.png"
            plot_curves(rows, file, ys=(("reward_mean", "reward_max"), ("loss", "grpo_loss", "prm_loss"),
                                        "clip_frac"), title=f"{run.config.strategy}: {run.iterations_done} "
                                                            "iterations")
            image = np.asarray(Image.open(file).convert("RGB"), dtype=np.float32) / 255.0
        return io.NodeOutput(torch.from_numpy(image)[None])


NODES: list[type[io.ComfyNode]] = [TreeRPOTrainLoRA, TreeRPOSaveLoRA, TreeRPOPlotHistory]
