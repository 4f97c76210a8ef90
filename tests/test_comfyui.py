"""The node pack inside a real ComfyUI server: loading, and the embedded model sampling there
exactly as the trainer samples it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from comfyui_server import Server, require_comfyui, start_server, stop_server
from PIL import Image

from dynamic_treerpo.trainer.core.flow import make_sigmas
from dynamic_treerpo.trainer.core.tree import rollout
from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
from dynamic_treerpo.trainer.training.evaluate import ode_plan

NODE_IDS = ("TreeRPOEmbeddedLoader", "TreeRPOEmbeddedTextEncode", "TreeRPOEmbeddedEmptyLatent",
            "TreeRPOEmbeddedDecode")
PROMPT = "two red circles and a blue square"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    root = require_comfyui()
    srv = start_server(root, tmp_path_factory.mktemp("comfyui"))
    yield srv
    stop_server(srv)


def sample_graph(seed: int, batch: int, steps: int, weights: str = "", lora: str | None = None) -> dict:
    """Embedded loader [-> LoraLoaderModelOnly] -> text encode -> empty latent -> KSampler (Euler)
    -> decode -> save."""
    graph = {
        "1": {"class_type": "TreeRPOEmbeddedLoader", "inputs": {"weights": weights, "shift": 3.0}},
        "2": {"class_type": "TreeRPOEmbeddedTextEncode",
              "inputs": {"embedded": ["1", 1], "text": PROMPT}},
        "3": {"class_type": "TreeRPOEmbeddedEmptyLatent",
              "inputs": {"embedded": ["1", 1], "batch_size": batch}},
        "4": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "positive": ["2", 0], "negative": ["2", 0], "latent_image": ["3", 0],
            "seed": seed, "steps": steps, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0}},
        "5": {"class_type": "TreeRPOEmbeddedDecode", "inputs": {"embedded": ["1", 1], "samples": ["4", 0]}},
        "6": {"class_type": "SaveImage",
              "inputs": {"images": ["5", 0], "filename_prefix": f"treerpo_{seed}"}},
    }
    if lora is not None:
        graph["7"] = {"class_type": "LoraLoaderModelOnly",
                      "inputs": {"model": ["1", 0], "lora_name": lora, "strength_model": 1.0}}
        graph["4"]["inputs"]["model"] = ["7", 0]
    return graph


def saved_images(server: Server, result: dict) -> np.ndarray:
    assert result["status"]["status_str"] == "success", result["status"]
    files = result["outputs"]["6"]["images"]
    return np.stack([np.asarray(Image.open(server.base / "output" / f["subfolder"] / f["filename"]))
                     for f in files]).astype(np.int16)


def trainer_images(policy: EmbeddedPolicy, seed: int, batch: int, steps: int) -> np.ndarray:
    """The trainer's own ODE sampler from ComfyUI's noise for ``seed``, quantised as SaveImage does."""
    noise = torch.randn((batch, *policy.latent_shape), generator=torch.manual_seed(seed))
    plan = ode_plan(make_sigmas("shift", steps, 3.0))
    tree = rollout(policy.velocity, policy.encode([PROMPT] * batch), plan, list(range(batch)),
                   policy.latent_shape, noise=noise.unsqueeze(1))
    images = policy.decode(tree.leaf_latents).permute(0, 2, 3, 1).numpy()
    return np.clip(255.0 * images, 0, 255).astype(np.uint8).astype(np.int16)


def test_pack_loads_and_registers_every_node(server: Server) -> None:
    info = server.get("/object_info")
    missing = [n for n in NODE_IDS if n not in info]
    assert not missing, f"not registered: {missing}"
    assert info["TreeRPOEmbeddedLoader"]["category"] == "TreeRPO/embedded"
    log = server.log_text()
    assert "dynamic_treerpo" in log and "IMPORT FAILED" not in log.split("dynamic_treerpo")[0][-200:]


def test_embedded_model_samples_in_comfyui_as_in_the_trainer(server: Server) -> None:
    """ComfyUI's KSampler (Euler, 'simple' schedule) on the pack's MODEL gives the trainer's
    own 10-step Euler samples from the same noise, to within one 8-bit level."""
    seed, batch, steps = 7, 2, 10
    saved = saved_images(server, server.run(sample_graph(seed, batch, steps)))
    ours = trainer_images(EmbeddedPolicy.from_pretrained(), seed, batch, steps)
    diff = np.abs(saved - ours)
    assert diff.max() <= 1 and diff.mean() < 0.05, (diff.max(), diff.mean())
    assert saved.std() > 10  # an image with content, not a flat field


def test_exported_comfyui_lora_loads_with_lora_loader_model_only(server: Server, tmp_path) -> None:
    """The run folder's ComfyUI LoRA, applied by ComfyUI's own LoraLoaderModelOnly, samples what
    the trainer samples with that LoRA (and not what the base samples)."""
    from dynamic_treerpo.trainer.config.schema import TrainConfig
    from dynamic_treerpo.trainer.lora.adapters import attach_lora
    from dynamic_treerpo.trainer.lora.files import save_lora_files

    policy = EmbeddedPolicy.from_pretrained()
    attach_lora(policy.transformer, 4, 8.0, TrainConfig().lora.targets)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    files = save_lora_files(tmp_path, policy.transformer)
    (server.base / "models" / "loras").mkdir(parents=True, exist_ok=True)
    (server.base / "models" / "loras" / "treerpo_test.safetensors").write_bytes(files["comfyui"].read_bytes())

    seed, batch, steps = 11, 2, 5  # 1000 / steps must be whole for "simple" to hit our grid
    graph = sample_graph(seed, batch, steps, lora="treerpo_test.safetensors")
    saved = saved_images(server, server.run(graph))
    with_lora = trainer_images(policy, seed, batch, steps)
    base = trainer_images(EmbeddedPolicy.from_pretrained(), seed, batch, steps)
    assert np.abs(with_lora - base).max() > 20  # the LoRA changes the images visibly
    diff = np.abs(saved - with_lora)
    assert diff.max() <= 1 and diff.mean() < 0.05, (diff.max(), diff.mean())
    assert "lora key not loaded" not in server.log_text()


def test_missing_weights_folder_fails_validation_of_the_run_and_server_keeps_serving(server: Server) -> None:
    status, body = server.post_prompt(sample_graph(1, 1, 2, weights="missing/treerpo-weights"))
    assert status == 400, body
    (error,) = body["node_errors"]["1"]["errors"]
    assert error["extra_info"]["input_name"] == "weights" and "treerpo-weights" in error["details"]
    assert "not found" in error["details"]
    assert "TreeRPOEmbeddedLoader" in server.get("/object_info/TreeRPOEmbeddedLoader")


TRAINING_NODE_IDS = ("TreeRPOTrainLoRA", "TreeRPOSaveLoRA", "TreeRPOPlotHistory", "TreeRPORewardScore",
                     "TreeRPOTreeSampler", "TreeRPOFlowSDESampler", "TreeRPOBestOfTree")
SMALL_SETTINGS = "\n".join(["data.prompts_per_iteration=2", "tree.steps=4", "tree.depth=2", "lora.rank=4",
                            "lora.alpha=8.0", "optim.lr=0.02"])


def train_graph(iterations: int = 1, reward: str = "scene", settings: str = SMALL_SETTINGS,
                prefix: str = "loras/treerpo_trained") -> dict:
    """Loader -> TrainLoRA -> SaveLoRA + PlotHistory; the trained MODEL samples (nodes 4-6, as in
    :func:`sample_graph`) so its images can be compared with the saved LoRA's."""
    graph = sample_graph(11, 2, 5)
    graph["10"] = {"class_type": "TreeRPOTrainLoRA", "inputs": {
        "model": ["1", 0], "iterations": iterations, "prompts": "", "reward": reward, "reward_mix": "",
        "reward_weights": "",
        "strategy": "dynamic_treerpo", "seed": 0, "settings": settings}}
    graph["11"] = {"class_type": "TreeRPOSaveLoRA",
                   "inputs": {"run": ["10", 2], "filename_prefix": prefix, "format": "comfyui"}}
    graph["12"] = {"class_type": "TreeRPOPlotHistory", "inputs": {"run": ["10", 2]}}
    graph["13"] = {"class_type": "SaveImage", "inputs": {"images": ["12", 0], "filename_prefix": "history"}}
    graph["4"]["inputs"]["model"] = ["10", 0]
    return graph


