"""Training nodes: LayerTuning-RL / Dynamic-TreeRPO steps on a MODEL (the embedded one, or any
rectified-flow image model from ComfyUI's own loaders), LoRA export and the history plot. Each is a
thin wrapper over ``trainer.training.session`` and ``trainer.lora``, the code the headless trainer
runs, so a workflow trains exactly as ``treerpo train`` does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..trainer.config.files import load_config
from ..trainer.config.schema import TrainConfig
from ..trainer.core.flow import make_sigmas
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
from ..trainer.training.plans import check_plan, iteration_plan
from ..trainer.training.session import TrainingState, train_steps
from .budget import STRATEGY_IMAGE_KEYS, check_training_images
from .comfy_door import (
    FlowFamily,
    embedded_model_patcher,
    embedded_policy_of,
    flow_family,
    io,
    latent_shape_of,
    lora_patched,
    model_roots,
    models_directory,
    node_progress,
    output_directory,
    temp_directory,
)
from .comfy_policy import CURATED, ComfyModelPolicy, lora_targets
from .embedded import EmbeddedType
from .inputs import about, parse_lines, parse_weights, reward_spec
from .widgets import check_reward_inputs, reward_inputs, settings_input

RunType = io.Custom("TREERPO_RUN")


def reward_curve(history: list[dict], iterations: int) -> Any:
    """A small PIL image of the reward so far (mean and best per iteration): the node's live preview."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    means = [float(r["reward_mean"]) for r in history if r.get("reward_mean") is not None]
    bests = [float(r["reward_max"]) for r in history if r.get("reward_max") is not None]
    figure, axes = plt.subplots(figsize=(3.2, 2.2), dpi=100)
    try:
        axes.plot(range(1, len(means) + 1), means, marker=".", label="mean")
        if len(bests) == len(means):
            axes.plot(range(1, len(bests) + 1), bests, marker=".", alpha=0.6, label="best")
        axes.set_xlim(0.5, max(iterations, 2) + 0.5)
        axes.set_xlabel("iteration", fontsize=8)
        axes.set_title("reward", fontsize=9)
        axes.tick_params(labelsize=7)
        axes.legend(fontsize=7, loc="lower right")
        figure.tight_layout()
        figure.canvas.draw()
        size = figure.canvas.get_width_height()
        return Image.frombuffer("RGBA", size, figure.canvas.buffer_rgba()).convert("RGB")
    finally:
        plt.close(figure)
LoraModelType = io.Custom("LORA_MODEL")  # ComfyUI's own: a state dict in its LoRA keys
CATEGORY = "TreeRPO/training"
FORMATS = ["comfyui", "diffusers", "kohya"]


TRAINED_MARK = "treerpo_trained"  # in model_options of a MODEL that carries a run's LoRA


def model_defaults(model: Any, family: FlowFamily) -> list[str]:
    """Options a ComfyUI MODEL changes from the embedded model's defaults (the settings widget still
    overrides them): LoRA targets in the model's own module names, and the sigma schedule it samples
    with (its shift, including a ModelSampling node's patch)."""
    targets = lora_targets(model.model.diffusion_model, family.name)
    return [f"lora.targets=[{','.join(targets)}]", "sampling.schedule=shift",
            f"sampling.shift={family.shift:.6g}"]


def node_config(iterations: int, prompts: list[str], reward: str, reward_weights: dict[str, str],
                strategy: str, seed: int, settings: str, defaults: Sequence[str] = ()) -> TrainConfig:
    """The trainer's config from the node's widgets; ``settings`` holds ``key=value`` lines for every
    other option (the keys of configs/default.yaml), validated by the same loader."""
    overrides = [f"iterations={iterations}", f"strategy={strategy}", f"seed={seed}",
                 *defaults, *parse_lines(settings)]
    config = backbone_in_models(load_config(TrainConfig, None, overrides))
    data = config.data
    if prompts:
        folder = Path(tempfile.mkdtemp(prefix="treerpo_prompts_", dir=temp_directory()))
        file = folder / "prompts.txt"
        file.write_text("\n".join(prompts) + "\n", encoding="utf-8")
        data = replace(data, prompts=str(file))
    return replace(config, reward=reward, reward_weights=reward_weights, data=data)


def backbone_in_models(config: TrainConfig) -> TrainConfig:
    """``picks.backbone_weights`` of the settings box read as the weight-file widgets' paths are: a relative
    path under ComfyUI's models folder (not the folder ComfyUI was started from), refused outside its model
    folders, and missing named in one line."""
    path = config.picks.backbone_weights
    if not path:
        return config
    name = config.picks.backbone
    try:
        (full,) = parse_weights(f"{name}={path}", models_directory(), model_roots()).values()
    except ValueError as err:
        raise ValueError(f"picks.backbone_weights: {err}") from None
    if not Path(full).exists():
        raise FileNotFoundError(f"picks.backbone_weights: weights of {name} not found: {full}")
    return replace(config, picks=replace(config.picks, backbone_weights=full))


