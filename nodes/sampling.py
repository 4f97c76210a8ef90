"""Sampling nodes: the Dynamic-TreeRPO tree as a sampler, a flow SDE SAMPLER, and best-of-tree.

They run the trainer's own rollout (``trainer.core.tree.rollout`` on a plan of ``trainer.core.strategies``)
with ComfyUI's denoiser as the velocity, through ComfyUI's CFGGuider: any FLOW MODEL with its
conditioning, CFG and patches (LoRAs) works, and the embedded MODEL samples exactly as in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..trainer.core.flow import SDE_KINDS
from ..trainer.core.strategies import MixGRPOConfig, TreeConfig, build_plan
from ..trainer.core.tree import Tree, rollout
from ..trainer.rewards.mix import RewardMix
from ..trainer.training.plans import sampler_tree_config as tree_config
from .budget import MAX_LEAVES, check_leaves, check_memory, stored_latents
from .comfy_door import (
    flow_family,
    guided_sample,
    io,
    ksampler,
    model_roots,
    model_sigmas,
    models_directory,
    preview_images,
    tree_memory,
)
from .embedded import EmbeddedType, embedded_conditioning
from .inputs import check_embedded_text, check_ranges, parse_weights, reward_spec
from .widgets import check_reward_inputs, reward_inputs

TreeType = io.Custom("TREERPO_TREE")
CATEGORY = "TreeRPO/sampling"


@dataclass
class SampledTree:
    """The TREE output: the rollout (nodes, edges, per-edge log-probabilities, the forwards' sigmas)
    and the seeds of its branching noise, for training or inspection downstream."""

    tree: Tree
    seeds: list[int]
    sigmas: torch.Tensor


SDE_HELP = ("how the random steps add noise (SDE form): flow_grpo = Flow-GRPO's (the default), dance = "
            "DanceGRPO's, cps = coefficient-preserving (keeps the image's brightness and contrast at "
            "high noise)")


def check_tree_inputs(schema: io.Schema, steps: int, depth: int, branching: int, window_start: int) -> None:
    """The tree's inputs within their declared ranges, consistent with each other and within the leaf
    budget (one message, naming the input at fault)."""
    check_ranges(schema, steps=steps, depth=depth, branching=branching, window_start=window_start)
    tree_config(steps, depth, branching, window_start, 0.6)
    check_leaves(depth, branching)


def run_plan(config: TreeConfig | MixGRPOConfig, window: int, holder: dict[str, Any]) -> Any:
    """A sampler body: the plan on ComfyUI's sigmas, the rows of ``x`` as prompts whose root noise is
    ``x`` itself, branching noise from ``seed + row``; every step's branches go to the live preview;
    returns the leaves."""

    def run(velocity: Any, x: torch.Tensor, sigmas: torch.Tensor, seed: int,
            preview: Any = None) -> torch.Tensor:
        grid = sigmas.detach().float().cpu()
        plan = build_plan(config, grid, window, seed=seed)
        seeds = [seed + row for row in range(x.shape[0])]
        tree = rollout(velocity, None, plan, seeds, tuple(x.shape[1:]),
                       noise=x.detach().float().cpu().unsqueeze(1), device=x.device, on_step=preview)
        holder["tree"] = SampledTree(tree, seeds, grid)
        return tree.leaf_latents.to(x.dtype)

    return run


def _sampling_inputs(conditioning: bool = True) -> list:
    model = [io.Model.Input("model", display_name="model",
                            tooltip="the model that draws (any flow model: the embedded one, FLUX, SD3, "
                                    "Qwen-Image...)")]
    conds = [io.Conditioning.Input("positive", display_name="prompt",
                                   tooltip="what to draw (from a text encode node)"),
             io.Conditioning.Input("negative", display_name="negative prompt",
                                   tooltip="what to avoid (used when cfg is above 1)")]
    return [*model, *(conds if conditioning else []),
            io.Latent.Input("latent", display_name="empty latent",
                            tooltip="an empty latent: each image in it grows into its own tree"),
            io.Int.Input("seed", display_name="seed", default=0, min=0, max=2**31 - 1,
                         control_after_generate=True, tooltip="the same seed and inputs grow the same tree"),
            io.Int.Input("steps", display_name="steps", default=10, min=2, max=200,
                         tooltip="denoising steps of each image"),
            io.Float.Input("cfg", display_name="prompt strength (cfg)", default=1.0, min=0.0, max=30.0,
                           step=0.1,
                           tooltip="how strongly to follow the prompt (classifier-free guidance scale; "
                                   "1 = off, as FLUX and Z-Image Turbo want)"),
            io.Int.Input("depth", display_name="splits (depth)", default=3, min=1, max=8,
                         tooltip="how many times each image splits into variations (tree depth): "
                                 f"branching^depth images come out, at most {MAX_LEAVES} per tree"),
            io.Int.Input("branching", display_name="variations per split", default=2, min=1, max=8,
                         tooltip="how many variations each split makes (branching factor)"),
            io.Int.Input("window_start", display_name="first split at step", default=0, min=0, max=199,
                         tooltip="the step at which the first split happens: later splits keep the "
                                 "variations closer to each other (window start)"),
            io.Float.Input("noise_level", display_name="variation strength", default=0.6, min=0.0, max=2.0,
                           step=0.05,
                           tooltip="how different the variations are (SDE noise level; 0 = identical)")]


def grow_tree(model: Any, positive: Any, negative: Any, latent: dict, seed: int, steps: int, cfg: float,
              config: TreeConfig) -> tuple[torch.Tensor, SampledTree]:
    flow_family(model)  # the tree's SDE is rectified flow's: anything else is refused by name
    need, shape, trees = tree_memory(model, latent, stored_latents(config.depth, config.branching),
                                     config.leaves_per_tree)
    check_memory(need, config.depth, config.branching, trees, shape)  # before anything is sampled
    holder: dict[str, Any] = {}
    sigmas = model_sigmas(model, steps)
    leaves = guided_sample(model, positive, negative, cfg, latent, sigmas,
                           run_plan(config, config.window_start, holder), seed)
    return leaves, holder["tree"]


class TreeRPOTreeSampler(io.ComfyNode):
    """Grow a Dynamic-TreeRPO tree per latent row: leaves as LATENT, and the TREE."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOTreeSampler", display_name="TreeRPO Tree Sampler", category=CATEGORY,
            description="Makes many variations of each image that share their first steps, like a tree: "
                        "it denoises normally up to 'first split at step', then splits every image into "
                        "'variations per split' variations, 'splits (depth)' times, adding fresh noise at "
                        "each split, and finishes each one normally. Out come branching^depth images per "
                        "input image (at most 256), shown live while they form. (Dynamic-TreeRPO's tree "
                        "rollout: ODE, then depth branching SDE steps with noise growing by depth, then "
                        "ODE.)",
            inputs=[*_sampling_inputs(),
                    io.Float.Input("noise_growth", display_name="stronger at later splits", default=0.5,
                                   min=0.0, max=4.0, step=0.05,
                                   tooltip="how much more noise each later split adds (depth-wise noise "
                                           "growth; 0 = the same at every split)"),
                    io.Combo.Input("sde_kind", display_name="noise form (SDE)", options=list(SDE_KINDS),
                                   default="flow_grpo", tooltip=SDE_HELP)],
            outputs=[io.Latent.Output(display_name="leaves", tooltip="the finished variations"),
                     TreeType.Output(display_name="tree", tooltip="the whole tree, for inspection")])

    @classmethod
    def validate_inputs(cls, steps: int, depth: int, branching: int, window_start: int) -> bool:
        check_tree_inputs(cls.define_schema(), steps, depth, branching, window_start)  # raises: reported once
        return True

    @classmethod
    def execute(cls, model: Any, positive: Any, negative: Any, latent: dict, seed: int, steps: int,
                cfg: float, depth: int, branching: int, window_start: int, noise_level: float,
                noise_growth: float, sde_kind: str) -> io.NodeOutput:
        config = tree_config(steps, depth, branching, window_start, noise_level, noise_growth, sde_kind)
        leaves, tree = grow_tree(model, positive, negative, latent, seed, steps, cfg, config)
        return io.NodeOutput({"samples": leaves}, tree)


