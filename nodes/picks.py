"""Your own taste as the reward: sample trees of variations to pick from, then train a LoRA on the picks.

The graph never waits for a click. TreeRPO Sample Trees to Pick stores its trees in a picks folder
(``trainer.preferences.store``) and ends; the artist picks leaves on the node's panel
(web/pick_leaves.js, served by ``picks_routes``), each save written to disk at once; TreeRPO Train LoRA
from Picks then trains on that folder (``trainer.training.session.train_from_picks``). Both are thin
wrappers over the trainer's code, as the other nodes are.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from ..trainer.config.picks_budget import PICKS_BUDGET
from ..trainer.guard.levels import DEFAULT_KEEP, GUARDED_PICKS_WEIGHT, KEEP_LEVELS
from ..trainer.preferences.store import PickStore
from ..trainer.rewards.registry import PICKS
from ..trainer.training.from_picks import model_id, store_trees
from ..trainer.training.guarded import held_out_prompts
from ..trainer.training.plans import check_plan, picking_jobs, picking_plan, sampler_tree_config
from ..trainer.training.session import TrainingState, picks_iterations, train_from_picks
from .budget import MAX_LEAVES, check_memory, stored_latents
from .checkpoints import outputs as guarded_outputs
from .comfy_door import (
    embedded_model_patcher,
    embedded_policy_of,
    flow_family,
    io,
    model_roots,
    models_directory,
    node_progress,
    tree_memory,
)
from .inputs import about, check_embedded_text, check_ranges, parse_lines, parse_weights
from .picks_folders import PICKS_ROOT
from .picks_folders import picks_folder as folder_of
from .sampling import check_tree_inputs
from .training import (
    RunType,
    check_continuable,
    check_training_budget,
    comfy_lora,
    comfy_policy,
    is_embedded,
    iteration_reporter,
    model_defaults,
    model_inputs,
    node_config,
    trained_outputs,
    training_outputs,
)
from .widgets import check_reward_inputs, reward_names, settings_input

CATEGORY = "TreeRPO/picks"
NO_GUARD = "none"
MODES = ["reward", "online"]
KEEP_OFF = "off (fixed weight)"
KEEP_OPTIONS = [*KEEP_LEVELS, KEEP_OFF]


def folder_input() -> io.String.Input:
    return io.String.Input("picks_folder", display_name="picks folder (a name)", default="my_taste",
                           tooltip=f"a plain name: the trees and your picks are kept in ComfyUI's "
                                   f"output/{PICKS_ROOT}/<name>; use one folder per model and image size")


def picks_model_inputs() -> list:
    """The optional inputs that say how to encode and decode for a loader's MODEL (as Train LoRA's)."""
    return model_inputs("decodes the images you pick from", "image size (empty latent)",
                        "an empty latent of the size to draw (default 512 x 512)")


class TreeRPOSampleToPick(io.ComfyNode):
    """Grow trees of variations per prompt and store them in a picks folder for the picking panel."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TreeRPOSampleToPick", display_name="TreeRPO Sample Trees to Pick", category=CATEGORY,
            description="Draws trees of variations for you to choose from: for each prompt, 'trees per "
                        "prompt' trees of branching^depth variations each. They are kept in the picks folder "
                        "(ComfyUI's output/treerpo_picks/<name>), and after the run this node shows them one "
                        "tree at a time: click the images you like (shift-click or right-click: dislike), "
                        "Enter saves and shows the next tree. Each save is on disk at once. Then train on "
                        "your picks with TreeRPO Train LoRA from Picks. Running again with another seed adds "
                        "more trees.",
            inputs=[io.Model.Input("model", display_name="model",
                                   tooltip="the embedded model (TreeRPO Embedded Model Loader), or a flow "
                                           "model (FLUX, SD3, Qwen-Image...) with its clip and vae"),
                    io.String.Input("prompts", display_name="prompts", multiline=True,
                                    default="two red circles\na blue square on the left",
                                    placeholder="what to draw, one prompt per line",
                                    tooltip="what to draw, one prompt per line"),
                    io.Int.Input("trees_per_prompt", display_name="trees per prompt", default=4, min=1,
                                 max=256,
                                 tooltip="how many trees (sets of variations to pick from) per prompt"),
                    io.Int.Input("seed", display_name="seed", default=0, min=0, max=2**31 - 1,
                                 tooltip="the same seed and inputs draw the same trees; change it to add new "
                                         "ones"),
                    io.Int.Input("steps", display_name="steps", default=10, min=2, max=200,
                                 tooltip="denoising steps of each image"),
                    io.Int.Input("depth", display_name="splits (depth)", default=3, min=1, max=8,
                                 tooltip="how many times each image splits into variations (tree depth): "
                                         f"branching^depth images per tree, at most {MAX_LEAVES}"),
                    io.Int.Input("branching", display_name="variations per split", default=2, min=1, max=8,
                                 tooltip="how many variations each split makes (branching factor)"),
                    io.Int.Input("window_start", display_name="first split at step", default=0, min=0,
                                 max=199, tooltip="the step of the first split: later splits keep the "
                                                  "variations closer to each other (window start)"),
                    io.Float.Input("noise_level", display_name="variation strength", default=0.6, min=0.0,
                                   max=2.0, step=0.05,
                                   tooltip="how different the variations are (SDE noise level)"),
                    folder_input(),
                    *picks_model_inputs()],
            outputs=[io.Image.Output(display_name="leaves", tooltip="every variation of every tree"),
                     io.String.Output(display_name="picks folder", tooltip="the picks folder's name")],
            is_output_node=True)

    @classmethod
    def validate_inputs(cls, prompts: str, trees_per_prompt: int, steps: int, depth: int, branching: int,
                        window_start: int, picks_folder: str, input_types: dict | None = None) -> bool:
        schema = cls.define_schema()
        check_tree_inputs(schema, steps, depth, branching, window_start)  # raises: reported once
        check_ranges(schema, trees_per_prompt=trees_per_prompt)
        if not parse_lines(prompts):
            raise ValueError("prompts: write what to draw, one prompt per line")
        linked = set(input_types or {})
        if not linked & {"clip", "vae", "latent"}:  # the embedded model (or a missing clip, seen at run time)
            try:
                check_embedded_text(prompts.replace("\n", ", "), "prompts")
            except ValueError as err:
                raise ValueError(f"{err} (for another model than the embedded one, connect its clip and "
                                 "vae)") from None
        with about("picks_folder"):
            folder_of(picks_folder)
        return True

    @classmethod
    def execute(cls, model: Any, prompts: str, trees_per_prompt: int, seed: int, steps: int, depth: int,
                branching: int, window_start: int, noise_level: float, picks_folder: str,
                clip: Any = None, vae: Any = None, latent: dict | None = None) -> io.NodeOutput:
        folder = folder_of(picks_folder)
        config = sampler_tree_config(steps, depth, branching, window_start, noise_level)
        if is_embedded(model):
            policy, shift = embedded_policy_of(model)
            identity = model_id(policy, "embedded")
        else:
            family = flow_family(model)
            empty = {"samples": torch.zeros(1, 4, 64, 64)}
            need, shape, _ = tree_memory(model, latent if latent is not None else empty,
                                         stored_latents(depth, branching), config.leaves_per_tree)
            check_memory(need, depth, branching, 1, shape)  # before anything is sampled
            policy = comfy_policy(model, clip, vae, latent, family=family)
            shift = family.shift
            identity = model_id(policy, family.name)
        plan = picking_plan(steps, depth, branching, window_start, noise_level, shift, seed,
                            policy.image_tokens, policy.latent_unshuffle)
        jobs = picking_jobs(parse_lines(prompts), trees_per_prompt, seed)
        store = PickStore(folder, create=True)
        report = node_progress(len(jobs))
        sampler = {"steps": steps, "depth": depth, "branching": branching, "window_start": window_start,
                   "noise_level": noise_level, "shift": shift}
        ids = []
        for done, (prompt, tree_seed) in enumerate(jobs, start=1):
            ids += store_trees(policy, store, [prompt], [tree_seed], plan, identity, sampler)
            report(done, f"tree {done}/{len(jobs)} stored in {PICKS_ROOT}/{folder.name}")
        leaves = torch.cat([store.load_images(t) for t in ids]).permute(0, 2, 3, 1).contiguous()
        ui = {"treerpo_picks": [folder.name], "treerpo_trees": ids}
        return io.NodeOutput(leaves, folder.name, ui=ui)


