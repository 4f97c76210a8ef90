"""The reward scorer node: IMAGE and prompts through the trainer's rewards (the same registry and
weighted mix as training), as a FLOAT list and a readable table."""

from __future__ import annotations

from typing import Any

from ..trainer.inference.score import format_scores
from ..trainer.rewards.mix import RewardMix
from ._comfy import io, model_roots, models_directory
from .inputs import check_rewards, parse_lines, parse_weights

CATEGORY = "TreeRPO/rewards"


def prompts_for(text: str, count: int) -> list[str]:
    """One prompt line per image, or a single line for all of them."""
    lines = parse_lines(text)
    if len(lines) == 1:
        return lines * count
    if len(lines) != count:
        raise ValueError(f"{count} images but {len(lines)} prompt lines: "
                         "give one line per image or one for all")
    return lines


class TreeRPORewardScore(io.ComfyNode):
    """Score images against their prompts with registered rewards (names, weights, local weights)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPORewardScore", display_name="TreeRPO Reward Score", category=CATEGORY,
            description="Rewards of the trainer by name: scene, ocr, hps-v2.1, pickscore, imagereward, "
                        "clip; several as name:weight,... (a 'weighted' column sums them).",
            inputs=[io.Image.Input("images"),
                    io.String.Input("prompts", multiline=True, default="two red circles",
                                    tooltip="one line per image, or one line for all"),
                    io.String.Input("reward", default="scene"),
                    io.String.Input("reward_weights", multiline=True, default="",
                                    tooltip="name=path lines: the local weights of model rewards")],
            outputs=[io.Float.Output(display_name="scores", is_output_list=True),
                     io.String.Output(display_name="table")],
            is_output_node=True)

    @classmethod
    def validate_inputs(cls, reward: str, reward_weights: str) -> bool | str:
        try:
            check_rewards(reward, reward_weights, models_directory(), model_roots())
        except (ValueError, FileNotFoundError) as err:
            return str(err)
        return True

    @classmethod
    def execute(cls, images: Any, prompts: str, reward: str, reward_weights: str) -> io.NodeOutput:
        batch = images.permute(0, 3, 1, 2).float()  # ComfyUI IMAGE: [B, H, W, 3] in [0, 1]
        mix = RewardMix(reward, parse_weights(reward_weights, models_directory(), model_roots()))
        out = mix(batch, prompts_for(prompts, batch.shape[0]))
        names = mix.names
        scores = {names[0]: out["reward"]} if len(names) == 1 else {
            **{n: out[f"reward_{n}"] for n in names}, "weighted": out["reward"]}
        columns = list(scores)
        table = format_scores([str(i) for i in range(batch.shape[0])], scores)
        final = scores[columns[-1]]
        return io.NodeOutput([float(v) for v in final], table, ui={"text": [table]})


NODES: list[type[io.ComfyNode]] = [TreeRPORewardScore]