def test_training_nodes_are_registered(server: Server) -> None:
    info = server.get("/object_info")
    missing = [n for n in TRAINING_NODE_IDS if n not in info]
    assert not missing, f"not registered: {missing}"
    assert info["TreeRPOTrainLoRA"]["category"] == "TreeRPO/training"


def test_training_workflow_saves_a_lora_that_lora_loader_model_only_reproduces(server: Server) -> None:
    """Train in ComfyUI, save the LoRA; ComfyUI's LoraLoaderModelOnly with that file on the base
    MODEL samples what the trained MODEL samples (same noise, within one 8-bit level)."""
    result = server.run(train_graph(), timeout=400)
    trained = saved_images(server, result)
    saved = Path(result["outputs"]["11"]["text"][0]) if "text" in result["outputs"].get("11", {}) else None
    lora_file = server.base / "output" / "loras" / "treerpo_trained.safetensors"
    assert lora_file.is_file(), (saved, result["outputs"].keys())
    from safetensors.torch import load_file

    state = load_file(lora_file)
    assert any(k.endswith("lora_up.weight") and float(v.abs().max()) > 0 for k, v in state.items())
    plot = result["outputs"]["13"]["images"][0]
    assert (server.base / "output" / plot["subfolder"] / plot["filename"]).is_file()

    graph = train_graph()
    graph["11"]["inputs"].update(format="kohya", filename_prefix="loras/treerpo_trained_kohya")
    server.run(graph, timeout=400)  # the same run (cached), saved in kohya keys
    kohya_file = server.base / "output" / "loras" / "treerpo_trained_kohya.safetensors"
    assert all(k.startswith("lora_unet_") for k in load_file(kohya_file))

    (server.base / "models" / "loras").mkdir(parents=True, exist_ok=True)
    base = saved_images(server, server.run(sample_graph(11, 2, 5)))
    for file in (lora_file, kohya_file):
        (server.base / "models" / "loras" / f"from_{file.name}").write_bytes(file.read_bytes())
        reloaded = saved_images(server, server.run(sample_graph(11, 2, 5, lora=f"from_{file.name}")))
        diff = np.abs(reloaded - trained)
        assert diff.max() <= 1 and diff.mean() < 0.05, (file.name, diff.max(), diff.mean())
    assert np.abs(trained - base).max() > 0  # training changed the model
    assert "lora key not loaded" not in server.log_text()


