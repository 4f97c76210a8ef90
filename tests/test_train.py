"""The headless trainer end to end on the embedded default, with settings small enough for CI."""

from __future__ import annotations

import csv
import itertools
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dynamic_treerpo.trainer.config.files import ConfigError, load_config, to_dict
from dynamic_treerpo.trainer.config.schema import OptimConfig, TrainConfig
from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
from dynamic_treerpo.trainer.inference.sample import load_lora_file
from dynamic_treerpo.trainer.models.patches import image_ids, pack
from dynamic_treerpo.trainer.training.loop import COLUMNS, Trainer
from dynamic_treerpo.trainer.training.run import resolve_config, run_training

TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]  # the `treerpo` command

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "data.prompts_per_iteration=2", "data.eval_pairs=4", "data.eval_every=2", "sampling.eval_steps=3",
    "tree.steps=5", "tree.depth=2", "tree.trees_per_prompt=1", "checkpoint_every=2",
    "window.every=1", "lora.rank=4", "lora.alpha=8.0",
]


def _config(*extra: str) -> TrainConfig:
    return load_config(TrainConfig, None, [*SMALL, *extra])


def test_default_yaml_is_the_builtin_default() -> None:
    loaded = load_config(TrainConfig, ROOT / "configs" / "default.yaml")
    assert to_dict(loaded) == to_dict(TrainConfig())
    keys = set(yaml.safe_load((ROOT / "configs/default.yaml").read_text()))
    assert {"iterations", "checkpoint_every"} <= keys