def check_training_budget(config: TrainConfig) -> None:
    """The images one iteration draws per prompt (its rollout plan's leaves) within the leaf budget."""
    s = config.sampling
    sigmas = make_sigmas(s.schedule, config.strategy_config.steps, s.shift, image_tokens=64)
    images = iteration_plan(config, sigmas, 0).leaves_per_prompt
    keys = STRATEGY_IMAGE_KEYS.get(config.strategy, ())
    values = {key: getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in keys}
    check_training_images(config.strategy, images, values)


class TreeRPOTrainLoRA(io.ComfyNode):
    """K training iterations (tree rollout, reward, advantages, loss, optimizer) of a LoRA."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOTrainLoRA", display_name="TreeRPO Train LoRA (steps)", category=CATEGORY,
            description="Teaches the model to make images the reward scores higher, by training a small "
                        "add-on (a LoRA) for some rounds (iterations). Each round it draws a tree of "
                        "variations per prompt, scores them, and nudges the model toward the better ones "
                        "(Dynamic-TreeRPO, or a baseline recipe). The node shows the reward as it trains and "
                        "a small reward curve as its preview. Chain nodes through 'continue run' to go on.",
            inputs=[
                io.Model.Input("model", display_name="model",
                               tooltip="the embedded model (TreeRPO Embedded Model Loader), or a flow model "
                                       "(FLUX, SD3, Qwen-Image...) from ComfyUI's loaders with its clip and "
                                       "vae"),
                io.Int.Input("iterations", display_name="training rounds", default=4, min=1, max=100000,
                             tooltip="how many training rounds this node runs (iterations)"),
                io.String.Input("prompts", display_name="training prompts", multiline=True, default="",
                                placeholder="training prompts, one per line (empty: the embedded model's "
                                            "generated scenes)",
                                tooltip="what to practise on, one prompt per line; empty: the embedded "
                                        "model's generated scenes"),
                *reward_inputs(),
                io.Combo.Input("strategy", display_name="recipe (strategy)", options=list(STRATEGIES),
                               default="dynamic_treerpo",
                               tooltip="the training recipe: dynamic_treerpo (this pack's, the paper's), "
                                       "or a published baseline to compare with"),
                io.Int.Input("seed", display_name="seed", default=0, min=0, max=2**31 - 1,
                             tooltip="the same seed and inputs train the same LoRA"),
                settings_input(),
                RunType.Input("previous", display_name="continue run", optional=True,
                              tooltip="continue this run (the run output of another Train LoRA node)"),
                *model_inputs("decodes images for the reward", "training size (empty latent)",
                              "an empty latent of the training size (default: model.height x model.width "
                              "of the settings)"),
            ],
            outputs=training_outputs())

    @classmethod
    def validate_inputs(cls, prompts: str, reward: str, reward_mix: str, reward_weights: str, settings: str,
                        strategy: str) -> bool:
        # named parameters only (with **kwargs ComfyUI would skip its own min/max checks); a refusal is
        # raised so that ComfyUI reports it once, naming its input
        weights = check_reward_inputs(reward, reward_mix, reward_weights, (prompts, "prompts"))
        with about("settings"):
            config = node_config(1, [], reward_spec(reward, reward_mix), weights, strategy, 0, settings)
            check_plan(config)
            check_training_budget(config)
        return True

    @classmethod
    def execute(cls, model: Any, iterations: int, prompts: str, reward: str, reward_mix: str,
                reward_weights: str, strategy: str, seed: int, settings: str,
                previous: TrainingState | None = None, clip: Any = None, vae: Any = None,
                latent: dict | None = None) -> io.NodeOutput:
        weights = parse_weights(reward_weights, models_directory(), model_roots())
        reward = reward_spec(reward, reward_mix)
        on_iteration = iteration_reporter(iterations)
        if is_embedded(model):
            policy, shift = embedded_policy_of(model)
            config = node_config(iterations, parse_lines(prompts), reward, weights, strategy, seed, settings)
            run = train_steps(policy.fresh_copy(), config, iterations, previous, on_iteration=on_iteration)
            return io.NodeOutput(embedded_model_patcher(run.policy, shift), run.policy, run, comfy_lora(run))

        family = flow_family(model)
        if clip is None or vae is None:
            raise ValueError(f"training a {family.name} MODEL needs its clip and vae inputs connected")
        check_continuable(model, previous)
        config = node_config(iterations, parse_lines(prompts), reward, weights, strategy, seed, settings,
                             model_defaults(model, family))
        m = config.model
        policy = comfy_policy(model, clip, vae, latent, m.guidance, family, m.height, m.width)
        with policy.training(checkpointing=m.gradient_checkpointing):
            run = train_steps(policy, config, iterations, previous, on_iteration=on_iteration)
        return trained_outputs(model, run)


def is_embedded(model: Any) -> bool:
    """Whether a MODEL is the pack's embedded one (its policy rides on the model object)."""
    return getattr(model.model, "__dict__", {}).get("policy") is not None