def test_lora_output_works_with_comfyuis_own_lora_nodes(server: Server) -> None:
    """The trainer node's LORA_MODEL goes into ComfyUI's LoraModelLoader (on the base MODEL) and
    SaveLoRA: sampling equals the trained MODEL's, and the saved file holds the same tensors."""
    graph = train_graph(prefix="loras/native_check")
    trained = saved_images(server, server.run(graph))
    graph["50"] = {"class_type": "LoraModelLoader",
                   "inputs": {"model": ["1", 0], "lora": ["10", 3], "strength_model": 1.0}}
    graph["51"] = {"class_type": "SaveLoRA", "inputs": {"lora": ["10", 3], "prefix": "loras/native"}}
    graph["4"]["inputs"]["model"] = ["50", 0]
    via_native = saved_images(server, server.run(graph))
    diff = np.abs(via_native - trained)
    assert diff.max() <= 1 and diff.mean() < 0.05, (diff.max(), diff.mean())
    from safetensors.torch import load_file

    native = load_file(next((server.base / "output" / "loras").glob("native_*.safetensors")))
    ours = load_file(server.base / "output" / "loras" / "native_check.safetensors")
    assert native.keys() == ours.keys()
    assert all(torch.equal(native[k], ours[k]) for k in ours)


def test_reward_score_node_scores_images_like_the_trainer(server: Server) -> None:
    graph = sample_graph(3, 2, 5)
    graph["20"] = {"class_type": "TreeRPORewardScore", "inputs": {
        "images": ["5", 0], "prompts": PROMPT, "reward": "scene", "reward_mix": "", "reward_weights": ""}}
    result = server.run(graph)
    images = saved_images(server, result)
    table = result["outputs"]["20"]["text"][0]
    rows = [line.split("\t") for line in table.splitlines()]
    assert rows[0] == ["image", "scene"] and rows[-1][0] == "mean" and len(rows) == 4
    from dynamic_treerpo.trainer.rewards.scene_reward import scene_metrics

    ours = scene_metrics(torch.from_numpy(images.astype(np.float32) / 255).permute(0, 3, 1, 2),
                         [PROMPT, PROMPT])["reward"]
    for i in range(2):  # the node scores the float images, we the saved 8-bit ones
        assert abs(float(rows[i + 1][1]) - float(ours[i])) < 0.02


