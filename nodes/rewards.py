"""The reward scorer node: IMAGE and prompts through the trainer's rewards (the same registry and
weighted mix as training), as a FLOAT list and a readable table."""

from __future__ import annotations

from typing import Any

from ..trainer.inference.score import format_scores
from ..trainer.rewards.mix import RewardMix
from .comfy_door import io, model_roots, models_directory
from .inputs import parse_lines, parse_weights, reward_spec
from .widgets import check_reward_inputs, reward_inputs

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
            description="Scores images against their prompts with the same rewards training uses, and "
                        "shows a table (one row per image; with reward = mix, a column per reward and their "
                        "weighted sum).",
            inputs=[io.Image.Input("images", display_name="images", tooltip="the images to score"),
                    io.String.Input("prompts", display_name="prompts", multiline=True,
                                    default="two red circles",
                                    tooltip="what each image should show: one line per image, or one line "
                                            "for all"),
                    *reward_inputs()],
            outputs=[io.Float.Output(display_name="scores", is_output_list=True),
                     io.String.Output(display_name="table")],
            is_output_node=True)

    @classmethod
    def validate_inputs(cls, prompts: str, reward: str, reward_mix: str, reward_weights: str) -> bool:
        check_reward_inputs(reward, reward_mix, reward_weights, (prompts, "prompts"))  # raises: reported once
        return True

    @classmethod
    def execute(cls, images: Any, prompts: str, reward: str, reward_mix: str, reward_weights: str
                ) -> io.NodeOutput:
        batch = images.permute(0, 3, 1, 2).float()  # ComfyUI IMAGE: [B, H, W, 3] in [0, 1]
        mix = RewardMix(reward_spec(reward, reward_mix),
                        parse_weights(reward_weights, models_directory(), model_roots()))
        out = mix(batch, prompts_for(prompts, batch.shape[0]))
        names = mix.names
        scores = {names[0]: out["reward"]} if len(names) == 1 else {
            **{n: out[f"reward_{n}"] for n in names}, "weighted": out["reward"]}
        columns = list(scores)
        table = format_scores([str(i) for i in range(batch.shape[0])], scores)
        final = scores[columns[-1]]
        return io.NodeOutput([float(v) for v in final], table, ui={"text": [table]})


NODES: list[type[io.ComfyNode]] = [TreeRPORewardScore]