def model_inputs(decode: str, latent_label: str, latent_tooltip: str) -> list:
    """The optional inputs that say how to encode and decode for a loader's MODEL."""
    return [io.Clip.Input("clip", display_name="text encoder (clip)", optional=True,
                          tooltip="a loader's MODEL: encodes the prompts"),
            io.Vae.Input("vae", display_name="image decoder (vae)", optional=True,
                         tooltip=f"a loader's MODEL: {decode}"),
            io.Latent.Input("latent", display_name=latent_label, optional=True,
                            tooltip=f"a loader's MODEL: {latent_tooltip}")]


def training_outputs() -> list:
    """What a training node gives: the trained MODEL, the embedded model, the run and the LoRA."""
    return [io.Model.Output(display_name="model", tooltip="the input MODEL with the trained LoRA"),
            EmbeddedType.Output(display_name="embedded", tooltip="embedded model runs only"),
            RunType.Output(display_name="run"),
            LoraModelType.Output(display_name="lora",
                                 tooltip="for ComfyUI's own Save LoRA Weights and Load LoRA Model")]


def iteration_reporter(iterations: int) -> Callable[[int, dict], None]:
    """The node's progress: 'iteration k/n: reward r' and the reward curve so far as its preview."""
    report = node_progress(iterations)
    history: list[dict] = []

    def on_iteration(done: int, row: dict) -> None:
        history.append(row)
        mean = row.get("reward_mean")
        text = f"iteration {done}/{iterations}"
        if mean is not None:
            text += f": reward {float(mean):.4f}"
        report(done, text, reward_curve(history, iterations))

    return on_iteration


def check_continuable(model: Any, previous: TrainingState | None) -> None:
    """A run continues from its base MODEL, never from one that already carries its LoRA."""
    if previous is not None and model.model_options.get(TRAINED_MARK):
        raise ValueError("previous: to continue a run, connect the base MODEL: this one already carries "
                         "the run's LoRA")


def comfy_policy(model: Any, clip: Any, vae: Any, latent: dict | None, guidance: float | None = None,
                 family: FlowFamily | None = None, height: int = 512, width: int = 512) -> ComfyModelPolicy:
    """A Policy over a MODEL of ComfyUI's loaders (its clip and vae connected)."""
    family = family or flow_family(model)
    if clip is None or vae is None:
        missing = "clip" if clip is None else "vae"
        raise ValueError(f"{missing}: a {family.name} MODEL needs its clip and vae connected")
    empty = {"samples": torch.zeros(1, 4, height // 8, width // 8)}
    shape = latent_shape_of(model, latent if latent is not None else empty)
    return ComfyModelPolicy(model.clone(), clip, vae, shape, guidance, family=family)


def comfy_lora(run: TrainingState) -> dict[str, torch.Tensor]:
    """The run's LoRA in ComfyUI's keys, for its LoRA nodes."""
    return comfyui_state(run.weights, run.config.lora.alpha, COMFYUI_PREFIX)


def trained_outputs(model: Any, run: TrainingState) -> io.NodeOutput:
    """A loader MODEL's outputs: the MODEL patched with the run's LoRA (marked as carrying it)."""
    lora = comfy_lora(run)
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
            description="Saves the trained LoRA as a .safetensors file in ComfyUI's output folder. Put it "
                        "in models/loras to use it with Load LoRA. Formats: comfyui (for ComfyUI's LoRA "
                        "loaders), kohya (also read by sd-scripts and most tools), diffusers (for Python "
                        "scripts using diffusers; FLUX and SD3 only).",
            inputs=[RunType.Input("run", display_name="training run",
                                  tooltip="the run of a TreeRPO Train LoRA node"),
                    io.String.Input("filename_prefix", display_name="file name", default="loras/treerpo_lora",
                                    tooltip="file name in ComfyUI's output folder (without .safetensors)"),
                    io.Combo.Input("format", display_name="for (key format)", options=FORMATS,
                                   default="comfyui",
                                   tooltip="which tools the file is for (key format): comfyui, kohya, "
                                           "diffusers")],
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
                         category=CATEGORY,
                         inputs=[RunType.Input("run", display_name="training run",
                                               tooltip="the run of a TreeRPO Train LoRA node")],
                         outputs=[io.Image.Output()],
                         description="Draws how training went: the reward (mean and best) and the loss per "
                                     "round, as an image to preview or save.")

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