@pytest.mark.parametrize(("change", "message"), [
    ({"reward": "hps"}, "reward: 'hps' is not a reward; choose one of clip, hps-v2.1"),  # the dropdown
    ({"reward": "mix"}, "reward_mix: with reward 'mix', list the rewards"),
    ({"reward": "mix", "reward_mix": "scene:0.5, hps:0.5"}, "reward_mix: unknown reward 'hps'"),
    ({"reward": "hps-v2.1"}, "reward 'hps-v2.1' needs its weights"),
    ({"settings": "tree.depth=0"}, "depth"),
    ({"settings": "tree.dept=3"}, "unknown key 'tree.dept'"),
    # a strategy's own constraints, before anything runs: DGPO needs a LoRA; a group above the leaf budget
    ({"strategy": "dgpo", "settings": "lora.enabled=false"}, "strategy dgpo compares each image's error with "
     "the LoRA-free model's: it needs a LoRA (lora.enabled: true)"),
    ({"strategy": "dgpo", "settings": "dgpo.group_size=512"}, "settings: dgpo.group_size=512 make 512 images "
     "per prompt; the budget is 256 per prompt"),
    ({"reward": "hps-v2.1", "reward_weights": "hps-v2.1=rewards/missing_hps.pt"},
     "weights of reward 'hps-v2.1' not found: "),
    ({"reward": "hps-v2.1", "reward_weights": "hps-v2.1=/etc/passwd"},  # outside the model folders
     "weights path of reward 'hps-v2.1' /etc/passwd is outside ComfyUI's model folders"),
    ({"reward": "hps-v2.1", "reward_weights": "hps-v2.1=../../secret.pt"},
     "is outside ComfyUI's model folders"),
    ({"iterations": 0}, "smaller than min"),  # ComfyUI's own range check still applies
    ({"prompts": "a purple dragon"}, "prompts: the scene reward cannot read 'a purple dragon'"),
])
def test_bad_training_inputs_fail_validation_and_the_server_keeps_serving(
        server: Server, change: dict, message: str) -> None:
    graph = train_graph()
    graph["10"]["inputs"].update(change)
    status, body = server.post_prompt(graph)
    assert status == 400, body
    assert message in json.dumps(body), body
    assert "TreeRPOTrainLoRA" in server.get("/object_info/TreeRPOTrainLoRA")


def test_save_lora_refuses_names_outside_the_output_folder(server: Server) -> None:
    _, body = server.post_prompt(train_graph(prefix="../../escape"))
    # ComfyUI still runs the graph's valid outputs; the save node alone is refused
    assert "leaves ComfyUI's output folder" in json.dumps(body.get("node_errors", {}).get("11")), body
    assert not list(server.base.parent.glob("escape*"))


def tree_graph(node: str, extra: dict, seed: int = 5) -> dict:
    """Embedded loader -> text encode -> latent (batch 1) -> ``node`` -> decode -> save (node 6)."""
    graph = sample_graph(seed, 1, 10)
    del graph["4"]
    conds = {"positive": ["2", 0], "negative": ["2", 0]} if node != "TreeRPOBestOfTree" else {}
    graph["30"] = {"class_type": node, "inputs": {
        "model": ["1", 0], **conds, "latent": ["3", 0], "seed": seed,
        "steps": 10, "cfg": 1.0, "depth": 2, "branching": 2, "window_start": 2, "noise_level": 0.6, **extra}}
    graph["5"]["inputs"]["samples"] = ["30", 0]
    return graph


