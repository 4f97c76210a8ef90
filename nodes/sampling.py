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
from ._comfy import flow_family, guided_sample, io, ksampler, model_roots, model_sigmas, models_directory
from .embedded import EmbeddedType
from .inputs import check_rewards, parse_weights

TreeType = io.Custom("TREERPO_TREE")
CATEGORY = "TreeRPO/sampling"


@dataclass
class SampledTree:
    """The TREE output: the rollout (nodes, edges, per-edge log-probabilities, the forwards' sigmas)
    and the seeds of its branching noise, for training or inspection downstream."""

    tree: Tree
    seeds: list[int]
    sigmas: torch.Tensor


def tree_config(steps: int, depth: int, branching: int, window_start: int, noise_level: float,
                noise_growth: float = 0.5, sde_kind: str = "flow_grpo") -> TreeConfig:
    config = TreeConfig(steps=steps, window_start=window_start, depth=depth, branching=branching,
                        noise_level=noise_level, noise_growth=noise_growth, sde_kind=sde_kind, tail="euler")
    if not 0 <= window_start <= config.max_window_start:
        raise ValueError(f"window_start {window_start} out of range: with {steps} steps and depth {depth} "
                         f"it must be in [0, {config.max_window_start}]")
    return config


def run_plan(config: TreeConfig | MixGRPOConfig, window: int, holder: dict[str, Any]) -> Any:
    """A sampler body: the plan on ComfyUI's sigmas, the rows of ``x`` as prompts whose root noise is
    ``x`` itself, branching noise from ``seed + row``; returns the leaves."""

    def run(velocity: Any, x: torch.Tensor, sigmas: torch.Tensor, seed: int) -> torch.Tensor:
        grid = sigmas.detach().float().cpu()
        plan = build_plan(config, grid, window, seed=seed)
        seeds = [seed + row for row in range(x.shape[0])]
        tree = rollout(velocity, None, plan, seeds, tuple(x.shape[1:]),
                       noise=x.detach().float().cpu().unsqueeze(1), device=x.device)
        holder["tree"] = SampledTree(tree, seeds, grid)
        return tree.leaf_latents.to(x.dtype)

    return run


def _sampling_inputs() -> list:
    return [io.Model.Input("model"), io.Conditioning.Input("positive"), io.Conditioning.Input("negative"),
            io.Latent.Input("latent", tooltip="its batch rows are grown into trees one by one"),
            io.Int.Input("seed", default=0, min=0, max=2**31 - 1, control_after_generate=True),
            io.Int.Input("steps", default=10, min=2, max=200),
            io.Float.Input("cfg", default=1.0, min=0.0, max=30.0, step=0.1),
            io.Int.Input("depth", default=3, min=1, max=8, tooltip="branching SDE steps"),
            io.Int.Input("branching", default=2, min=1, max=8),
            io.Int.Input("window_start", default=0, min=0, max=199, tooltip="the first branching step"),
            io.Float.Input("noise_level", default=0.6, min=0.0, max=2.0, step=0.05)]


def grow_tree(model: Any, positive: Any, negative: Any, latent: dict, seed: int, steps: int, cfg: float,
              config: TreeConfig) -> tuple[torch.Tensor, SampledTree]:
    flow_family(model)  # the tree's SDE is rectified flow's: anything else is refused by name
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
            description="ODE to window_start, then depth SDE steps branching into branching children "
                        "each (noise growing with depth), then ODE: branching^depth leaves per row.",
            inputs=[*_sampling_inputs(),
                    io.Float.Input("noise_growth", default=0.5, min=0.0, max=4.0, step=0.05),
                    io.Combo.Input("sde_kind", options=list(SDE_KINDS), default="flow_grpo")],
            outputs=[io.Latent.Output(display_name="leaves"), TreeType.Output(display_name="tree")])

    @classmethod
    def validate_inputs(cls, steps: int, depth: int, window_start: int) -> bool | str:
        try:
            tree_config(steps, depth, 2, window_start, 0.6)
        except ValueError as err:
            return str(err)
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
            description="Flow-matching SDE (the marginal-preserving step the trainer uses) inside "
                        "[window_start, window_start + window_size), ODE elsewhere.",
            inputs=[io.Int.Input("window_start", default=0, min=0, max=199),
                    io.Int.Input("window_size", default=4, min=1, max=200),
                    io.Float.Input("noise_level", default=0.7, min=0.0, max=2.0, step=0.05),
                    io.Combo.Input("sde_kind", options=list(SDE_KINDS), default="flow_grpo")],
            outputs=[io.Sampler.Output()])

    @classmethod
    def execute(cls, window_start: int, window_size: int, noise_level: float, sde_kind: str) -> io.NodeOutput:
        holder: dict[str, Any] = {}

        def run(velocity: Any, x: torch.Tensor, sigmas: torch.Tensor, seed: int) -> torch.Tensor:
            steps = int(sigmas.shape[-1]) - 1
            config = MixGRPOConfig(steps=steps, window_start=window_start, window_size=window_size,
                                   group_size=1, noise_level=noise_level, sde_kind=sde_kind)
            if window_start > config.max_window_start:
                raise ValueError(f"window_start {window_start} + window_size {window_size} does not fit "
                                 f"{steps} steps")
            return run_plan(config, window_start, holder)(velocity, x, sigmas, seed)

        return io.NodeOutput(ksampler(run))