class TreeRPOFlowSDESampler(io.ComfyNode):
    """A SAMPLER for SamplerCustomAdvanced: ODE outside a window of SDE steps (MixGRPO's sampler)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOFlowSDESampler", display_name="TreeRPO Flow SDE Sampler", category=CATEGORY,
            description="A sampler for SamplerCustomAdvanced that adds a little fresh noise during a few "
                        "steps (from 'first noisy step', for 'noisy steps' steps) and denoises normally "
                        "elsewhere: varied images that stay close to the normal result. (A flow-matching "
                        "SDE inside the window, ODE outside: MixGRPO's sampler, the one training uses.)",
            inputs=[io.Int.Input("window_start", display_name="first noisy step", default=0, min=0, max=199,
                                 tooltip="the first step that adds noise (window start)"),
                    io.Int.Input("window_size", display_name="noisy steps", default=4, min=1, max=200,
                                 tooltip="how many steps add noise (window size)"),
                    io.Float.Input("noise_level", display_name="noise strength", default=0.7, min=0.0,
                                   max=2.0, step=0.05,
                                   tooltip="how much noise those steps add (SDE noise level)"),
                    io.Combo.Input("sde_kind", display_name="noise form (SDE)", options=list(SDE_KINDS),
                                   default="flow_grpo", tooltip=SDE_HELP)],
            outputs=[io.Sampler.Output()])

    @classmethod
    def execute(cls, window_start: int, window_size: int, noise_level: float, sde_kind: str) -> io.NodeOutput:
        holder: dict[str, Any] = {}

        def run(velocity: Any, x: torch.Tensor, sigmas: torch.Tensor, seed: int, preview: Any = None
                ) -> torch.Tensor:
            steps = int(sigmas.shape[-1]) - 1
            config = MixGRPOConfig(steps=steps, window_start=window_start, window_size=window_size,
                                   group_size=1, noise_level=noise_level, sde_kind=sde_kind)
            if window_start > config.max_window_start:
                raise ValueError(f"window_start {window_start} + window_size {window_size} does not fit "
                                 f"{steps} steps")
            return run_plan(config, window_start, holder)(velocity, x, sigmas, seed, preview)

        return io.NodeOutput(ksampler(run))


def encode_prompt(text: str, clip: Any, embedded: Any) -> list:
    """CONDITIONING of ``text`` as CLIPTextEncode makes it (``clip``), or TreeRPO Embedded Text Encode."""
    if embedded is not None:
        return embedded_conditioning(embedded, text)
    return clip.encode_from_tokens_scheduled(clip.tokenize(text))


class TreeRPOBestOfTree(io.ComfyNode):
    """Grow a tree for one prompt, score its leaves with a reward, return the best image and all."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOBestOfTree", display_name="TreeRPO Best of Tree", category=CATEGORY,
            description="Better images without training: makes branching^depth variations of one image "
                        "that share their first steps (as TreeRPO Tree Sampler), scores each against the "
                        "prompt with a reward, and returns the best one, all of them and their scores. "
                        "After a run the node shows every variation with its score, the best one framed. "
                        "The prompt is written once: it is both what is drawn and what is scored.",
            inputs=[*_sampling_inputs(conditioning=False),
                    io.String.Input("prompt", display_name="prompt", multiline=True,
                                    default="two red circles",
                                    placeholder="what to draw (needed: the reward scores the images "
                                                "against it)",
                                    tooltip="what to draw; the reward scores the images against it"),
                    io.String.Input("negative_prompt", display_name="negative prompt", multiline=True,
                                    default="",
                                    placeholder="negative prompt: what to avoid (used when cfg is above 1)",
                                    tooltip="what to avoid (used when cfg is above 1)"),
                    *reward_inputs(),
                    io.Clip.Input("clip", display_name="text encoder (clip)", optional=True,
                                  tooltip="the text encoder of a model from ComfyUI's loaders"),
                    EmbeddedType.Input("embedded", display_name="embedded model", optional=True,
                                       tooltip="the embedded model's output: encodes the prompt and decodes"),
                    io.Vae.Input("vae", display_name="image decoder (vae)", optional=True,
                                 tooltip="the decoder of a model from ComfyUI's loaders")],
            outputs=[io.Image.Output(display_name="best"), io.Image.Output(display_name="leaves"),
                     io.Float.Output(display_name="scores", is_output_list=True),
                     io.String.Output(display_name="table")],
            is_output_node=True)

    @classmethod
    def validate_inputs(cls, steps: int, depth: int, branching: int, window_start: int, prompt: str,
                        reward: str, reward_mix: str, reward_weights: str,
                        input_types: dict | None = None) -> bool:
        check_tree_inputs(cls.define_schema(), steps, depth, branching, window_start)  # raises: reported once
        if not prompt.strip():
            raise ValueError("prompt: write what to draw; the reward scores every image against it")
        linked = set(input_types or {})
        if "embedded" in linked:
            if "clip" in linked or "vae" in linked:
                raise ValueError("embedded: connect either the embedded model's output or a clip and a vae, "
                                 "not both")
            check_embedded_text(prompt, "prompt")
        elif "clip" not in linked or "vae" not in linked:
            missing = "clip" if "clip" not in linked else "vae"
            raise ValueError(f"{missing}: connect the model's {missing} (or, for the embedded model, its "
                             "'embedded' output instead of clip and vae)")
        check_reward_inputs(reward, reward_mix, reward_weights, (prompt, "prompt"))
        return True

    @classmethod
    def execute(cls, model: Any, latent: dict, seed: int, steps: int, cfg: float, depth: int, branching: int,
                window_start: int, noise_level: float, prompt: str, negative_prompt: str, reward: str,
                reward_mix: str, reward_weights: str, clip: Any = None, embedded: Any = None,
                vae: Any = None) -> io.NodeOutput:
        if latent["samples"].shape[0] != 1:
            raise ValueError(f"best of tree grows one tree: give a latent of batch 1, "
                             f"not {latent['samples'].shape[0]}")
        if embedded is None and (clip is None or vae is None):
            raise ValueError("connect a clip and a vae (or the embedded model's 'embedded' output)")
        config = tree_config(steps, depth, branching, window_start, noise_level)
        positive = encode_prompt(prompt, clip, embedded)
        negative = encode_prompt(negative_prompt, clip, embedded)
        leaves, _ = grow_tree(model, positive, negative, latent, seed, steps, cfg, config)
        images = embedded.decode(leaves).permute(0, 2, 3, 1) if embedded is not None else vae.decode(leaves)
        images = images.reshape(-1, *images.shape[-3:]).float().cpu().clamp(0.0, 1.0)
        spec = reward_spec(reward, reward_mix)
        mix = RewardMix(spec, parse_weights(reward_weights, models_directory(), model_roots()))
        out = mix(images.permute(0, 3, 1, 2), [prompt.strip()] * images.shape[0])
        scores = out["reward"].float()
        best = int(torch.argmax(scores))
        table = "\n".join(["leaf\treward", *(f"{i}\t{float(v):.4f}" + ("\t<- best" if i == best else "")
                                            for i, v in enumerate(scores))])
        values = [float(v) for v in scores]
        return io.NodeOutput(images[best:best + 1], images, values, table,
                             ui=score_view(images, values, best, spec, table))


def score_view(images: torch.Tensor, scores: list[float], best: int, reward: str,
               table: str) -> dict[str, list]:
    """The node's UI output: the score table as text, and for the pack's web extension
    (web/best_of_tree.js), which draws the leaves as a grid with their scores and the best one marked,
    small previews of the leaves (temp folder), their scores, the best leaf and the reward's name."""
    return {"text": [table], "treerpo_leaves": preview_images(images), "treerpo_scores": scores,
            "treerpo_best": [best], "treerpo_reward": [reward]}


NODES: list[type[io.ComfyNode]] = [TreeRPOTreeSampler, TreeRPOFlowSDESampler, TreeRPOBestOfTree]