def _weights_words() -> str:
    """The shipped picks weights as the tooltip says them ('0.4'; '0.3 or 0.5, one training each'), read
    from the one budget so that the text cannot part from what the node trains."""
    words = " or ".join(f"{w:g}" for w in PICKS_BUDGET.weights)
    return words if len(PICKS_BUDGET.weights) == 1 else f"{words}, one training each,"


def keep_word(keep: str) -> str:
    """The trainer's ``guard.keep`` for the widget's choice."""
    return "off" if keep == KEEP_OFF else keep


def picks_spec(guard_reward: str, picks_weight: float, keep: str = KEEP_OFF) -> str:
    """The trainer's reward: the picks, and the guard reward with the rest of the weight. Under the
    guard it is written at ``GUARDED_PICKS_WEIGHT``; the guard then trains at each of ``guard.weights``
    (``PICKS_BUDGET.weights`` unless the settings box says otherwise) and keeps one run."""
    weight = picks_weight if keep_word(keep) == "off" else GUARDED_PICKS_WEIGHT
    if guard_reward == NO_GUARD or weight >= 1.0:
        return f"{PICKS}:1"
    return f"{PICKS}:{weight:g},{guard_reward}:{1.0 - weight:g}"


def folder_prompts(store: PickStore, labelled: list[str]) -> list[str]:
    """The prompts of the labelled trees, each once, in order: what the LoRA practises on."""
    return list(dict.fromkeys(store.meta(t).prompt for t in labelled))