def trainer_tree_images(policy: EmbeddedPolicy, config, seed: int) -> np.ndarray:
    """The trainer's rollout of ``config`` from ComfyUI's noise for ``seed`` (8-bit, as saved)."""
    from dynamic_treerpo.trainer.core.strategies import build_plan

    noise = torch.randn((1, *policy.latent_shape), generator=torch.manual_seed(seed))
    plan = build_plan(config, make_sigmas("shift", 10, 3.0), config.window_start, seed=seed)
    tree = rollout(policy.velocity, policy.encode([PROMPT]), plan, [seed], policy.latent_shape,
                   noise=noise.unsqueeze(1))
    images = policy.decode(tree.leaf_latents).permute(0, 2, 3, 1).numpy()
    return np.clip(255.0 * images, 0, 255).astype(np.uint8).astype(np.int16)


def test_tree_sampler_grows_the_trainers_tree_in_comfyui(server: Server) -> None:
    from dynamic_treerpo.trainer.core.strategies import TreeConfig

    graph = tree_graph("TreeRPOTreeSampler", {"noise_growth": 0.5, "sde_kind": "flow_grpo"})
    saved = saved_images(server, server.run(graph))
    config = TreeConfig(steps=10, window_start=2, depth=2, branching=2, noise_level=0.6, noise_growth=0.5,
                        tail="euler")
    ours = trainer_tree_images(EmbeddedPolicy.from_pretrained(), config, 5)
    assert saved.shape[0] == 4  # 2^2 leaves from one latent
    diff = np.abs(saved - ours)
    assert diff.max() <= 1 and diff.mean() < 0.05, (diff.max(), diff.mean())
    assert np.abs(saved[0] - saved[3]).max() > 10  # the leaves differ: the tree branched


def test_flow_sde_sampler_runs_in_sampler_custom_advanced_as_in_the_trainer(server: Server) -> None:
    from dynamic_treerpo.trainer.core.strategies import MixGRPOConfig

    graph = sample_graph(9, 1, 10)
    del graph["4"]
    graph.update({
        "40": {"class_type": "TreeRPOFlowSDESampler",
               "inputs": {"window_start": 1, "window_size": 4, "noise_level": 0.7, "sde_kind": "flow_grpo"}},
        "41": {"class_type": "RandomNoise", "inputs": {"noise_seed": 9}},
        "42": {"class_type": "BasicGuider", "inputs": {"model": ["1", 0], "conditioning": ["2", 0]}},
        "43": {"class_type": "BasicScheduler",
               "inputs": {"model": ["1", 0], "scheduler": "simple", "steps": 10, "denoise": 1.0}},
        "44": {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["41", 0], "guider": ["42", 0], "sampler": ["40", 0], "sigmas": ["43", 0],
            "latent_image": ["3", 0]}},
    })
    graph["5"]["inputs"]["samples"] = ["44", 0]
    saved = saved_images(server, server.run(graph))
    config = MixGRPOConfig(steps=10, window_start=1, window_size=4, group_size=1, noise_level=0.7)
    ours = trainer_tree_images(EmbeddedPolicy.from_pretrained(), config, 9)
    diff = np.abs(saved - ours)
    assert diff.max() <= 1 and diff.mean() < 0.05, (diff.max(), diff.mean())


def test_best_of_tree_returns_the_leaf_with_the_highest_reward(server: Server) -> None:
    graph = tree_graph("TreeRPOBestOfTree", BEST_OF_TREE)
    del graph["5"], graph["2"]  # the prompt is given once, to Best of Tree
    graph["6"]["inputs"]["images"] = ["30", 0]
    graph["31"] = {"class_type": "SaveImage", "inputs": {"images": ["30", 1], "filename_prefix": "leaves"}}
    result = server.run(graph)
    best = saved_images(server, result)
    table = result["outputs"]["30"]["text"][0]
    scores = [float(line.split("\t")[1]) for line in table.splitlines()[1:]]
    assert len(scores) == 4
    files = result["outputs"]["31"]["images"]
    leaves = np.stack([np.asarray(Image.open(server.base / "output" / f["subfolder"] / f["filename"]))
                       for f in files]).astype(np.int16)
    top = int(np.argmax(scores))
    assert "<- best" in table.splitlines()[1 + top]
    assert np.array_equal(best[0], leaves[top])


