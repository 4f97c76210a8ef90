"""Your own taste as the reward, in a real ComfyUI server: TreeRPO Sample Trees to Pick stores trees in a
picks folder, the picking panel's routes (nodes/picks_routes.py) save picks and refuse bad ones, the picks
survive a server restart, TreeRPO Train LoRA from Picks trains on them (and stops on Interrupt), and every
bad input is refused in one line naming it: at validation where the folder can be read, at the start of
the run for another model's folder. Tiny settings: each test runs in seconds on a CPU."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from comfyui_server import PACK_NAME, Server, require_comfyui, start_server, stop_server
from PIL import Image

SETTINGS = "\n".join(["data.prompts_per_iteration=2", "tree.steps=4", "tree.depth=2", "lora.rank=4",
                      "lora.alpha=8.0", "optim.lr=0.02"])
PROMPTS = "two red circles\na blue square on the left"


class Servers:
    """The module's server, which one test restarts on the same base folder."""

    def __init__(self, root: Path, base: Path) -> None:
        self.root, self.base = root, base
        self.srv = start_server(root, base)

    def restart(self) -> Server:
        stop_server(self.srv)
        (self.base / "custom_nodes" / PACK_NAME).unlink()  # start_server links the pack again
        self.srv = start_server(self.root, self.base)
        return self.srv


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[Servers]:
    holder = Servers(require_comfyui(), tmp_path_factory.mktemp("comfyui"))
    yield holder
    stop_server(holder.srv)


@pytest.fixture
def server(servers: Servers) -> Server:
    return servers.srv


def picks_dir(server: Server, name: str) -> Path:
    return server.base / "output" / "treerpo_picks" / name


def sample_graph(folder: str, trees: int = 1, seed: int = 0, prompts: str = PROMPTS) -> dict:
    return {"1": {"class_type": "TreeRPOEmbeddedLoader", "inputs": {"weights": "", "shift": 3.0}},
            "2": {"class_type": "TreeRPOSampleToPick", "inputs": {
                "model": ["1", 0], "prompts": prompts, "trees_per_prompt": trees, "seed": seed, "steps": 4,
                "depth": 2, "branching": 2, "window_start": 0, "noise_level": 0.6, "picks_folder": folder}}}


def train_graph(folder: str, iterations: int = 1, mode: str = "reward", prefix: str = "loras/picks") -> dict:
    return {"1": {"class_type": "TreeRPOEmbeddedLoader", "inputs": {"weights": "", "shift": 3.0}},
            "10": {"class_type": "TreeRPOTrainFromPicks", "inputs": {
                "model": ["1", 0], "picks_folder": folder, "iterations": iterations, "guard_reward": "scene",
                "keep_following": "off (fixed weight)", "picks_weight": 0.5, "reward_weights": "",
                "mode": mode, "seed": 0, "settings": SETTINGS}},
            "11": {"class_type": "TreeRPOSaveLoRA",
                   "inputs": {"run": ["10", 2], "filename_prefix": prefix, "format": "comfyui"}}}


