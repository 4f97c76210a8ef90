"""GPU smoke test of the diffusers policies: two Dynamic-TreeRPO iterations per model, full size.

Builds a FLUX.1-dev-size ``FluxTransformer2DModel`` (19 double + 38 single blocks, 24 heads x 128,
guidance embedding; ~11.9B parameters) and an SD3.5-large-size ``SD3Transformer2DModel`` (38
layers, 38 heads x 64, qk RMS norm; ~8.1B parameters) with random bf16 weights directly on the GPU
(no download), wraps each in its policy with fixed random conditioning instead of text encoders
(FLUX: 512 T5 tokens x 4096 + pooled 768; SD3: 77 + 256 = 333 tokens x 4096 + pooled 2048, CFG 4.5
so every row is a doubled batch), a tiny random VAE kept on the CPU between decodes (offload), and
a brightness reward. It attaches a LoRA (r=16 on to_q/to_k/to_v/to_out.0), turns on gradient
checkpointing, and runs two iterations of the trainer's core (``build_plan``, ``rollout``,
``prepare_targets``, ``backward_over_tree``, an AdamW step) at 512x512 pixels: 64x64 latents,
i.e. 1024 image tokens for both models (FLUX packs 2x2 latents, SD3 patchifies 2x2). The tree:
10 steps, window at step 3, depth 3, branching 2, one prompt (42 rollout rows, 7 trained forwards,
8 leaves).

Per model it prints a ``RESULT`` line: the second (warm) iteration's time, model forwards per
second in the rollout and in training (rows x ``forwards_per_row``; a training forward includes
its backward and the checkpoint recomputation), and peak memory (``torch.cuda.max_memory_allocated``;
the process's peak RSS on the CPU). It exits non-zero on any failure: non-finite latents, loss or
gradient norm, a LoRA that did not move, or a VAE that did not return to the CPU.

Measured on one H200 (torch 2.11, cuDNN attention off; docs/models.md): FLUX 4.3 s per warm
iteration, 25.3 GiB peak; SD3.5-large 4.2 s, 19.0 GiB; about 20 s per model including
construction, far inside the 8-minute budget. ``--tiny`` runs tiny configs on the CPU in seconds
(the test suite runs it).

``--quantize fp8`` stores the transformer's weights in float8_e4m3fn (``model.quantize: fp8``), for the
memory of an fp8 base (``--models flux --quantize fp8 --rank 32`` against ``--models flux --rank 32``);
its peak counts from after the cast (random weights are built on the GPU in bf16; the trainer casts on
the host before the move, so its bf16 copy never reaches the GPU).

``--strategies all`` (or a comma list) times instead one warm iteration of every strategy at the
paper's setting (``treerpo nfe``'s configs: 25 steps, window at 10, depth 4, binary branching, 16
images per prompt for every strategy, each baseline with its published loss), after one warm-up
iteration, and prints each one's time against MixGRPO's beside the paper's Table 1 ratios.

``--template flux_pick_fp8`` (or ``flux_dev_train_fp8``) measures a ComfyUI template instead
(``scripts/template_run.py``): it writes random weights of the real files' shapes under the template's
file names (FLUX.1-dev stored in fp8, CLIP-L, T5-XXL in fp8, the autoencoder, PickScore's or HPS-v2.1's
ViT-H-14 CLIP), loads ComfyUI with this pack in this process, and runs the template's own graph through
ComfyUI's loaders, model classes and executor: for the picks template, sampling trees, a scripted
person's picks through the picks store, training (PickScore's CLIP as the features and the guard) and
the before/after images. Every widget is as saved except the run's length (``--trees-per-prompt``,
``--iterations``, ``--prompts``; the guard's validation pairs with ``--guard-pairs``). A card of
``--card-gib`` (default 24) is emulated on a larger one by a ballast tensor that ComfyUI and torch both
see as used; the peaks are reported without it. One ``RESULT`` line per stage (files, sample, pick,
train, compare: seconds, peak allocated and reserved memory, the models ComfyUI holds) and one for the
whole run. It needs ComfyUI (``$TREERPO_COMFYUI`` or ``.comfyui``) and about 19 GB of disk for the files
(``--work DIR``; a temporary folder by default). ``--tiny`` runs it on the CPU at 32 px with tiny models.
"""

from __future__ import annotations

