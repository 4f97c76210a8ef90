"""One picks budget (trainer/config/picks_budget.py): the node on the embedded model, its pick-and-train
template, the headless preset configs/picks.yaml and ``treerpo bench taste`` train with it, so that what
the benchmark measures is what a person gets. Each test fails when one of them parts from it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, fields, replace
from pathlib import Path

from comfyui_server import REPO, require_comfyui

from dynamic_treerpo.trainer.bench.taste.as_node import node_config
from dynamic_treerpo.trainer.bench.taste.budget import TasteBudget, template_budget
from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.picks_budget import PICKS_BUDGET, TemplateTrees
from dynamic_treerpo.trainer.config.schema import TrainConfig

TEMPLATE = REPO / "workflows" / "api" / "pick_and_train.api.json"


def budget_of(config: TrainConfig) -> dict[str, object]:
    """The budget's fields as a training config holds them."""
    g = config.guard
    return {"lr": config.optim.lr, "prompts_per_iteration": config.data.prompts_per_iteration,
            "lora_rank": config.lora.rank, "lora_alpha": config.lora.alpha, "checkpoints": g.checkpoints,
            "validation_pairs": g.pairs, "weights": tuple(g.weights), "margin": g.margin,
            "measure": g.measure}


def shipped() -> dict[str, object]:
    return {f.name: getattr(PICKS_BUDGET, f.name) for f in fields(PICKS_BUDGET)
            if f.name not in ("iterations", "template")}


def template_nodes() -> dict[str, dict]:
    graph = json.loads(TEMPLATE.read_text(encoding="utf-8"))
    return {node["class_type"]: node["inputs"] for node in graph.values()}


def test_the_template_samples_the_budgets_trees_and_trains_with_its_defaults() -> None:
    nodes = template_nodes()
    sample, train = nodes["TreeRPOSampleToPick"], nodes["TreeRPOTrainFromPicks"]
    t = PICKS_BUDGET.template
    assert tuple(sample["prompts"].splitlines()) == t.prompts
    for name in ("trees_per_prompt", "seed", "steps", "depth", "branching", "window_start", "noise_level"):
        assert sample[name] == getattr(t, name), name
    assert train["iterations"] == PICKS_BUDGET.iterations
    assert train["settings"] == "", "the template's settings box would override the budget"
    assert (train["keep_following"], train["mode"], train["guard_reward"]) == ("closely", "reward", "scene")


def test_the_headless_preset_is_the_budget() -> None:
    config = load_config(TrainConfig, REPO / "configs" / "picks.yaml", [])
    assert budget_of(config) == shipped()
    assert config.iterations == PICKS_BUDGET.iterations
    assert config.reward == "picks:0.3,scene:0.7" and config.guard.keep == "closely"


def test_the_benchmark_trains_with_the_budget_as_the_node_does(tmp_path: Path) -> None:
    assert TasteBudget().picks_budget() == PICKS_BUDGET
    assert template_budget().picks_budget() == PICKS_BUDGET
    assert template_budget().trees == TemplateTrees().trees == 12
    config = node_config(PICKS_BUDGET, tmp_path / "folder", tmp_path / "prompts.txt", seed=3)
    assert budget_of(config) == shipped() and config.iterations == PICKS_BUDGET.iterations
    assert config.reward == "picks:0.3,scene:0.7"
    assert config.reward_weights == {"picks": str(tmp_path / "folder")}


_NODE_SCRIPT = r'''
import json, sys
from dataclasses import asdict, replace
comfy_root, pack_root, tests_dir, folder = sys.argv[1:5]
sys.path.insert(0, comfy_root)
sys.path.insert(0, tests_dir)
import comfy.options
comfy.options.enable_args_parsing(False)
import comfy.cli_args
comfy.cli_args.args.cpu = True
import folder_paths
import os
os.makedirs(folder + "_temp", exist_ok=True)
folder_paths.set_temp_directory(folder + "_temp")
from comfy_families import load_pack
load_pack(pack_root)
from treerpo_pack.nodes.picks import TreeRPOTrainFromPicks, picks_config
from treerpo_pack.trainer.config.picks_budget import PICKS_BUDGET
schema = TreeRPOTrainFromPicks.define_schema()
default = next(i for i in schema.inputs if i.id == "iterations").default
config = picks_config(PICKS_BUDGET.iterations, ["two red circles"], "scene", 0.15, {}, folder, "reward", 3,
                      "", PICKS_BUDGET.overrides(), "closely")
config = replace(config, data=replace(config.data, prompts="PROMPTS"))
print("RESULT " + json.dumps({"default": default, "config": asdict(config)}, default=str))
'''


def test_the_node_builds_the_benchmarks_config(tmp_path: Path) -> None:
    """TreeRPO Train LoRA from Picks on the embedded model (its widgets at their defaults, an empty
    settings box) builds the config the benchmark trains with, and its rounds widget starts at the
    budget's."""
    root = require_comfyui()
    folder = tmp_path / "folder"
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", _NODE_SCRIPT, str(root), str(REPO), tests, str(folder)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    assert out["default"] == PICKS_BUDGET.iterations
    bench = node_config(PICKS_BUDGET, folder, Path("PROMPTS"), seed=3)
    bench = replace(bench, data=replace(bench.data, prompts="PROMPTS"))
    assert out["config"] == json.loads(json.dumps(asdict(bench), default=str))