def call(server: Server, path: str, body: dict | None = None) -> tuple[int, dict]:
    """GET (or POST ``body`` as JSON) a route: (status, JSON)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read().decode() or "{}")


def state(server: Server, folder: str) -> dict:
    status, body = call(server, f"/treerpo/picks/{folder}/state")
    assert status == 200, body
    return body


def sampled(server: Server, folder: str, trees: int = 1, seed: int = 0) -> dict:
    result = server.run(sample_graph(folder, trees, seed))
    assert result["status"]["status_str"] == "success", result["status"]
    return result


def refusal(server: Server, graph: dict) -> tuple[str, str]:
    """A graph refused before anything runs: HTTP 400, one error on one node, nothing queued."""
    before = len(server.get("/history"))
    status, body = server.post_prompt(graph)
    assert status == 400, body
    errors = [(node, e) for node, entry in body["node_errors"].items() for e in entry["errors"]]
    assert len(errors) == 1, errors
    node, error = errors[0]
    assert "\n" not in error["details"]
    assert len(server.get("/history")) == before
    return node, error["details"]


def run_error(server: Server, graph: dict) -> str:
    result = server.run(graph)
    assert result["status"]["status_str"] == "error", result["status"]
    message = next(m for kind, m in result["status"]["messages"] if kind == "execution_error")
    return message["exception_message"].strip()


@pytest.fixture(scope="module")
def labelled(servers: Servers) -> str:
    """A folder of 4 trees (2 prompts x 2), 3 of them labelled through the routes."""
    server, name = servers.srv, "labelled"
    sampled(server, name, trees=2)
    trees = state(server, name)["trees"]
    for tree, (liked, disliked) in zip(trees, [([0], [3]), ([1, 2], []), ([], [0])], strict=False):
        sent = {"liked": liked, "disliked": disliked}
        status, body = call(server, f"/treerpo/picks/{name}/{tree['id']}", sent)
        assert status == 200, body
    return name


# ------------------------------------------------------------------------------ sampling and the routes


def test_sampling_stores_trees_and_the_node_names_its_folder(server: Server) -> None:
    result = sampled(server, "sampled", trees=2)
    ui = result["outputs"]["2"]
    assert ui["treerpo_picks"] == ["sampled"] and len(ui["treerpo_trees"]) == 4
    folder = picks_dir(server, "sampled")
    trees = sorted(p.name for p in (folder / "trees").iterdir())
    assert trees == sorted(ui["treerpo_trees"])
    for tree in trees:
        meta = json.loads((folder / "trees" / tree / "tree.json").read_text())
        assert meta["leaves"] == 4 and meta["image_size"] == [64, 64] and meta["model"]["kind"] == "embedded"
        assert len(list((folder / "trees" / tree).glob("leaf_*.png"))) == 4
    body = state(server, "sampled")
    assert (body["total"], body["labelled"]) == (4, 0)
    assert [t["prompt"] for t in body["trees"]].count("two red circles") == 2
    with urllib.request.urlopen(f"{server.url}/treerpo/picks/sampled/{trees[0]}/3.png") as reply:
        assert reply.headers["Content-Type"] == "image/png"
        path = folder / "trees" / trees[0] / "leaf_03.png"
        assert reply.read() == path.read_bytes()
    with Image.open(path) as image:
        assert image.size == (64, 64)
    # the same inputs again: ComfyUI's cache, no second copy of the trees
    assert sampled(server, "sampled", trees=2) and state(server, "sampled")["total"] == 4


def test_routes_save_picks_and_refuse_bad_ones(server: Server) -> None:
    sampled(server, "routes")
    tree = state(server, "routes")["trees"][0]["id"]
    url = f"/treerpo/picks/routes/{tree}"
    status, body = call(server, url, {"liked": [2, 0], "disliked": [3]})
    assert status == 200 and (body["liked"], body["disliked"], body["labelled"]) == ([0, 2], [3], 1), body
    assert len(list((picks_dir(server, "routes") / "trees" / tree / "picks").glob("*.json"))) == 1
    refused = {
        "every leaf liked": ({"liked": [0, 1, 2, 3]}, "every leaf has the same mark"),
        "none marked": ({"liked": [], "disliked": []}, "no leaf is marked"),
        "no such leaf": ({"liked": [7]}, "leaf 7 does not exist"),
        "both": ({"liked": [1], "disliked": [1]}, "leaf 1 is marked both liked and disliked"),
        "not numbers": ({"liked": ["a"]}, "liked must be a list of leaf numbers"),
    }
    for what, (sent, says) in refused.items():
        status, body = call(server, url, sent)
        assert status == 400 and says in body["error"] and "\n" not in body["error"], (what, body)
    status, body = call(server, "/treerpo/picks/routes/20990101T000000000000Z_00000000", {"liked": [0]})
    assert status == 404 and "no tree" in body["error"], body
    status, _ = call(server, f"/treerpo/picks/routes/{tree}/9.png")
    assert status == 404
    for name in ("..", "%2E%2E", "a%2F..%2F..", ".hidden", "x%20y", "..%2Foutput"):
        status, body = call(server, f"/treerpo/picks/{name}/state")
        assert status in (400, 404), (name, status, body)
        if status == 400:
            assert "not a plain folder name" in body["error"] or "picks folder" in body["error"], body
    status, body = call(server, "/treerpo/picks/%2E%2E/state")
    assert status == 400 and "not a plain folder name" in body["error"], body
    # a folder nobody sampled into yet: nothing, not an error (the panel shows nothing)
    assert state(server, "nothing_yet") == {"folder": "nothing_yet", "exists": False, "total": 0,
                                            "labelled": 0, "trees": []}
    assert len(list((picks_dir(server, "routes") / "trees" / tree / "picks").glob("*.json"))) == 1


def guided_state(server: Server, folder: str, labelled: int, order: str = "") -> dict:
    """The state once its advice is read on ``labelled`` trees (it is computed on a worker thread)."""
    deadline = time.monotonic() + 120
    while True:
        status, body = call(server, f"/treerpo/picks/{folder}/state" + (f"?order={order}" if order else ""))
        assert status == 200, body
        if body["advice"]["trees"] == labelled:
            return body
        assert time.monotonic() < deadline, body["advice"]
        time.sleep(0.2)


def test_state_says_which_tree_next_and_whether_more_picks_help(server: Server) -> None:
    from dynamic_treerpo.trainer.preferences.active import DEFAULT_ORDER, next_order
    from dynamic_treerpo.trainer.preferences.pairs import tree_pairs
    from dynamic_treerpo.trainer.preferences.store import PickStore
    from dynamic_treerpo.trainer.rewards.personal import pooled_features

    sampled(server, "guided", trees=5)  # 10 trees of 4 leaves
    ids = [t["id"] for t in state(server, "guided")["trees"]]
    body = guided_state(server, "guided", 0)
    assert body["next_order"] == ids and body["advice"] == {
        "text": "label 8 more trees to see how well your picks agree", "more_helps": None, "trees": 0}
    # a single like, nothing else marked, is a whole answer: the liked leaf beats the 3 others
    status, saved = call(server, f"/treerpo/picks/guided/{ids[0]}", {"liked": [2]})
    assert status == 200 and (saved["liked"], saved["disliked"]) == ([2], []), saved
    store = PickStore(picks_dir(server, "guided"))
    assert {(p.better, p.worse) for p in tree_pairs(store.picks(ids[0]), 4)} == {(2, 0), (2, 1), (2, 3)}
    for k, tree in enumerate(ids[1:8]):
        sent = {"liked": [k % 4]} if k % 2 else {"liked": [k % 4], "disliked": [(k + 1) % 4]}
        assert call(server, f"/treerpo/picks/guided/{tree}", sent)[0] == 200
    body = guided_state(server, "guided", 8)
    assert body["advice"]["more_helps"] is True, body["advice"]
    assert body["advice"]["text"].startswith("your picks agree with each other on "), body["advice"]
    assert body["advice"]["text"].endswith("of held-out pairs; still rising: more picks help"), body["advice"]
    oldest = guided_state(server, "guided", 8, "oldest")["next_order"]
    active = guided_state(server, "guided", 8, "active")["next_order"]
    assert oldest == ids[8:] and body["next_order"] == (oldest if DEFAULT_ORDER == "oldest" else active)
    pairs = {t: tree_pairs(store.picks(t), 4) for t in ids[:8]}
    features = {t: pooled_features(store.load_images(t)).double() for t in ids}
    assert active == next_order(ids, pairs, features, "active")  # the folder state's own order
    status, body = call(server, "/treerpo/picks/guided/state?order=newest")
    assert status == 400 and body["error"] == "order must be one of oldest, active, got 'newest'", body


def test_a_server_restart_keeps_every_pick(servers: Servers, labelled: str) -> None:
    before = state(servers.srv, labelled)
    assert (before["total"], before["labelled"]) == (4, 3)
    after = state(servers.restart(), labelled)
    assert after == before


# ------------------------------------------------------------------------------ training


GUARDED = SETTINGS + "\n" + "\n".join(["sampling.eval_steps=3", "guard.pairs=4", "guard.checkpoints=2",
                                       "guard.margin=0"])


def round_graph(folder: str) -> dict:
    """Train from the folder's picks under the guard, then sample new trees from the trained model into the
    same folder: each queue is one more round of picking on the model training made."""
    return {"1": {"class_type": "TreeRPOEmbeddedLoader", "inputs": {"weights": "", "shift": 3.0}},
            "10": {"class_type": "TreeRPOTrainFromPicks", "inputs": {
                "model": ["1", 0], "picks_folder": folder, "iterations": 2, "guard_reward": "scene",
                "keep_following": "loosely", "picks_weight": 0.5, "reward_weights": "", "mode": "reward",
                "seed": 0, "settings": GUARDED}},
            "30": {"class_type": "TreeRPOSampleToPick", "inputs": {
                "model": ["10", 0], "prompts": PROMPTS, "trees_per_prompt": 1, "seed": 7, "steps": 4,
                "depth": 2, "branching": 2, "window_start": 0, "noise_level": 0.6, "picks_folder": folder}}}


def pick_all(server: Server, folder: str) -> None:
    """Like the first leaf and dislike the last of every tree not labelled yet, through the routes."""
    for tree in state(server, folder)["trees"]:
        if not tree["labelled"]:
            sent = {"liked": [0], "disliked": [tree["leaves"] - 1]}
            status, body = call(server, f"/treerpo/picks/{folder}/{tree['id']}", sent)
            assert status == 200, body


def test_a_second_round_picks_on_the_trained_model_and_trains_on_every_pick(servers: Servers) -> None:
    server, name = servers.srv, "rounds"
    sampled(server, name, trees=1)  # round 1: two trees of the base model
    pick_all(server, name)
    first = server.run(round_graph(name), timeout=600)
    assert first["status"]["status_str"] == "success", first["status"]
    trees = state(server, name)["trees"]
    assert [t["lora"] is None for t in trees] == [True, True, False, False]  # who sampled each tree
    assert len({t["lora"] for t in trees[2:]}) == 1
    pick_all(server, name)  # round 2: the person picks on the trained model's trees
    again = server.run(round_graph(name), timeout=600)
    assert again["status"]["status_str"] == "success", again["status"]
    cached = next((set(m["nodes"]) for kind, m in again["status"]["messages"] if kind == "execution_cached"),
                  set())
    assert "10" not in cached  # new picks: the training node ran again, on every pick
    assert first["outputs"]["10"]["treerpo_picks"] == ["learned from 2 labelled trees"]
    assert again["outputs"]["10"]["treerpo_picks"] == [
        "learned from 4 labelled trees (2 of them sampled by a trained model)"]
    before = state(server, name)
    assert before["total"] == 6 and before["labelled"] == 4
    after = state(servers.restart(), name)  # every pick and every tree's model kept over a restart
    assert after == before


def test_training_from_picks_saves_a_lora_in_both_modes(server: Server, labelled: str) -> None:
    from safetensors.torch import load_file

    for mode in ("reward", "online"):
        result = server.run(train_graph(labelled, mode=mode, prefix=f"loras/picks_{mode}"), timeout=300)
        assert result["status"]["status_str"] == "success", result["status"]
        state_dict = load_file(server.base / "output" / "loras" / f"picks_{mode}.safetensors")
        assert state_dict and all(k.startswith("diffusion_model.") for k in state_dict), mode


def cached_nodes(result: dict) -> list[str]:
    return next(m["nodes"] for kind, m in result["status"]["messages"] if kind == "execution_cached")


def test_training_runs_again_when_picks_were_saved_though_no_widget_changed(server: Server,
                                                                           labelled: str) -> None:
    graph = train_graph(labelled, prefix="loras/picks_again")
    assert "10" not in cached_nodes(server.run(graph))
    assert "10" in cached_nodes(server.run(graph))  # nothing changed: ComfyUI's cache
    tree = next(t for t in state(server, labelled)["trees"] if t["labelled"])
    status, body = call(server, f"/treerpo/picks/{labelled}/{tree['id']}", {"liked": [3], "disliked": []})
    assert status == 200 and state(server, labelled)["labelled"] == 3, body
    result = server.run(graph)
    assert result["status"]["status_str"] == "success" and "10" not in cached_nodes(result)


def test_interrupt_stops_training_from_picks(server: Server, labelled: str) -> None:
    graph = train_graph(labelled, iterations=2000, prefix="loras/picks_interrupted")
    status, body = server.post_prompt(graph)
    assert status == 200, body
    prompt_id = body["prompt_id"]
    deadline = time.monotonic() + 120
    while not server.get("/queue")["queue_running"] and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(4.0)  # into the training rounds
    assert prompt_id not in server.get(f"/history/{prompt_id}"), "finished before it was interrupted"
    urllib.request.urlopen(urllib.request.Request(server.url + "/interrupt", data=b"", method="POST")).close()
    interrupted = time.monotonic()
    while prompt_id not in (history := server.get(f"/history/{prompt_id}")):
        assert time.monotonic() < interrupted + 60, "still training a minute after the interrupt"
        time.sleep(0.2)
    kinds = [kind for kind, _ in history[prompt_id]["status"]["messages"]]
    assert "execution_interrupted" in kinds, kinds
    assert not (server.base / "output" / "loras" / "picks_interrupted.safetensors").exists()
    assert server.get("/queue")["queue_running"] == []


def test_interrupt_while_sampling_keeps_every_whole_tree(server: Server) -> None:
    """Interrupted mid-way, the folder holds the trees stored so far, each whole, and nothing half-written;
    the panel's state lists exactly those."""
    name = "interrupted_sampling"
    status, body = server.post_prompt(sample_graph(name, trees=200))
    assert status == 200, body
    prompt_id = body["prompt_id"]
    deadline = time.monotonic() + 120
    while not (picks_dir(server, name) / "trees").is_dir() or len(state(server, name)["trees"]) < 2:
        assert time.monotonic() < deadline, "no tree stored in two minutes"
        time.sleep(0.2)
    urllib.request.urlopen(urllib.request.Request(server.url + "/interrupt", data=b"", method="POST")).close()
    interrupted = time.monotonic()
    while prompt_id not in (history := server.get(f"/history/{prompt_id}")):
        assert time.monotonic() < interrupted + 60, "still sampling a minute after the interrupt"
        time.sleep(0.2)
    assert "execution_interrupted" in [kind for kind, _ in history[prompt_id]["status"]["messages"]]
    folders = sorted((picks_dir(server, name) / "trees").iterdir())
    assert 2 <= len(folders) < 400 and not [f for f in folders if f.name.startswith(".")]
    for folder in folders:  # each stored tree whole: its record, tensors and 4 leaves
        assert {"tree.json", "tree.safetensors", "leaf_03.png", "picks"} <= {p.name for p in folder.iterdir()}
    assert [t["id"] for t in state(server, name)["trees"]] == [f.name for f in folders]


