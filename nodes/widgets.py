"""Widgets several nodes share, in plain words: the reward choice (a dropdown of the registered rewards,
or a weighted mix typed beside it) and the settings box; and the validation of what they hold, so that
a bad value is refused before anything runs with one message naming its input."""

from __future__ import annotations

import dataclasses
import functools

from ..trainer.config.schema import TrainConfig
from ..trainer.rewards.mix import parse_reward_spec
from ..trainer.rewards.registry import PICKS
from ..trainer.rewards.registry import reward_names as all_reward_names
from .comfy_door import io, model_roots, models_directory
from .inputs import MIX, about, check_rewards, parse_lines, reward_spec

# The `function` reward imports and runs any Python function: a workflow shared on the internet must not
# make a ComfyUI server run code, so it is offered headlessly only (`treerpo train`). `picks` (a personal
# reward fitted on a picks folder) has its own nodes, which confine the folder to ComfyUI's output.
HEADLESS_ONLY = ("function", PICKS)


def reward_names() -> list[str]:
    """The rewards a node offers."""
    return [name for name in all_reward_names() if name not in HEADLESS_ONLY]


REWARD_HELP = {
    "scene": "the embedded model's own checker (shapes, colours, places; no weights needed)",
    "ocr": "reads text in the image (no weights needed)",
    "hps-v2.1": "human preference score (needs its weights file)",
    "pickscore": "human preference score (needs its weights folder)",
    "imagereward": "human preference score (needs its weights folder)",
    "clip": "how well the image matches the prompt (needs a CLIP folder)",
}


def reward_inputs() -> list:
    """``reward`` (a dropdown), ``reward_mix`` (with reward = mix) and ``reward_weights`` (file paths)."""
    names = reward_names()
    described = "; ".join(f"{n}: {REWARD_HELP.get(n, 'a registered reward')}" for n in names)
    return [io.Combo.Input("reward", display_name="scored by (reward)", options=[*names, MIX],
                           default="scene",
                           tooltip=f"what scores the images. {described}; mix: several at once, listed in "
                                   "'reward mix'"),
            io.String.Input("reward_mix", display_name="reward mix (with mix)", default="",
                            tooltip="only with reward = mix: rewards and their weights, "
                                    "e.g. hps-v2.1:0.7, ocr:0.3"),
            io.String.Input("reward_weights", display_name="reward weight files", multiline=True, default="",
                            placeholder="reward weight files, one name=path per line (only for model "
                                        "rewards), e.g. hps-v2.1=rewards/HPS_v2.1_compressed.pt",
                            tooltip="where the weights of model rewards are, one name=path per line, "
                                    "e.g. hps-v2.1=rewards/HPS_v2.1_compressed.pt (under ComfyUI's models "
                                    "folder)")]


def check_prompts_for_scene(text: str, input_name: str) -> None:
    """Each prompt line one the scene reward can read (it scores shapes, colours and places it parses)."""
    from ..trainer.embedded.architecture import known_words
    from ..trainer.embedded.scenes import parse_prompt

    for line in parse_lines(text):
        try:
            parse_prompt(line)
        except ValueError as err:
            why = str(err).split(": ", 1)[-1]
            raise ValueError(f"{input_name}: the scene reward cannot read {line!r} ({why}); "
                             "write scenes like 'two red circles' or 'a blue square on the left and a green "
                             f"triangle on the right' with these words: {' '.join(known_words())}") from None


def check_reward_inputs(reward: str, reward_mix: str, reward_weights: str,
                        prompts: tuple[str, str] | None = None) -> dict[str, str]:
    """The reward choice, its mix and its weight files, and (``(text, input name)``) prompts the scene
    reward can read; each error names its input. Returns the weights paths by reward."""
    if reward != MIX and reward not in reward_names():  # ComfyUI skips its own list check of this input
        raise ValueError(f"reward: {reward!r} is not a reward; choose one of "
                         f"{', '.join(reward_names())} or mix")
    with about("reward_mix"):
        spec = reward_spec(reward, reward_mix)
        names = [term.name for term in parse_reward_spec(spec)]
        headless = [n for n in names if n in HEADLESS_ONLY]
        if headless:
            raise ValueError(f"the {headless[0]!r} reward is not offered here: 'function' runs Python code "
                             "(headless only: treerpo train), 'picks' has its own nodes (TreeRPO Train "
                             "LoRA from Picks)")
    with about("reward_weights"):
        weights = check_rewards(spec, reward_weights, models_directory(), model_roots())
    if prompts is not None and "scene" in names and prompts[0].strip():
        check_prompts_for_scene(*prompts)
    return weights


NODE_WIDGETS = {"iterations", "seed", "strategy", "reward", "reward_weights"}  # the node's own widgets


@functools.cache
def settings_keys() -> tuple[str, ...]:
    """The settings box's keys: each section of the config as ``section.*``, and the plain options."""
    out = []
    for f in dataclasses.fields(TrainConfig):
        if f.name in NODE_WIDGETS:
            continue
        factory = f.default_factory
        sectioned = factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory())
        out.append(f"{f.name}.*" if sectioned else f.name)
    return tuple(out)


def settings_input() -> io.String.Input:
    """The box for every other training option, with its keys listed where an artist looks."""
    return io.String.Input(
        "settings", display_name="more settings", multiline=True, default="",
        placeholder="more options, one key=value per line, e.g.\ntree.depth=3\noptim.lr=0.0003\n"
                    "keys: " + ", ".join(settings_keys()),
        tooltip="more training options, one key=value per line; the keys (as in configs/default.yaml): "
                + ", ".join(settings_keys()))