import argparse
import gc
import math
import resource
import sys
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamic_treerpo.trainer.bench.protocol.nfe import PAPER_TREE, strategy_configs
from dynamic_treerpo.trainer.config.published import published_loss
from dynamic_treerpo.trainer.core.flow import flux_sigmas, shifted_sigmas
from dynamic_treerpo.trainer.core.objective import LossConfig, backward_over_tree, prepare_targets
from dynamic_treerpo.trainer.core.strategies import StrategyConfig, TreeConfig, build_plan, strategy_name
from dynamic_treerpo.trainer.core.tree import rollout
from dynamic_treerpo.trainer.lora.adapters import attach_lora
from dynamic_treerpo.trainer.models.diffusers_common import store_weights_in_fp8
from dynamic_treerpo.trainer.models.flux import FluxPolicy
from dynamic_treerpo.trainer.models.sd3 import SD3Policy

FLUX_DEV = {"patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38,
            "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 4096,
            "pooled_projection_dim": 768, "guidance_embeds": True, "axes_dims_rope": (16, 56, 56)}
SD35_LARGE = {"sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 38,
              "attention_head_dim": 64, "num_attention_heads": 38, "joint_attention_dim": 4096,
              "caption_projection_dim": 2432, "pooled_projection_dim": 2048, "out_channels": 16,
              "pos_embed_max_size": 192, "qk_norm": "rms_norm"}
TINY_FLUX = {**FLUX_DEV, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
             "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 32,
             "axes_dims_rope": (4, 6, 6)}
TINY_SD3 = {**SD35_LARGE, "sample_size": 8, "num_layers": 2, "attention_head_dim": 8,
            "num_attention_heads": 4, "joint_attention_dim": 32, "caption_projection_dim": 32,
            "pooled_projection_dim": 32, "pos_embed_max_size": 16}
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
TREE = TreeConfig(steps=10, window_start=3, depth=3, branching=2)
PROMPTS = ["a red fox in the snow"]
# the paper's Table 1 (FLUX.1-dev, seconds per iteration) as ratios to MixGRPO's 240 s
PAPER_TABLE1 = {"dancegrpo": 323 / 240, "mixgrpo": 1.0, "mixgrpo_flash": 166 / 240,
                "dynamic_treerpo": 151 / 240}


@dataclass(frozen=True)
class ModelCase:
    name: str
    cls_name: str
    config: dict
    text_tokens: int
    policy: type
    sigmas: Callable[[int, int], torch.Tensor]  # (steps, image tokens) -> grid


def cases(tiny: bool) -> list[ModelCase]:
    return [
        ModelCase("flux", "FluxTransformer2DModel", TINY_FLUX if tiny else FLUX_DEV, 512, FluxPolicy,
                  lambda steps, tokens: flux_sigmas(steps, tokens)),
        ModelCase("sd3", "SD3Transformer2DModel", TINY_SD3 if tiny else SD35_LARGE, 77 + 256, SD3Policy,
                  lambda steps, tokens: shifted_sigmas(steps, 3.0)),
    ]