# ------------------------------------------------------------------------------ bad input, in one line


def copy_tree(folder: Path, tree: str, new_id: str, change: dict | None = None) -> Path:
    """A copy of a stored tree under another id, its tree.json changed by ``change`` (top-level keys, or
    ``model`` keys under "model.")."""
    target = folder / "trees" / new_id
    shutil.copytree(folder / "trees" / tree, target)
    meta = json.loads((target / "tree.json").read_text())
    for key, value in (change or {}).items():
        if key.startswith("model."):
            meta["model"][key.removeprefix("model.")] = value
        else:
            meta[key] = value
    (target / "tree.json").write_text(json.dumps(meta))
    return target


def labelled_copy(server: Server, source: str, name: str) -> Path:
    """A new picks folder holding the labelled trees of ``source``."""
    folder = picks_dir(server, name)
    (folder / "trees").mkdir(parents=True)
    for tree in state(server, source)["trees"]:
        if tree["labelled"]:
            shutil.copytree(picks_dir(server, source) / "trees" / tree["id"], folder / "trees" / tree["id"])
    return folder


def test_a_missing_or_empty_picks_folder_is_refused_at_validation(server: Server) -> None:
    node, message = refusal(server, train_graph("never_sampled"))
    assert node == "10" and message.startswith("picks_folder: there is no picks folder 'never_sampled' yet")
    (picks_dir(server, "empty") / "trees").mkdir(parents=True)
    node, message = refusal(server, train_graph("empty"))
    assert node == "10" and message.startswith("picks_folder: the picks folder "), message
    assert "holds no tree yet" in message, message