@pytest.fixture(scope="module")
def two_iterations(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run")
    run_training(_config("iterations=2"), run, progress=False)
    return run


def test_a_short_run_writes_every_artefact(two_iterations: Path) -> None:
    run = two_iterations
    for name in ("config.yaml", "metrics.csv", "summary.json", "checkpoints/latest.json",
                 "checkpoints/iter_000002/weights.safetensors", "checkpoints/iter_000002/optimizer.pt",
                 "checkpoints/iter_000002/state.pt", "lora/comfyui_lora.safetensors",
                 "lora/pytorch_lora_weights.safetensors", "lora/kohya_lora.safetensors",
                 "plots/reward.png", "samples/before.png",
                 "samples/after.png"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert [r["iteration"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["eval_reward"] and rows[2]["eval_reward"]  # base and final evaluations
    for row in rows[1:]:
        for key in ("strategy", "window_start", "reward_mean", "reward_std", "loss", "grpo_loss",
                    "prm_loss", "clip_frac", "nfe_rollout", "nfe_train", "wall_s"):
            assert row[key] != "", key
        # 2 prompts x (3 window forwards + 4 leaves x a 1-step DPM-Solver++(2M) tail of the 3 left)
        assert int(row["nfe_rollout"]) == 2 * (0 + 3 + 4 * 1) or int(row["window_start"]) > 0
    assert yaml.safe_load((run / "config.yaml").read_text())["iterations"] == 2


def _transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 48, 16, 16, generator=gen)
    with torch.no_grad():
        return transformer(hidden_states=pack(x),
                           encoder_hidden_states=torch.randn(2, 16, 64, generator=gen),
                           pooled_projections=torch.randn(2, 64, generator=gen),
                           timestep=torch.rand(2, generator=gen), img_ids=image_ids(16, 16),
                           txt_ids=torch.zeros(16, 3), return_dict=False)[0]


@pytest.mark.parametrize("fmt", ["comfyui_lora.safetensors", "pytorch_lora_weights.safetensors",
                                 "kohya_lora.safetensors"])
def test_exported_lora_reproduces_the_trained_model(two_iterations: Path, fmt: str) -> None:
    from dynamic_treerpo.trainer.lora.adapters import attach_lora, load_lora_state

    trained = EmbeddedPolicy.from_pretrained()
    attach_lora(trained.transformer, 4, 8.0, TrainConfig().lora.targets)
    ckpt = two_iterations / "checkpoints/iter_000002/weights.safetensors"
    load_lora_state(trained.transformer, load_file(ckpt))
    expected = _transformer_output(trained.transformer)
    base = _transformer_output(EmbeddedPolicy.from_pretrained().transformer)
    assert (expected - base).abs().max() > 1e-6  # training changed the model
    fresh = EmbeddedPolicy.from_pretrained()
    load_lora_file(fresh.transformer, two_iterations / "lora" / fmt)
    torch.testing.assert_close(_transformer_output(fresh.transformer), expected, rtol=0, atol=1e-5)


def test_comfyui_file_carries_alpha_tensors(two_iterations: Path) -> None:
    state = load_file(two_iterations / "lora/comfyui_lora.safetensors")
    alphas = [k for k in state if k.endswith(".alpha")]
    ups = [k for k in state if k.endswith("lora_up.weight")]
    assert all(k.startswith("diffusion_model.") for k in state)
    assert alphas and len(alphas) == len(ups)
    assert all(float(state[k]) == 8.0 for k in alphas)


# the tanh LayerTuning weight carries state (the reward spread s_ref), weighted up so a lost state shows;
# DiffusionNFT carries its old policy and the evaluation's average of the weights (every update here);
# DGPO its slow copy (AWM keeps the same one), which samples past the switch, and an average called twice
# an update
@pytest.mark.parametrize("extra", [(), ("loss.prm_weight=tanh", "loss.prm_lambda=0.3"),
                                   ("strategy=diffusionnft", "diffusionnft.group_size=4",
                                    "diffusionnft.decay_schedule=2", "data.eval_every=1"),
                                   ("strategy=dgpo", "dgpo.group_size=4", "dgpo.slow_decay_rate=0.2",
                                    "dgpo.switch_step=1", "data.eval_every=1")],
                         ids=["default", "tanh", "diffusionnft", "dgpo"])
def test_resume_equals_uninterrupted(tmp_path: Path, extra: tuple[str, ...]) -> None:
    straight = tmp_path / "straight"
    run_training(_config("iterations=4", *extra), straight, progress=False)
    split = tmp_path / "split"
    run_training(_config("iterations=2", *extra), split, progress=False)
    config = resolve_config(None, ["iterations=4", *extra], split, resume=True)
    run_training(config, split, resume=True, progress=False)
    a = load_file(straight / "checkpoints/iter_000004/weights.safetensors")
    b = load_file(split / "checkpoints/iter_000004/weights.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] - b[key]).abs().max() <= 1e-6, key
    with open(straight / "metrics.csv") as f, open(split / "metrics.csv") as g:
        ra, rb = list(csv.DictReader(f)), list(csv.DictReader(g))
    assert [r["reward_mean"] for r in ra] == [r["reward_mean"] for r in rb]
    assert [r["prm_weight"] for r in ra] == [r["prm_weight"] for r in rb]
    assert [r["eval_reward"] for r in ra] == [r["eval_reward"] for r in rb]


def test_diffusionnft_trains_on_its_leaves_with_an_old_policy() -> None:
    trainer = Trainer(_config("strategy=diffusionnft", "diffusionnft.group_size=4", "iterations=3"))
    old_before = [t.clone() for t in trainer.old.values]
    row = trainer.step(0)
    assert trainer.optimizer_steps == 1 and row["skipped_updates"] == 0
    assert row["nfe_train"] == 2 * 4 * 9 * 3  # 2 prompts x 4 images x 9 noise levels x (theta, old, ref)
    # after the first update, d = min(0.001 x 1, 0.5): old <- 0.001 old + 0.999 theta
    for old, before, param in zip(trainer.old.values, old_before, trainer.params, strict=True):
        assert torch.allclose(old, 0.001 * before + 0.999 * param.detach(), atol=1e-7)
    assert any(not torch.equal(a, b) for a, b in zip(old_before, trainer.old.values, strict=True))
    assert trainer.ema is not None  # its published evaluation averages the weights
    live, averaged = trainer.evaluate(average=False)[0], trainer.evaluate()[0]
    assert live["eval_reward"] != averaged["eval_reward"]


@pytest.mark.parametrize("strategy", ["awm", "dgpo"])
def test_awm_and_dgpo_keep_a_slow_copy_that_follows_the_trained_lora(strategy: str) -> None:
    trainer = Trainer(_config(f"strategy={strategy}", f"{strategy}.group_size=4",
                              f"{strategy}.slow_decay_rate=0.1", "iterations=3"), evaluation=False)
    assert not trainer.samples_with_old  # AWM never samples with it; DGPO only after switch_step
    for k in range(2):
        before = [t.clone() for t in trainer.old.values]
        row = trainer.step(k)
        assert trainer.optimizer_steps == k + 1 and row["skipped_updates"] == 0
        assert row["nfe_train"] == 2 * 4 * trainer.strategy.train_timesteps * 3  # theta, ref, slow copy
        d = min(0.3, 0.1 * (k + 1))  # copy <- d copy + (1 - d) theta after the step
        for old, b, param in zip(trainer.old.values, before, trainer.params, strict=True):
            assert torch.allclose(old, d * b + (1 - d) * param.detach(), atol=1e-7)
    assert trainer.ema is not None  # both publish an evaluation with an average of the weights


def test_dgpo_samples_with_its_slow_copy_after_the_switch() -> None:
    trainer = Trainer(_config("strategy=dgpo", "dgpo.group_size=4", "dgpo.switch_step=1"), evaluation=False)
    trainer.step(0)
    assert not trainer.samples_with_old  # 1 step done: not past the switch yet
    trainer.step(1)
    assert trainer.samples_with_old


def test_an_existing_run_is_never_overwritten(two_iterations: Path) -> None:
    with pytest.raises(ConfigError, match="already holds a run; add --resume"):
        run_training(_config("iterations=1"), two_iterations, progress=False)


def test_cli_bad_key_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run([*TREERPO, "train", "--out", str(tmp_path / "r"),
                          "--set", "tree.dept=3"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "treerpo train: error: unknown key 'tree.dept' (did you mean 'tree.depth'?)"]


def test_a_noise_pool_that_does_not_fit_the_image_fails_before_training(tmp_path: Path) -> None:
    out = subprocess.run([*TREERPO, "train", "--out", str(tmp_path / "r"),
                          "--set", "experimental.tree.noise_pool=3"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "treerpo train: error: noise pool 3 does not divide the 64x64 image grid")
    assert not (tmp_path / "r" / "metrics.csv").exists()


def test_kl_to_the_base_model_is_logged_when_enabled(tmp_path: Path) -> None:
    run_training(_config("iterations=2", "loss.kl_beta=0.1", "optim.lr=0.01",
                         "optim.updates_per_iteration=1"), tmp_path / "kl",
                 progress=False)
    with open(tmp_path / "kl" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[1]["kl"]) == 0.0  # the LoRA starts at zero: the model is its reference
    assert float(rows[2]["kl"]) > 0.0  # after an update the two differ


def test_cosine_schedule_lowers_the_learning_rate_to_its_floor() -> None:
    optim = OptimConfig(lr=1e-3, schedule="cosine", warmup=2, min_lr_ratio=0.1)
    rates = [optim.lr_at(i, 12) for i in range(12)]
    assert rates[:2] == pytest.approx([1e-3 / 3, 2e-3 / 3])  # linear warm-up
    assert rates[2] == pytest.approx(1e-3)
    assert all(a > b for a, b in itertools.pairwise(rates[2:]))
    assert rates[-1] > 1e-4 and optim.lr_at(12, 12) == pytest.approx(1e-4)
    assert OptimConfig(lr=1e-3).lr_at(7, 12) == 1e-3
    with pytest.raises(ValueError, match="schedule must be"):
        OptimConfig(schedule="step")


def test_the_learning_rate_of_each_iteration_is_logged(tmp_path: Path) -> None:
    run_training(_config("iterations=3", "optim.lr=0.002", "optim.schedule=cosine"), tmp_path / "r",
                 progress=False)
    with open(tmp_path / "r" / "metrics.csv") as f:
        rates = [float(r["lr"]) for r in csv.DictReader(f) if r["lr"]]
    assert rates == pytest.approx([0.002, 0.0015, 0.0005])


def test_epochs_reuse_each_rollout_and_see_moved_ratios(tmp_path: Path) -> None:
    rows = {}
    for epochs in (1, 2):
        out = tmp_path / f"e{epochs}"
        run_training(_config("iterations=1", "optim.updates_per_iteration=1", "optim.lr=0.01",
                             f"optim.epochs={epochs}"), out, progress=False)
        with open(out / "metrics.csv") as f:
            rows[epochs] = next(r for r in csv.DictReader(f) if r["nfe_train"])
    assert int(rows[2]["nfe_train"]) == 2 * int(rows[1]["nfe_train"])
    assert float(rows[1]["ratio_dev_max"]) == 0.0  # one pass: every ratio is taken at theta_old
    assert float(rows[2]["ratio_dev_max"]) > 0.0  # the second pass sees the updated policy
    assert rows[1]["reward_mean"] == rows[2]["reward_mean"]  # the same rollout
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        OptimConfig(epochs=0)


def test_full_fine_tuning_trains_every_weight_exports_a_transformer_and_resumes(tmp_path: Path) -> None:
    from diffusers import FluxTransformer2DModel

    full = ["lora.enabled=false", "optim.lr=1e-4"]
    straight = tmp_path / "straight"
    run_training(_config("iterations=2", *full), straight, progress=False)
    exported = FluxTransformer2DModel.from_pretrained(straight / "lora" / "transformer")
    base = EmbeddedPolicy.from_pretrained().transformer
    moved = [name for name, p in exported.named_parameters()
             if not torch.equal(p, base.get_parameter(name))]
    # not a LoRA: weights outside the attention/MLP projections move too (norms, embedders)
    assert any("norm" in n for n in moved) and any("embedder" in n for n in moved)
    split = tmp_path / "split"
    run_training(_config("iterations=1", *full), split, progress=False)
    run_training(resolve_config(None, ["iterations=2"], split, resume=True), split, resume=True,
                 progress=False)
    a = load_file(straight / "checkpoints/iter_000002/weights.safetensors")
    b = load_file(split / "checkpoints/iter_000002/weights.safetensors")
    assert a.keys() == b.keys() and len(a) == len(dict(base.named_parameters()))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6


def test_a_training_prompt_file_lends_held_out_prompts_and_drops_drift(tmp_path: Path) -> None:
    from dynamic_treerpo.trainer.training.loop import Trainer

    prompts = ["a red circle", "a blue square", "a green triangle", "two red circles",
               "a yellow square on the left", "a blue circle at the top"]
    file = tmp_path / "prompts.txt"
    file.write_text("\n".join(prompts) + "\n")
    config = _config(f"data.prompts={file}", "data.eval_pairs=2")
    trainer = Trainer(config)
    held_out = {p.prompt for p in trainer.eval_pairs}
    assert len(held_out) == 2 and held_out <= set(prompts)
    assert trainer.prompts.pool is not None and held_out.isdisjoint(trainer.prompts.pool)
    assert set(trainer.prompts.pool) | held_out == set(prompts)
    metrics, _ = trainer.evaluate()
    assert "eval_reward" in metrics and "drift" not in metrics  # no ideal renders for a file's prompts
    with pytest.raises(ValueError, match=r"holding out data\.eval_pairs=6 .* leaves none to train on"):
        Trainer(_config(f"data.prompts={file}", "data.eval_pairs=6"))


def test_training_steps_continue_as_one_run_and_leave_the_given_model_alone() -> None:
    """Front ends train in steps: two steps of one iteration equal one step of two, and the model
    a step was given (held by other ComfyUI nodes) is not changed."""
    from dynamic_treerpo.trainer.training.session import train_steps

    config = _config("iterations=2")
    base = EmbeddedPolicy.from_pretrained()
    before = {k: v.clone() for k, v in base.transformer.state_dict().items()}
    whole = train_steps(base.fresh_copy(), config, 2)
    first = train_steps(base.fresh_copy(), config, 1)
    second = train_steps(base.fresh_copy(), config, 1, previous=first)
    assert second.iterations_done == 2 and len(second.history) == 2
    assert [r["reward_mean"] for r in second.history] == [r["reward_mean"] for r in whole.history]
    for key, value in whole.weights.items():
        assert (value - second.weights[key]).abs().max() <= 1e-6, key
    assert all(torch.equal(v, base.transformer.state_dict()[k]) for k, v in before.items())
    with pytest.raises(ValueError, match="cannot continue a run with another seed"):
        train_steps(base.fresh_copy(), _config("iterations=2", "seed=1"), 1, previous=first)


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        out.update(_flat(value, path + ".") if isinstance(value, dict) else {path: value})
    return out


PUBLISHED_DIFFERENCES = {
    # strategy: (the loss fields that differ from Dynamic-TreeRPO's, and their published values)
    # every value pinned to its anchor in tests/test_published.py
    "mixgrpo": {"advantage": "leaf", "clip.mode": "fixed", "prm_lambda": 0.0, "std_ddof": 1,
                "edge_weighting": "transition"},
    "mixgrpo_flash": {"advantage": "leaf", "clip.mode": "fixed", "prm_lambda": 0.0, "std_ddof": 1,
                      "edge_weighting": "transition"},
    "dancegrpo": {"advantage": "leaf", "clip.mode": "fixed", "prm_lambda": 0.0, "std_ddof": 1,
                  "edge_weighting": "transition"},
    "flow_grpo": {"advantage": "leaf", "clip.mode": "fixed", "prm_lambda": 0.0, "advantage_std": "global",
                  "std_eps": 1e-4, "kl_beta": 0.04, "kl_form": "flow_grpo", "edge_weighting": "transition"},
    "flow_grpo_fast": {"advantage": "leaf", "clip.mode": "fixed", "clip.fixed": 1e-5, "prm_lambda": 0.0,
                       "advantage_std": "global", "std_eps": 1e-4, "kl_form": "flow_grpo",
                       "edge_weighting": "transition"},
    "branchgrpo": {"node_value": "mean", "clip.mode": "fixed", "clip.fixed": 1e-3, "prm_lambda": 0.0,
                   "std_ddof": 1, "flat_std": 1e-6, "edge_weighting": "transition"},
    "diffusionnft": {"advantage": "leaf", "prm_lambda": 0.0, "advantage_std": "global",
                     "std_eps": 1e-4, "edge_weighting": "transition"},
    "awm": {"advantage": "leaf", "prm_lambda": 0.0, "advantage_std": "global", "std_eps": 1e-4,
            "edge_weighting": "transition"},
    "dgpo": {"advantage": "leaf", "prm_lambda": 0.0, "std_eps": 1e-4, "edge_weighting": "transition",
             "reward_mix": "raw"},
}


@pytest.mark.parametrize("strategy", sorted(PUBLISHED_DIFFERENCES))
def test_a_baseline_trains_with_its_published_loss_differing_from_the_tree_only_there(strategy: str) -> None:
    tree = TrainConfig()
    baseline = replace(tree, strategy=strategy)
    ours, theirs = _flat(to_dict(tree.effective_loss)), _flat(to_dict(baseline.effective_loss))
    differs = {k: theirs[k] for k in ours if ours[k] != theirs[k]}
    assert differs == PUBLISHED_DIFFERENCES[strategy]
    assert (theirs["adv_clip"], theirs["clip.asymmetric"]) == (5.0, False)
    assert tree.effective_clip_spread.enabled and not baseline.effective_clip_spread.enabled
    assert tree.effective_loss == tree.loss  # Dynamic-TreeRPO: the loss section as configured
    shared = replace(baseline, baseline_loss="shared")
    assert shared.effective_loss == tree.loss and shared.effective_clip_spread == tree.clip_spread
    # the published loss wins over the loss section, which only ``shared`` applies
    tuned = replace(baseline, loss=replace(tree.loss, prm_lambda=0.5))
    assert tuned.effective_loss.prm_lambda == 0.0


def test_flow_grpo_published_kl_needs_a_lora() -> None:
    with pytest.raises(ValueError, match=r"flow_grpo's published loss .* needs a LoRA"):
        _config("strategy=flow_grpo", "lora.enabled=false")


def test_a_baseline_run_uses_the_fixed_published_clip_without_rescale() -> None:
    trainer = Trainer(_config("strategy=mixgrpo", "mixgrpo.group_size=4", "mixgrpo.steps=5",
                              "mixgrpo.window_size=2", "iterations=1"), evaluation=False)
    trainer.step(0)
    clip = trainer.loss_config().clip
    assert (clip.mode, clip.fixed, clip.scale) == ("fixed", 1e-4, 1.0)
    assert trainer.spread.ema is None  # no spread folded in: the rescale is off
