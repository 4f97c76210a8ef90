"""``guard.validation``: which prompts the guard measures a picks folder on. ``own`` (the default) measures
the prompts training draws, at other seeds; ``held_out`` keeps a quarter of them out of training and
states the fall's error over those prompts, so that the limit stands for prompts training never saw;
``scenes`` measures generated scenes (nearly every pair its own prompt), none of the folder's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import GuardConfig, TrainConfig
from dynamic_treerpo.trainer.guard.trail import paired_se
from dynamic_treerpo.trainer.training.evaluate import held_out_pairs
from dynamic_treerpo.trainer.training.guarded import (
    folder_validation_pairs,
    held_out_prompts,
    same_prompt_pairs,
)

PROMPTS = [f"{n} {colour} {shape}" for n, shape in (("a", "circle"), ("two", "squares"))
           for colour in ("red", "blue", "green", "yellow")]


def test_held_out_prompts_are_a_quarter_drawn_by_seed() -> None:
    many = [f"a red circle {k}" for k in range(40)]
    held = held_out_prompts(many, 777)
    assert len(held) == 10 and set(held) <= set(many) and len(set(held)) == 10
    assert held == held_out_prompts(many, 777) and held != held_out_prompts(many, 778)
    assert len(held_out_prompts(PROMPTS, 1)) == 4  # at least 4, with 4 left to train on
    assert len(held_out_prompts(PROMPTS + PROMPTS, 1)) == 4  # a prompt seen twice counts once


def test_held_out_refuses_a_folder_of_too_few_prompts_in_one_line() -> None:
    with pytest.raises(ValueError) as err:
        held_out_prompts(PROMPTS[:7], 777)
    message = str(err.value)
    assert "\n" not in message
    assert message == ("guard.validation: held_out keeps 4 prompts out of training to validate on and needs "
                       "at least 8 distinct prompts; these picks have 7: label trees of more prompts, or use "
                       "guard.validation: own")


def test_the_folder_validates_on_its_own_prompts_or_on_the_held_out_ones() -> None:
    own = load_config(TrainConfig, None, ["guard.pairs=16"])
    assert own.guard.validation == "own"
    pairs = folder_validation_pairs(PROMPTS, own)
    assert pairs == same_prompt_pairs(PROMPTS, own) and {p.prompt for p in pairs} == set(PROMPTS)
    held = load_config(TrainConfig, None, ["guard.pairs=16", "guard.validation=held_out"])
    pairs = folder_validation_pairs(PROMPTS, held)
    assert len(pairs) == 16 and {p.prompt for p in pairs} == set(held_out_prompts(PROMPTS, held.guard.seed))
    assert [p.seed for p in pairs] == [p.seed for p in same_prompt_pairs(PROMPTS, held)]  # the same seeds
    scenes = load_config(TrainConfig, None, ["guard.pairs=16", "guard.validation=scenes"])
    pairs = folder_validation_pairs(PROMPTS, scenes)
    assert pairs == held_out_pairs(16, scenes.guard.seed, exclude=PROMPTS)
    assert len({p.prompt for p in pairs}) > len(PROMPTS) and not {p.prompt for p in pairs} & set(PROMPTS)
    words = r"guard\.validation must be one of own, held_out, scenes, got 'new'"
    with pytest.raises(ValueError, match=words):
        GuardConfig(validation="new")


def test_the_fall_error_by_prompt_counts_prompts_not_pairs() -> None:
    base = torch.zeros(8)
    # every pair of a prompt moves alike, the prompts differ: 8 pairs overstate what is known
    by_prompt = torch.tensor([0.1, 0.1, 0.1, 0.1, -0.1, -0.1, -0.1, -0.1])
    groups = ["a"] * 4 + ["b"] * 4
    assert paired_se(by_prompt, base, groups) == pytest.approx(0.1)  # std of (0.1, -0.1) / sqrt(2)
    assert paired_se(by_prompt, base) == pytest.approx(float(by_prompt.double().std() / 8**0.5))
    assert paired_se(by_prompt, base, groups) > 2 * paired_se(by_prompt, base)
    # the prompts agree and only their seeds differ: no spread between prompts
    within = torch.tensor([0.2, 0.0, 0.2, 0.0, 0.2, 0.0, 0.2, 0.0])
    assert paired_se(within, base, ["a", "a", "b", "b", "c", "c", "d", "d"]) == pytest.approx(0.0)
    # one pair per prompt: the same as over the pairs
    one_each = torch.linspace(-0.3, 0.4, 8)
    assert paired_se(one_each, base, [str(k) for k in range(8)]) == pytest.approx(paired_se(one_each, base))
    assert paired_se(by_prompt, base, ["a"] * 8) == 0.0  # one prompt: no spread to measure
    with pytest.raises(ValueError, match="7 groups for 8 pairs"):
        paired_se(by_prompt, base, groups[:7])


@pytest.fixture(scope="module")
def eight_prompt_folder(tmp_path_factory) -> Path:
    """A picks folder of one small tree per prompt, 8 prompts, the brightest leaf liked."""
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
    from dynamic_treerpo.trainer.preferences.store import PickStore
    from dynamic_treerpo.trainer.training.from_picks import model_id, store_trees
    from dynamic_treerpo.trainer.training.loop import Trainer

    folder = tmp_path_factory.mktemp("picks8")
    trainer = Trainer(_small(), EmbeddedPolicy.from_pretrained(), evaluation=False)
    store = PickStore(folder, create=True)
    ids = store_trees(trainer.policy, store, PROMPTS, list(range(8)), trainer.plan(0),
                      model_id(trainer.policy, "embedded"))
    for tree_id in ids:
        order = store.load_images(tree_id).mean(dim=(1, 2, 3)).argsort(descending=True).tolist()
        store.save_picks(tree_id, liked=order[:1], disliked=order[-1:])
    return folder


def _small(*extra: str) -> TrainConfig:
    return load_config(TrainConfig, None, [
        "data.prompts_per_iteration=2", "sampling.eval_steps=3", "tree.steps=4", "tree.depth=2",
        "tree.trees_per_prompt=1", "lora.rank=4", "guard.pairs=8", "guard.checkpoints=1",
        "guard.strength_tries=0", "threads=1", *extra])


@pytest.mark.parametrize("validation", ["held_out", "scenes"])
def test_a_run_never_trains_on_the_prompts_it_validates_on(
        validation: str, eight_prompt_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
    from dynamic_treerpo.trainer.training import session

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    seen: dict = {}
    real = session.guard_trainer

    def spy(trainer, pairs, **kwargs):
        tracked = real(trainer, pairs, **kwargs)
        seen.update(pairs=list(pairs), by_prompt=kwargs["by_prompt"], source=trainer.prompts)
        return tracked

    monkeypatch.setattr(session, "guard_trainer", spy)
    config = _small("reward=picks:0.4,scene:0.6", f"guard.validation={validation}", "guard.weights=[]",
                    f"data.picks={eight_prompt_folder}", f"data.prompts={prompts}")
    state = session.train_from_picks(EmbeddedPolicy.from_pretrained(), eight_prompt_folder, config, 2,
                                     log=lambda _: None)
    held = set(held_out_prompts(PROMPTS, config.guard.seed)) if validation == "held_out" else set()
    validated = {p.prompt for p in seen["pairs"]}
    assert validated == held if held else len(validated) > 4 and not validated & set(PROMPTS)
    assert seen["by_prompt"]
    drawn = {p for k in range(50) for p in seen["source"].prompts(k, 4)}
    assert drawn == set(PROMPTS) - held  # training draws every other prompt, never a validation one
    point = state.guard.trail.points[-1]
    assert point.iteration == 2 and point.guard_se >= 0.0
    if validation != "held_out":
        return
    with pytest.raises(ValueError, match="needs at least 8 distinct prompts; these picks have 4"):
        prompts.write_text("\n".join(PROMPTS[:4]) + "\n", encoding="utf-8")
        session.train_from_picks(EmbeddedPolicy.from_pretrained(), eight_prompt_folder, config, 2,
                                 log=lambda _: None)