def test_a_folder_without_labelled_trees_is_refused_at_validation(server: Server) -> None:
    sampled(server, "unlabelled", seed=5)
    node, message = refusal(server, train_graph("unlabelled"))
    assert node == "10" and "none is labelled yet: pick the leaves you like first" in message, message


def test_mixed_image_sizes_are_refused_at_validation(server: Server, labelled: str) -> None:
    folder = labelled_copy(server, labelled, "mixed_sizes")
    first = sorted(p.name for p in (folder / "trees").iterdir())[0]
    copy_tree(folder, first, "20990101T000000000000Z_0000aaaa", {"image_size": [32, 32]})
    node, message = refusal(server, train_graph("mixed_sizes"))
    assert node == "10" and message.startswith("picks_folder: ") and "mixes image sizes" in message, message


def test_a_tree_with_every_leaf_picked_is_refused_at_validation(server: Server, labelled: str) -> None:
    folder = labelled_copy(server, labelled, "all_liked")
    tree = sorted(p.name for p in (folder / "trees").iterdir())[0]
    saved = next((folder / "trees" / tree / "picks").glob("*.json"))
    pick = json.loads(saved.read_text())
    pick.update(liked=[0, 1, 2, 3], disliked=[])
    (saved.parent / "29990101T000000000000Z_ffffffff.json").write_text(json.dumps(pick))  # the newest
    node, message = refusal(server, train_graph("all_liked"))
    assert node == "10" and message.startswith("picks_folder: the picks of tree ") and \
        "every leaf has the same mark" in message, message