class TreeRPOBestOfTree(io.ComfyNode):
    """Grow a tree for one prompt, score its leaves with a reward, return the best image and all."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOBestOfTree", display_name="TreeRPO Best of Tree", category=CATEGORY,
            description="Better images without training: branching^depth candidates that share their "
                        "early steps, scored by a reward; the best one is returned.",
            inputs=[*_sampling_inputs(),
                    io.String.Input("prompt", multiline=True, default="two red circles",
                                    tooltip="the text the reward reads"),
                    io.String.Input("reward", default="scene"),
                    io.String.Input("reward_weights", multiline=True, default=""),
                    EmbeddedType.Input("embedded", optional=True, tooltip="decoder of the embedded model"),
                    io.Vae.Input("vae", optional=True, tooltip="decoder of a latent model")],
            outputs=[io.Image.Output(display_name="best"), io.Image.Output(display_name="leaves"),
                     io.Float.Output(display_name="scores", is_output_list=True),
                     io.String.Output(display_name="table")],
            is_output_node=True)

    @classmethod
    def validate_inputs(cls, steps: int, depth: int, window_start: int, reward: str,
                        reward_weights: str) -> bool | str:
        try:
            tree_config(steps, depth, 2, window_start, 0.6)
            check_rewards(reward, reward_weights, models_directory(), model_roots())
        except (ValueError, FileNotFoundError) as err:
            return str(err)
        return True

    @classmethod
    def execute(cls, model: Any, positive: Any, negative: Any, latent: dict, seed: int, steps: int,
                cfg: float, depth: int, branching: int, window_start: int, noise_level: float, prompt: str,
                reward: str, reward_weights: str, embedded: Any = None, vae: Any = None) -> io.NodeOutput:
        if latent["samples"].shape[0] != 1:
            raise ValueError(f"best of tree grows one tree: give a latent of batch 1, "
                             f"not {latent['samples'].shape[0]}")
        if (embedded is None) == (vae is None):
            raise ValueError("connect exactly one decoder: 'embedded' (embedded model) or 'vae'")
        config = tree_config(steps, depth, branching, window_start, noise_level)
        leaves, _ = grow_tree(model, positive, negative, latent, seed, steps, cfg, config)
        if embedded is not None:
            images = embedded.decode(leaves).permute(0, 2, 3, 1)
        else:
            images = vae.decode(leaves)
        images = images.float().cpu().clamp(0.0, 1.0)
        mix = RewardMix(reward, parse_weights(reward_weights, models_directory(), model_roots()))
        out = mix(images.permute(0, 3, 1, 2), [prompt.strip()] * images.shape[0])
        scores = out["reward"].float()
        best = int(torch.argmax(scores))
        table = "\n".join(["leaf\treward", *(f"{i}\t{float(v):.4f}" + ("\t<- best" if i == best else "")
                                            for i, v in enumerate(scores))])
        return io.NodeOutput(images[best:best + 1], images, [float(v) for v in scores], table,
                             ui={"text": [table]})


NODES: list[type[io.ComfyNode]] = [TreeRPOTreeSampler, TreeRPOFlowSDESampler, TreeRPOBestOfTree]