# ------------------------------------------------------------------------------ building
def build_transformer(case: ModelCase, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Random weights created on ``device`` in ``dtype`` (no float32 copy, no host round trip)."""
    import diffusers

    cls = getattr(diffusers, case.cls_name)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = cls(**case.config)
    finally:
        torch.set_default_dtype(previous)
    for buffer in model.buffers():  # e.g. SD3's float32 position table; parameters are already ``dtype``
        if buffer.is_floating_point():
            buffer.data = buffer.data.to(dtype)
    return model


def tiny_vae(latent_channels: int):
    """A 4-block random VAE (8x down/up-sampling like the real ones) with few channels."""
    from diffusers import AutoencoderKL

    torch.manual_seed(1)
    return AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 8, 8, 8),
                         layers_per_block=1, latent_channels=latent_channels,
                         norm_num_groups=4, scaling_factor=0.5, shift_factor=0.1, use_quant_conv=False,
                         use_post_quant_conv=False)


def random_conditioning(tokens: int, width: int, pooled: int) -> Callable[[list[str]], dict]:
    """Fixed random embeddings per prompt (seeded by the prompt), standing in for CLIP/T5."""

    def encode(prompts: list[str]) -> dict[str, torch.Tensor]:
        rows, pools = [], []
        for prompt in prompts:
            gen = torch.Generator().manual_seed(zlib.crc32(prompt.encode()))
            rows.append(torch.randn(tokens, width, generator=gen))
            pools.append(torch.randn(pooled, generator=gen))
        return {"prompt_embeds": torch.stack(rows), "pooled_prompt_embeds": torch.stack(pools)}

    return encode


def brightness_reward(images: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
    return {"reward": images.float().mean(dim=(1, 2, 3)).cpu()}


# ------------------------------------------------------------------------------ running
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "cpu_peak_rss"


def fail(message: str) -> None:
    raise RuntimeError(message)


def iteration(policy, optimizer, params, sigmas: torch.Tensor, index: int, loss_cfg: LossConfig,
              strategy: StrategyConfig = TREE) -> dict:
    """One iteration as ``Trainer.step`` runs it (one update per rollout)."""
    device = policy.device
    start = time.perf_counter()
    plan = build_plan(strategy, sigmas, seed=index, noise_unshuffle=policy.latent_unshuffle)
    policy.eval()
    cond = policy.encode(PROMPTS)
    sync(device)
    t0 = time.perf_counter()
    tree = rollout(policy.velocity, cond, plan, [1234 + index], policy.latent_shape, device=device)
    sync(device)
    rollout_s = time.perf_counter() - t0
    if not bool(torch.isfinite(tree.leaf_latents).all()):
        fail("non-finite latents after the rollout")
    images = policy.decode(tree.leaf_latents)
    if policy.vae is not None and policy.offload.enabled and policy.vae.device.type != "cpu":
        fail("the offloaded VAE did not return to the CPU after decode")
    rewards = brightness_reward(images, PROMPTS * images.shape[0])["reward"]
    targets = prepare_targets(tree, rewards, loss_cfg, seed=index)
    sync(device)
    t1 = time.perf_counter()
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    stats = backward_over_tree(policy.velocity, cond, tree, targets, loss_cfg)
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    if not (math.isfinite(stats.loss) and bool(torch.isfinite(norm))):
        fail(f"non-finite loss {stats.loss} or gradient norm {float(norm)}")
    optimizer.step()
    sync(device)
    train_s = time.perf_counter() - t1
    per_row = getattr(policy, "forwards_per_row", 1)
    return {"iteration_s": time.perf_counter() - start, "rollout_s": rollout_s, "train_s": train_s,
            "rollout_forwards": tree.nfe * per_row, "train_forwards": stats.train_nfe * per_row,
            "reward": float(rewards.mean()), "loss": stats.loss, "grad_norm": float(norm),
            "leaves": int(tree.leaf_node.numel())}


def run_case(case: ModelCase, device: torch.device, dtype: torch.dtype, size: int,
             strategies: list[str] | None = None, quantize: str = "none", rank: int = 16) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    transformer = build_transformer(case, device, dtype)
    count = sum(p.numel() for p in transformer.parameters())
    if quantize == "fp8":  # the trainer stores fp8 on the host before the move; random weights are built
        store_weights_in_fp8(transformer, dtype)  # on the GPU, so the peak counts from after the cast
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    build_s = time.perf_counter() - t0
    cfg = transformer.config
    encoder = random_conditioning(case.text_tokens, int(cfg.joint_attention_dim),
                                  int(cfg.pooled_projection_dim))
    channels = int(cfg.in_channels) // 4 if case.policy is FluxPolicy else int(cfg.in_channels)
    policy = case.policy(transformer, tiny_vae(channels), height=size, width=size, prompt_encoder=encoder,
                         offload=True, gradient_checkpointing=True, decode_batch=4, device=device,
                         compute_dtype=dtype)
    attach_lora(policy.transformer, rank=rank, alpha=float(rank), targets=LORA_TARGETS, seed=0)
    params = list(policy.trainable_parameters())
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    print(f"[{case.name}] {count / 1e6:.1f}M parameters ({dtype}) built in {build_s:.1f} s; latents "
          f"{policy.latent_shape}, {policy.image_tokens} image tokens, {case.text_tokens} text tokens, "
          f"forwards_per_row={getattr(policy, 'forwards_per_row', 1)}, "
          f"LoRA {sum(p.numel() for p in params) / 1e6:.2f}M", flush=True)
    if strategies:
        return time_strategies(case, policy, optimizer, params, strategies)
    sigmas = case.sigmas(TREE.steps, policy.image_tokens)
    results = []
    for index in range(2):
        r = iteration(policy, optimizer, params, sigmas, index, LossConfig())
        results.append(r)
        print(f"[{case.name}] iteration {index + 1}: {r['iteration_s']:.2f} s "
              f"(rollout {r['rollout_forwards']} forwards in {r['rollout_s']:.2f} s, "
              f"training {r['train_forwards']} in {r['train_s']:.2f} s), "
              f"{r['leaves']} leaves, reward {r['reward']:.4f}, loss {r['loss']:.4g}, "
              f"grad norm {r['grad_norm']:.3g}", flush=True)
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(params, before, strict=True))
    if not moved > 0.0:
        fail("the LoRA did not change in two optimizer steps")
    peak, source = peak_memory_gib(device)
    warm = results[-1]
    summary = {"iteration_s": warm["iteration_s"], "first_iteration_s": results[0]["iteration_s"],
               "rollout_fwd_per_s": warm["rollout_forwards"] / warm["rollout_s"],
               "train_fwd_per_s": warm["train_forwards"] / warm["train_s"], "peak_mem_gib": peak}
    print(f"RESULT model={case.name} quantize={quantize} rank={rank} "
          + " ".join(f"{k}={v:.3f}" for k, v in summary.items())
          + f" peak_mem_source={source} build_s={build_s:.1f}", flush=True)
    del policy, transformer, optimizer, params, before
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return summary


def time_strategies(case: ModelCase, policy, optimizer, params, names: list[str]) -> dict:
    """One warm-up iteration, then one timed iteration of each named strategy at the paper's setting."""
    configs = strategy_configs(PAPER_TREE)
    sigmas = case.sigmas(PAPER_TREE.steps, policy.image_tokens)
    iteration(policy, optimizer, params, sigmas, 0, LossConfig(), PAPER_TREE)  # warm-up, not timed
    times = {}
    for index, name in enumerate(names, start=1):
        cfg = configs[name]
        loss = LossConfig()
        if not isinstance(cfg, TreeConfig):  # a baseline with its own published loss
            loss = published_loss(strategy_name(cfg), loss)
        r = iteration(policy, optimizer, params, sigmas, index, loss, cfg)
        times[name] = r["iteration_s"]
        print(f"RESULT model={case.name} strategy={name} iteration_s={r['iteration_s']:.3f} "
              f"rollout_forwards={r['rollout_forwards']} train_forwards={r['train_forwards']} "
              f"leaves={r['leaves']}", flush=True)
    if "mixgrpo" in times:
        for name, t in times.items():
            paper = PAPER_TABLE1.get(name)
            print(f"RATIO model={case.name} strategy={name} vs_mixgrpo={t / times['mixgrpo']:.3f} "
                  f"paper_table1={'-' if paper is None else f'{paper:.3f}'}", flush=True)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU (seconds)")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    parser.add_argument("--models", default="flux,sd3", help="comma-separated subset of flux,sd3")
    parser.add_argument("--size", type=int, default=None, help="pixels (default 512; 64 with --tiny)")
    parser.add_argument("--strategies", default=None,
                        help="time one iteration of each strategy at the paper's setting instead: 'all' or "
                             "a comma-separated subset of " + ",".join(strategy_configs(PAPER_TREE)))
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="allow attention's cuDNN backend (off, as in the trainer: with torch 2.11 and "
                             "cuDNN 9.19 it failed FLUX's backward with an illegal memory access)")
    parser.add_argument("--quantize", choices=("none", "fp8"), default="none",
                        help="fp8: the transformer's weights stored in float8_e4m3fn (model.quantize)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = rank)")
    parser.add_argument("--template", default=None,
                        help="measure a ComfyUI template on random weights of its files' shapes instead: "
                             "flux_pick_fp8 or flux_dev_train_fp8 (scripts/template_run.py)")
    parser.add_argument("--work", type=Path, default=None,
                        help="template: folder for the random model files and ComfyUI's output (kept); "
                             "default: a temporary folder, removed after")
    parser.add_argument("--trees-per-prompt", type=int, default=1,
                        help="template: trees to sample per prompt")
    parser.add_argument("--prompts", type=int, default=None,
                        help="template: sample the first N prompts (default: every prompt; 1 with --tiny)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="template: training rounds (default 2; 1 with --tiny)")
    parser.add_argument("--guard-pairs", type=int, default=4,
                        help="template: validation pairs of the picks trainer's guard, when it has one")
    parser.add_argument("--card-gib", type=float, default=24.0,
                        help="template: emulate a card of this many GiB on a larger one (0: the whole card)")
    args = parser.parse_args(argv)
    if args.template is not None:
        return template_main(args)
    if not args.cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device (use --tiny for the CPU check)", file=sys.stderr)
        return 2
    dtype = torch.float32 if args.tiny else torch.bfloat16
    size = args.size or (64 if args.tiny else 512)
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    chosen = [c for c in cases(args.tiny) if c.name in wanted]
    if not chosen or len(chosen) != len(wanted):
        print(f"gpu_smoke: unknown model in {args.models!r}; choose from flux,sd3", file=sys.stderr)
        return 2
    known = list(strategy_configs(PAPER_TREE))
    strategies = None
    if args.strategies:
        strategies = known if args.strategies == "all" else [s.strip() for s in args.strategies.split(",")]
        unknown = [s for s in strategies if s not in known]
        if unknown:
            print(f"gpu_smoke: unknown strategy {unknown[0]!r}; choose from {','.join(known)}",
                  file=sys.stderr)
            return 2
    start = time.perf_counter()
    if device.type == "cuda":
        print(f"gpu_smoke: {torch.cuda.get_device_name(device)}, torch {torch.__version__}", flush=True)
    failed = False
    for case in chosen:
        try:
            run_case(case, device, dtype, size, strategies, args.quantize, args.rank)
        except Exception as err:  # report the model and go on with the next; the exit code says it failed
            failed = True
            traceback.print_exc()
            print(f"FAILED model={case.name}: {type(err).__name__}: {err}", flush=True)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"gpu_smoke: total {time.perf_counter() - start:.1f} s, {'FAILED' if failed else 'ok'}", flush=True)
    return 1 if failed else 0