def test_another_models_folder_is_refused_when_the_run_starts_before_training(server: Server,
                                                                                labelled: str) -> None:
    folder = labelled_copy(server, labelled, "other_model")
    for tree in (folder / "trees").iterdir():
        meta = json.loads((tree / "tree.json").read_text())
        meta["model"].update(name="someone else's", fingerprint="0123456789abcdef")
        (tree / "tree.json").write_text(json.dumps(meta))
    started = time.monotonic()
    message = run_error(server, train_graph("other_model", iterations=500))
    assert message.startswith("picks_folder: the picks folder ") and "was made with another model" in message
    assert "someone else's" in message and "\n" not in message, message
    assert time.monotonic() - started < 60  # refused before 500 rounds of training


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", " ", ".hidden"])
def test_a_folder_name_that_is_not_plain_is_refused_at_validation(server: Server, name: str) -> None:
    for graph, node in ((sample_graph(name), "2"), (train_graph(name), "10")):
        where, message = refusal(server, graph)
        assert where == node and message.startswith("picks_folder: "), message
        assert "plain folder name" in message or "name the picks folder" in message, message
    assert not (server.base / "output" / "escape").exists()


def test_prompts_the_embedded_model_cannot_read_are_refused_at_validation(server: Server) -> None:
    node, message = refusal(server, sample_graph("words", prompts="a purple dragon"))
    assert node == "2" and message.startswith("prompts: the embedded model does not know 'dragon'"), message
    node, message = refusal(server, sample_graph("words", prompts=" \n "))
    assert node == "2" and message.startswith("prompts: write what to draw"), message


