"""The guard in a real ComfyUI server: TreeRPO Train LoRA from Picks keeps checkpoints and returns the
one the person's limit allows, with the trade plot and the before/after grid on the node; TreeRPO
Choose Checkpoint takes another checkpoint or strength from the run without training again; a limit
no checkpoint meets says so in one line on the node and hands back the base model unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from comfyui_server import Server, require_comfyui, start_server, stop_server
from safetensors.torch import load_file

SETTINGS = "\n".join(["data.prompts_per_iteration=2", "tree.steps=4", "tree.depth=2", "lora.rank=4",
                      "lora.alpha=8.0", "optim.lr=0.02", "sampling.eval_steps=3", "guard.pairs=4",
                      "guard.checkpoints=2"])
PROMPTS = "two red circles\na blue square on the left"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    srv = start_server(require_comfyui(), tmp_path_factory.mktemp("comfyui"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def folder(server: Server) -> str:
    """Four trees of the embedded model, each labelled (the darkest leaves liked) through the store."""
    from dynamic_treerpo.trainer.preferences.store import PickStore

    name = "guarded"
    graph = {"1": {"class_type": "TreeRPOEmbeddedLoader", "inputs": {"weights": "", "shift": 3.0}},
             "2": {"class_type": "TreeRPOSampleToPick", "inputs": {
                 "model": ["1", 0], "prompts": PROMPTS, "trees_per_prompt": 2, "seed": 0, "steps": 4,
                 "depth": 2, "branching": 2, "window_start": 0, "noise_level": 0.6, "picks_folder": name}}}
    result = server.run(graph)
    assert result["status"]["status_str"] == "success", result["status"]
    store = PickStore(server.base / "output" / "treerpo_picks" / name)
    for tree_id in store.tree_ids():
        order = store.load_images(tree_id).mean(dim=(1, 2, 3)).argsort().tolist()
        store.save_picks(tree_id, liked=order[:1], disliked=order[-1:])
    return name


def graph(folder: str, keep: str = "loosely", checkpoint: int = 0, strength: float = 1.0,
          settings: str = SETTINGS, prefix: str = "loras/guarded") -> dict:
    return {"1": {"class_type": "TreeRPOEmbeddedLoader", "inputs": {"weights": "", "shift": 3.0}},
            "10": {"class_type": "TreeRPOTrainFromPicks", "inputs": {
                "model": ["1", 0], "picks_folder": folder, "iterations": 2, "guard_reward": "scene",
                "keep_following": keep, "picks_weight": 0.15, "reward_weights": "", "mode": "reward",
                "seed": 0, "settings": settings}},
            "20": {"class_type": "TreeRPOChooseCheckpoint", "inputs": {
                "model": ["1", 0], "run": ["10", 2], "checkpoint": checkpoint, "strength": strength}},
            "21": {"class_type": "TreeRPOSaveLoRA",
                   "inputs": {"run": ["20", 2], "filename_prefix": prefix, "format": "comfyui"}}}


def executed(result: dict) -> set[str]:
    """The nodes that ran (not taken from ComfyUI's cache) in a finished prompt."""
    cached = next((set(m["nodes"]) for kind, m in result["status"]["messages"] if kind == "execution_cached"),
                  set())
    return {"1", "10", "20", "21"} - cached


def saved(server: Server, prefix: str) -> dict[str, torch.Tensor]:
    files = sorted((server.base / "output").glob(f"{prefix}*.safetensors"))
    assert files, prefix
    return load_file(str(files[-1]))


def ups(lora: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in lora.items() if "lora_up" in k}


def test_the_guard_chooses_and_shows_the_trade_on_the_node(server: Server, folder: str) -> None:
    result = server.run(graph(folder, prefix="loras/chosen"), timeout=600)
    assert result["status"]["status_str"] == "success", result["status"]
    ui = result["outputs"]["10"]
    assert len(ui["images"]) == 2  # the trade plot and the before/after grid, as ComfyUI's previews
    for image in ui["images"]:
        assert (server.base / "temp" / image["subfolder"] / image["filename"]).is_file()
    line = ui["treerpo_guard"][0]
    assert "\n" not in line and ("chose" in line or "base model" in line)
    assert "limit" in line
    # the default trains once (guard.weights: [0.4]): the line names no choice between weights
    assert "trained your picks at weights" not in line, line


def test_two_weights_from_the_settings_box_train_twice_and_the_line_says_which_was_kept(
        server: Server, folder: str) -> None:
    both = SETTINGS + "\nguard.weights=[0.3, 0.5]"  # 0.5.0's default, still a setting
    result = server.run(graph(folder, settings=both, prefix="loras/both"), timeout=600)
    assert result["status"]["status_str"] == "success", result["status"]
    line = result["outputs"]["10"]["treerpo_guard"][0]
    if "chose" in line:  # the picks trained at both weights; the line says which was kept
        assert "; it trained your picks at weights 0.3 and 0.5 and kept 0." in line, line


def test_another_checkpoint_or_strength_is_taken_without_training_again(server: Server, folder: str) -> None:
    first = server.run(graph(folder, checkpoint=2, strength=1.0, prefix="loras/at2"), timeout=600)
    assert first["status"]["status_str"] == "success", first["status"]
    full = ups(saved(server, "loras/at2"))
    half = server.run(graph(folder, checkpoint=2, strength=0.5, prefix="loras/at2_half"), timeout=600)
    assert half["status"]["status_str"] == "success", half["status"]
    assert "10" not in executed(half) and "20" in executed(half)  # the training node came from the cache
    halved = ups(saved(server, "loras/at2_half"))
    assert set(halved) == set(full)
    assert all(torch.allclose(halved[k], 0.5 * full[k], atol=1e-6) for k in full)
    assert any(float(v.abs().max()) > 0 for v in full.values())
    other = server.run(graph(folder, checkpoint=1, strength=1.0, prefix="loras/at1"), timeout=600)
    assert "10" not in executed(other)
    assert any(not torch.equal(v, full[k]) for k, v in ups(saved(server, "loras/at1")).items())


def test_a_checkpoint_the_run_did_not_keep_is_one_line(server: Server, folder: str) -> None:
    result = server.run(graph(folder, checkpoint=7, prefix="loras/at7"), timeout=600)
    assert result["status"]["status_str"] == "error"
    message = next(m for kind, m in result["status"]["messages"] if kind == "execution_error")
    assert message["node_id"] == "20"
    assert message["exception_message"].strip() == "no checkpoint at iteration 7: this run kept 1, 2"


def test_a_limit_no_checkpoint_meets_returns_the_base_model_and_says_so(server: Server, folder: str) -> None:
    strict = SETTINGS + "\nguard.margin=1000"  # no measured fall can clear a thousand standard errors
    result = server.run(graph(folder, keep="strictly", settings=strict, prefix="loras/unmet"), timeout=600)
    assert result["status"]["status_str"] == "success", result["status"]
    line = result["outputs"]["10"]["treerpo_guard"][0]
    assert line.startswith("no checkpoint kept prompt-following within the limit"), line
    assert "base model is returned unchanged" in line and "\n" not in line
    lora = ups(saved(server, "loras/unmet"))
    assert lora and all(float(v.abs().max()) == 0.0 for v in lora.values())


def test_the_guard_needs_a_guard_reward_and_the_reward_mode(server: Server, folder: str) -> None:
    g = graph(folder)
    g["10"]["inputs"]["guard_reward"] = "none"
    status, body = server.post_prompt(g)
    assert status == 400
    details = body["node_errors"]["10"]["errors"][0]["details"]
    assert details.startswith("keep_following: keeping to the prompt needs a guard reward"), details
    g = graph(folder)
    g["10"]["inputs"]["mode"] = "online"
    status, body = server.post_prompt(g)
    assert status == 400 and "mode reward" in body["node_errors"]["10"]["errors"][0]["details"]


def test_validating_on_held_out_prompts_needs_enough_prompts_and_says_so_before_running(
        server: Server, folder: str) -> None:
    g = graph(folder, settings=SETTINGS + "\nguard.validation=held_out")
    status, body = server.post_prompt(g)
    assert status == 400
    details = body["node_errors"]["10"]["errors"][0]["details"]
    assert details.startswith("settings: guard.validation: held_out keeps 4 prompts out of training"), details
    assert details.endswith("these picks have 2: label trees of more prompts, or use guard.validation: own")


def test_a_run_without_the_guard_cannot_choose_a_checkpoint(server: Server, folder: str) -> None:
    result = server.run(graph(folder, keep="off (fixed weight)", prefix="loras/unguarded"), timeout=600)
    assert result["status"]["status_str"] == "error"
    message = next(m for kind, m in result["status"]["messages"] if kind == "execution_error")
    assert message["node_id"] == "20" and "kept no checkpoints" in message["exception_message"]