# ------------------------------------------------------------------------------ a ComfyUI template
def template_main(args: argparse.Namespace) -> int:
    """``--template``: the template's stages on random weights, one RESULT line each (see the docstring)."""
    import shutil
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import template_run

    if args.template not in template_run.TEMPLATES:
        print(f"gpu_smoke: no template {args.template!r}; choose from {','.join(template_run.TEMPLATES)}",
              file=sys.stderr)
        return 2
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device (use --tiny for the CPU check)", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    else:
        print(f"gpu_smoke: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, emulating a "
              f"{args.card_gib:g} GiB card; attention as ComfyUI runs it (cuDNN SDPA "
              f"{'on' if torch.backends.cuda.cudnn_sdp_enabled() else 'off'})", flush=True)
    iterations = args.iterations or (1 if args.tiny else 2)
    prompts = args.prompts or (1 if args.tiny else None)
    work = args.work or Path(tempfile.mkdtemp(prefix="treerpo_template_"))
    start = time.perf_counter()
    try:
        graph = template_run.first_prompts(template_run.template(args.template), prompts)
        side = 32 if args.tiny else None
        stages = template_run.run_template(
            args.template, work, args.tiny, device, args.trees_per_prompt, iterations, side, args.card_gib,
            report=lambda line: print(f"[{args.template}] {line}", flush=True), graph=graph,
            guard_pairs=args.guard_pairs)
    except Exception as err:  # one line says what failed; the traceback is above it
        traceback.print_exc()
        print(f"FAILED template={args.template}: {type(err).__name__}: {err}", flush=True)
        return 1
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    source = "cuda_max_allocated" if device.type == "cuda" else "cpu_peak_rss"
    for stage in stages:
        fields = {"template": args.template, "stage": stage.name, "seconds": f"{stage.seconds:.2f}"}
        if stage.peak_gib is not None:
            fields |= {"peak_gib": f"{stage.peak_gib:.2f}", "reserved_gib": f"{stage.reserved_gib:.2f}",
                       "resident_gib": f"{stage.resident_gib:.2f}"}
        fields |= {k: str(v) for k, v in stage.extra.items()}
        if stage.name == "train":
            fields["iterations"] = str(iterations)
        if stage.loaded:
            fields["comfy_loaded_gib"] = ",".join(f"{label}:{gib:.2f}" for label, gib in stage.loaded)
        print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
        for node, errors in stage.refused.items():  # the first run refuses training: no picks yet
            print(f"[{args.template}] stage {stage.name}: node {node} refused at validation: {errors[0]}")
    peaks = [s.peak_gib for s in stages if s.peak_gib is not None]
    peak = max(peaks) if peaks else peak_memory_gib(device)[0]
    print(f"RESULT template={args.template} stage=all seconds={time.perf_counter() - start:.2f} "
          f"peak_gib={peak:.2f} peak_mem_source={source} card_gib={args.card_gib:g}", flush=True)
    print(f"gpu_smoke: total {time.perf_counter() - start:.1f} s, ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