def test_a_tree_over_the_leaf_budget_is_refused_at_validation(server: Server) -> None:
    graph = sample_graph("budget")
    graph["2"]["inputs"].update(depth=8, branching=8, steps=20)
    node, message = refusal(server, graph)
    assert node == "2" and message.startswith("depth: 8 splits of 8 branches"), message


# ------------------------------------------------------------------------------ a MODEL of ComfyUI's loaders

_FLOW_SCRIPT = r'''
import json, sys
from pathlib import Path
comfy_root, pack_root, tests_dir, work, settings = sys.argv[1:6]
sys.path.insert(0, comfy_root)
sys.path.insert(0, tests_dir)
import torch
import comfy.options
comfy.options.enable_args_parsing(False)
import comfy.cli_args
comfy.cli_args.args.cpu = True
import folder_paths
work = Path(work)
(work / "temp").mkdir(parents=True, exist_ok=True)
folder_paths.set_output_directory(str(work / "output"))
folder_paths.set_temp_directory(str(work / "temp"))
from comfy_families import StandInClip, StandInVae, latent_shape, load_pack, tiny_model
load_pack(pack_root)
from treerpo_pack.nodes.picks import TreeRPOSampleToPick, TreeRPOTrainFromPicks
from treerpo_pack.trainer.preferences.store import PickStore

out = {}
for family in ("SD3", "Flux"):
    base, clip, vae = tiny_model(family, seed=0), StandInClip(family), StandInVae(family)
    latent = {"samples": torch.zeros(1, *latent_shape(family))}
    name = f"tiny_{family}"
    with torch.inference_mode():  # as ComfyUI runs nodes
        leaves, folder = TreeRPOSampleToPick.execute(
            model=base, prompts="a red apple\na green pear", trees_per_prompt=1, seed=0, steps=4, depth=2,
            branching=2, window_start=0, noise_level=0.6, picks_folder=name, clip=clip, vae=vae,
            latent=latent).args
    store = PickStore(work / "output" / "treerpo_picks" / name)
    for i, tree in enumerate(store.tree_ids()):
        store.save_picks(tree, [i], [3])
    train = dict(picks_folder=name, guard_reward="none", keep_following="off (fixed weight)",
                 picks_weight=1.0, reward_weights="", mode="reward", settings=settings)
    TreeRPOTrainFromPicks.validate_inputs(**train)
    with torch.inference_mode():
        trained, _, run, lora = TreeRPOTrainFromPicks.execute(model=base, iterations=1, seed=0, clip=clip,
                                                              vae=vae, latent=latent, **train).args
    row = out[family] = {"leaves": list(leaves.shape), "folder": folder,
                         "kind": store.meta(store.tree_ids()[0]).model.kind,
                         "lora": len([k for k in lora if k.endswith("lora_up.weight")]),
                         "trained": float(sum(v.float().norm() for k, v in lora.items() if "lora_up" in k))}
    try:
        with torch.inference_mode():
            TreeRPOTrainFromPicks.execute(model=tiny_model(family, seed=1), iterations=1, seed=0, clip=clip,
                                          vae=vae, latent=latent, **train)
        row["other"] = None
    except ValueError as err:
        row["other"] = str(err)
print("RESULT " + json.dumps(out))
'''


def test_a_flow_model_of_comfyuis_loaders_samples_trees_and_trains_from_picks(tmp_path: Path) -> None:
    """SD3 and FLUX.1 (tiny random instances of ComfyUI's own classes, stand-in clip and vae:
    tests/comfy_families.py): trees stored with the model's kind, picks, one training round with a LoRA
    out, and another model's weights refused by name before training."""
    import subprocess
    import sys

    from comfyui_server import REPO

    root = require_comfyui()
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", _FLOW_SCRIPT, str(root), str(REPO), tests, str(tmp_path),
                           SETTINGS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    for family, row in out.items():
        assert row["leaves"][0] == 8 and row["leaves"][-1] == 3 and row["folder"] == f"tiny_{family}", row
        assert row["kind"] == "comfymodelpolicy" and row["lora"] >= 2 and row["trained"] > 0, row
        assert row["other"].startswith("picks_folder: the picks folder "), row
        assert "was made with another model" in row["other"], row