BEST_OF_TREE = {"prompt": PROMPT, "negative_prompt": "", "reward": "scene", "reward_mix": "",
                "reward_weights": "", "embedded": ["1", 1]}


def refusal(server: Server, graph: dict) -> tuple[str, str]:
    """Post a graph that must be refused before anything runs: HTTP 400, exactly one error on one node,
    no run queued; returns (node, message). The server keeps serving."""
    before = len(server.get("/history"))
    status, body = server.post_prompt(graph)
    assert status == 400, body
    errors = [(node, e) for node, entry in body["node_errors"].items() for e in entry["errors"]]
    assert len(errors) == 1, errors  # one message, not one per input the node validates
    node, error = errors[0]
    message = error["details"]  # "input - why" from a node checking one input, else the node's raised message
    assert "\n" not in message
    assert len(server.get("/history")) == before and server.get("/queue")["queue_running"] == []
    assert server.get("/system_stats")
    return node, message


def run_error(server: Server, graph: dict) -> str:
    """Run a graph that passes validation but whose node fails: its error message; the server keeps
    serving."""
    result = server.run(graph)
    assert result["status"]["status_str"] == "error"
    message = next(m for kind, m in result["status"]["messages"] if kind == "execution_error")
    assert server.get("/system_stats")
    return message["exception_message"].strip()


TREE = {"noise_growth": 0.5, "sde_kind": "flow_grpo"}


@pytest.mark.parametrize(("node", "change", "starts", "says"), [
    # a value above its declared maximum, on an input the node validates itself (ComfyUI skips its own check)
    ("TreeRPOTreeSampler", {"depth": 9}, "depth", "9 is outside the allowed range 1 to 8"),
    ("TreeRPOTreeSampler", {"steps": 500}, "steps", "500 is outside the allowed range 2 to 200"),
    ("TreeRPOBestOfTree", {"depth": 12}, "depth", "12 is outside the allowed range 1 to 8"),
    # consistent values: the message names the input at fault, once
    ("TreeRPOTreeSampler", {"window_start": 8}, "window_start", "must be between 0 and 7"),
    ("TreeRPOBestOfTree", {"window_start": 9}, "window_start", "must be between 0 and 7"),
    # text the embedded model cannot read, refused with the words it knows
    ("TreeRPOBestOfTree", {"prompt": "a purple dragon"}, "prompt", "does not know 'dragon'; it knows: a and"),
    # files checked against ComfyUI's model folders before anything runs
    ("TreeRPOBestOfTree", {"reward": "hps-v2.1", "reward_weights": "hps-v2.1=rewards/none.pt"},
     "reward_weights", "weights of reward 'hps-v2.1' not found"),
    ("TreeRPOBestOfTree", {"reward": "mix", "reward_mix": ""}, "reward_mix", "list the rewards and weights"),
])
def test_each_bad_input_is_refused_once_by_name_before_anything_runs(server: Server, node: str, change: dict,
                                                                      starts: str, says: str) -> None:
    graph = tree_graph(node, {**(TREE if node == "TreeRPOTreeSampler" else BEST_OF_TREE), **change})
    if node == "TreeRPOBestOfTree":
        del graph["5"], graph["2"]
        graph["6"]["inputs"]["images"] = ["30", 0]
    where, message = refusal(server, graph)
    assert where == "30" and message.startswith(starts) and says in message, message


def test_embedded_text_and_weights_are_checked_before_anything_runs(server: Server) -> None:
    graph = sample_graph(1, 1, 2)
    graph["2"]["inputs"]["text"] = "a red circle, very shiny"
    node, message = refusal(server, graph)
    assert node == "2" and message.startswith("text - the embedded model does not know 'very', 'shiny'")
    assert "it knows: a and at blue bottom circle" in message
    node, message = refusal(server, sample_graph(1, 1, 2, weights="no_such_model"))
    assert node == "1" and message.startswith("weights - embedded model folder 'no_such_model' not found")