def existing_store(name: str) -> PickStore:
    """The picks folder of that name, or one line saying there is none yet."""
    folder = folder_of(name)
    if not (folder / "trees").is_dir():
        raise ValueError(f"there is no picks folder {name.strip()!r} yet (output/{PICKS_ROOT}/"
                         f"{name.strip()}): sample trees with TreeRPO Sample Trees to Pick and pick some "
                         "first")
    return PickStore(folder)


class TreeRPOTrainFromPicks(io.ComfyNode):
    """Train a LoRA toward the leaves a person picked in a picks folder."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        guards = [NO_GUARD, *reward_names()]
        return io.Schema(
            node_id="TreeRPOTrainFromPicks", display_name="TreeRPO Train LoRA from Picks", category=CATEGORY,
            description="Teaches the model your taste: trains a LoRA on the images you picked in a picks "
                        "folder (made by TreeRPO Sample Trees to Pick). By default it first learns a small "
                        "scorer of what you like from your picks, then trains as TreeRPO Train LoRA does "
                        "with that scorer as the reward, on the prompts of your trees; a guard reward (e.g. "
                        "scene for the embedded model) keeps the images following the prompt. Outputs work "
                        "with TreeRPO Save LoRA and ComfyUI's LoRA nodes.",
            inputs=[io.Model.Input("model", display_name="model",
                                   tooltip="the model the trees were drawn with (the same weights: another "
                                           "model's folder is refused)"),
                    folder_input(),
                    io.Int.Input("iterations", display_name="training rounds",
                                 default=PICKS_BUDGET.iterations, min=1, max=100000,
                                 tooltip="how many training rounds this node runs (iterations); while "
                                         "it keeps following the prompt, this many at each weight of "
                                         "your picks it tries"),
                    io.Combo.Input("guard_reward", display_name="keep following the prompt with",
                                   options=guards, default="scene",
                                   tooltip="a reward that keeps the images following their prompt while "
                                           "they move toward your taste (scene: the embedded model's "
                                           "checker); none: your picks alone"),
                    # optional since 0.2.0: a graph saved before the guard has none and keeps its fixed
                    # weight (KEEP_OFF); a node dragged in new starts at DEFAULT_KEEP (CHANGELOG.md)
                    io.Combo.Input("keep_following", display_name="keep following the prompt",
                                   options=KEEP_OPTIONS, default=DEFAULT_KEEP, optional=True,
                                   tooltip="how much following the prompt you will trade for your "
                                           "taste: strictly / closely / loosely let the guard reward fall "
                                           "by at most 0.01 / 0.02 / 0.05 (scene reward; another guard: "
                                           "the same share of its spread). Training weighs your picks "
                                           f"{_weights_words()} against it, keeps a checkpoint every few "
                                           "rounds and returns the one with the most of your taste within "
                                           "that; the "
                                           "plot on the node shows what was measured and kept. off: a "
                                           "fixed weight (below)"),
                    io.Float.Input("picks_weight", display_name="weight of your picks (when off)",
                                   default=0.15, min=0.05, max=1.0, step=0.05,
                                   tooltip="experts, only when 'keep following the prompt' is off: how much "
                                           "your picks count against the guard reward (1: only your picks)"),
                    io.String.Input("reward_weights", display_name="guard reward weight files",
                                    multiline=True, default="",
                                    placeholder="only for a model guard reward: name=path per line, e.g. "
                                                "hps-v2.1=rewards/HPS_v2.1_compressed.pt",
                                    tooltip="where the guard reward's weights are, name=path per line (under "
                                            "ComfyUI's models folder); empty for scene or ocr"),
                    io.Combo.Input("mode", display_name="how to learn (mode)", options=MODES,
                                   default="reward",
                                   tooltip="reward: learn a scorer of your taste from the picks, then train "
                                           "on fresh images it scores (the default, better measured); "
                                           "online: train directly on the picked trees"),
                    io.Int.Input("seed", display_name="seed", default=0, min=0, max=2**31 - 1,
                                 tooltip="the same seed, picks and inputs train the same LoRA"),
                    settings_input(),
                    RunType.Input("previous", display_name="continue run", optional=True,
                                  tooltip="continue this run (the run output of another training node)"),
                    *picks_model_inputs()],
            outputs=training_outputs())

    @classmethod
    def validate_inputs(cls, picks_folder: str, guard_reward: str, picks_weight: float, reward_weights: str,
                        mode: str, settings: str, keep_following: str = KEEP_OFF) -> bool:
        weights = {}
        if guard_reward != NO_GUARD:  # first: missing weights are named on the first run, not after picking
            weights = check_reward_inputs(guard_reward, "", reward_weights)
        with about("picks_folder"):
            store = existing_store(picks_folder)
            labelled = store.check()  # empty, unlabelled, mixed sizes or models, a pick that says nothing
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not a mode; choose reward or online")
        if keep_following not in KEEP_OPTIONS:
            raise ValueError(f"keep_following: {keep_following!r} is not a choice; choose "
                             + ", ".join(KEEP_OPTIONS))
        if keep_word(keep_following) != "off" and guard_reward == NO_GUARD:
            raise ValueError("keep_following: keeping to the prompt needs a guard reward to measure it "
                             "(choose one, e.g. scene for the embedded model), or set it to off")
        if keep_word(keep_following) != "off" and mode == "online":
            raise ValueError("keep_following: the guard works with mode reward (online mode trains on the "
                             "picked trees only): choose mode reward, or set it to off")
        with about("settings"):
            config = picks_config(1, [], guard_reward, picks_weight, weights, str(store.root), mode, 0,
                                  settings, PICKS_BUDGET.overrides(), keep_following)
            check_plan(config)
            check_training_budget(config)
            if keep_word(keep_following) != "off" and config.guard.validation == "held_out":
                held_out_prompts(folder_prompts(store, labelled), config.guard.seed)  # too few prompts
        return True

    @classmethod
    def fingerprint_inputs(cls, picks_folder: str, **_: Any) -> str:
        """Run again when the picks changed (new saves), though no widget did."""
        try:
            root = folder_of(picks_folder)
        except ValueError:
            return ""
        saves = sorted(str(p.relative_to(root)) for p in root.glob("trees/*/picks/*.json"))
        return hashlib.sha256("\n".join(saves).encode()).hexdigest()

    @classmethod
    def execute(cls, model: Any, picks_folder: str, iterations: int, guard_reward: str, picks_weight: float,
                reward_weights: str, mode: str, seed: int, settings: str, keep_following: str = KEEP_OFF,
                previous: TrainingState | None = None, clip: Any = None, vae: Any = None,
                latent: dict | None = None) -> io.NodeOutput:
        folder = folder_of(picks_folder)
        weights = parse_weights(reward_weights, models_directory(), model_roots())
        store = PickStore(folder)
        if is_embedded(model):
            policy, shift = embedded_policy_of(model)
            policy = policy.fresh_copy()
            with about("picks_folder"):  # before any training: the trees must be this model's
                labelled = store.check(model_id(policy, "embedded"))
            config = picks_config(iterations, folder_prompts(store, labelled), guard_reward, picks_weight,
                                  weights, str(folder), mode, seed, settings, PICKS_BUDGET.overrides(),
                                  keep_following)
            on_iteration = iteration_reporter(picks_iterations(config, iterations, previous))
            run = train_from_picks(policy, folder, config, iterations, previous, on_iteration)
            if run.guard is not None:
                return guarded_outputs(model, run, run.guard.choice, shift)
            return io.NodeOutput(embedded_model_patcher(run.policy, shift), run.policy, run, comfy_lora(run))

        family = flow_family(model)
        check_continuable(model, previous)
        defaults = model_defaults(model, family)
        probe = picks_config(iterations, [], guard_reward, picks_weight, weights, str(folder), mode, seed,
                             settings, defaults, keep_following)
        m = probe.model
        policy = comfy_policy(model, clip, vae, latent, m.guidance, family, m.height, m.width)
        with about("picks_folder"):
            labelled = store.check(model_id(policy, family.name))
        config = picks_config(iterations, folder_prompts(store, labelled), guard_reward, picks_weight,
                              weights, str(folder), mode, seed, settings, defaults, keep_following)
        on_iteration = iteration_reporter(picks_iterations(config, iterations, previous))
        with policy.training(checkpointing=m.gradient_checkpointing):
            run = train_from_picks(policy, folder, config, iterations, previous, on_iteration)
        if run.guard is not None:
            return guarded_outputs(model, run, run.guard.choice, None)
        return trained_outputs(model, run)


def picks_config(iterations: int, prompts: list[str], guard_reward: str, picks_weight: float,
                 weights: dict[str, str], folder: str, mode: str, seed: int, settings: str,
                 defaults: list[str] | None = None, keep: str = KEEP_OFF) -> Any:
    """The trainer's config: the node's widgets, the picks folder as the ``picks`` reward's, and the
    settings box (the mode and guard widgets win over ``picks.mode`` and ``guard.keep`` lines there)."""
    spec = picks_spec(guard_reward, picks_weight, keep)
    return node_config(iterations, prompts, spec, {**weights, PICKS: folder}, "dynamic_treerpo", seed,
                       settings + f"\npicks.mode={mode}\nguard.keep={keep_word(keep)}", defaults or [])


NODES: list[type[io.ComfyNode]] = [TreeRPOSampleToPick, TreeRPOTrainFromPicks]