def test_a_training_prompt_the_embedded_model_cannot_read_fails_naming_the_words_it_knows(
        server: Server) -> None:
    """With the scene reward, training prompts are checked at validation (above). With another reward the
    node cannot see at validation which model is connected (ComfyUI gives validate_inputs no graph), so
    the embedded encoder refuses the prompt when the node runs, in one line listing the words it knows."""
    graph = train_graph(reward="ocr")
    graph["10"]["inputs"]["prompts"] = "two red circles\na red circle beside a tree"
    text = run_error(server, graph)
    assert "unknown word 'beside'" in text and "it knows: a and at blue" in text and "\n" not in text, text


def test_a_latent_of_the_wrong_size_fails_with_one_line(server: Server) -> None:
    """A 512 px SD latent (4x64x64) into the embedded model's tree sampler: the node fails with a
    message that names both sizes and the node that makes the right one; the server keeps serving."""
    graph = tree_graph("TreeRPOTreeSampler", {"noise_growth": 0.5, "sde_kind": "flow_grpo"})
    graph["3"] = {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}}
    text = run_error(server, graph)
    assert "takes 48x16x16" in text and "TreeRPO Embedded Empty Latent" in text and "\n" not in text, text


# ------------------------------------------------------------------------------ tree budgets and prompts


@pytest.mark.parametrize("node", ["TreeRPOTreeSampler", "TreeRPOBestOfTree"])
def test_a_tree_over_the_leaf_budget_is_refused_once_naming_depth_and_branching(server: Server,
                                                                                 node: str) -> None:
    """Depth 8 and branching 8 (16.7 million leaves) are each within their input's range; together they are
    refused before anything runs, with the budget."""
    change = {"depth": 8, "branching": 8, "window_start": 0}
    graph = tree_graph(node, {**(TREE if node == "TreeRPOTreeSampler" else BEST_OF_TREE), **change})
    if node == "TreeRPOBestOfTree":
        del graph["5"], graph["2"]
        graph["6"]["inputs"]["images"] = ["30", 0]
    where, message = refusal(server, graph)
    assert where == "30", message
    assert message.startswith("depth: 8 splits of 8 branches make 16,777,216 images"), message
    assert "branching" in message and "the budget is 256 per tree" in message, message


def test_an_empty_best_of_tree_prompt_is_refused_once_before_anything_runs(server: Server) -> None:
    graph = tree_graph("TreeRPOBestOfTree", {**BEST_OF_TREE, "prompt": "  \n "})
    del graph["5"], graph["2"]
    graph["6"]["inputs"]["images"] = ["30", 0]
    where, message = refusal(server, graph)
    assert where == "30" and message.startswith("prompt: write what to draw"), message


def test_train_lora_settings_go_through_the_same_leaf_budget(server: Server) -> None:
    settings = "\n".join(["data.prompts_per_iteration=2", "tree.steps=20", "tree.depth=8",
                          "tree.branching=8"])
    where, message = refusal(server, train_graph(settings=settings))
    assert where == "10" and message.startswith("settings: tree.depth=8 and tree.branching=8"), message
    assert "16,777,216 images per prompt" in message and "the budget is 256 per prompt" in message, message


def test_a_tree_too_big_for_the_devices_memory_fails_before_sampling_naming_depth_and_branching(
        server: Server) -> None:
    """Within the leaf budget (256 leaves) but on a 512x512 latent: the tree's latents alone would take
    about 100 GiB. The node fails when it sees the latent, before sampling, in one line with the figures."""
    graph = tree_graph("TreeRPOTreeSampler", {**TREE, "depth": 8, "branching": 2, "window_start": 0})
    graph["3"] = {"class_type": "EmptyLatentImage",
                  "inputs": {"width": 4096, "height": 4096, "batch_size": 1}}
    text = run_error(server, graph)
    assert text.startswith("depth: 8 splits of 2 branches grow 256 leaves of 48x512x512 per tree: "), text
    assert "GiB" in text and "lower depth or branching" in text and "\n" not in text, text
