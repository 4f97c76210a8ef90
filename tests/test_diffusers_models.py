"""FLUX.1 and SD3 policies against diffusers' own pipelines, on tiny random models built offline.

Each folder is what ``save_pretrained`` writes for a tiny FluxPipeline / StableDiffusion3Pipeline
(transformer, 4-block VAE, CLIP/T5 with hidden size 16-32, tokenizers from a 56-token vocabulary).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import diffusers
import pytest
import torch
from packaging.version import Version

from dynamic_treerpo.trainer.lora.adapters import attach_lora
from dynamic_treerpo.trainer.models.diffusers_common import (
    FP8_DIFFUSERS,
    PromptCache,
    check_resolution,
    parse_dtype,
)
from dynamic_treerpo.trainer.models.flux import FluxPolicy
from dynamic_treerpo.trainer.models.patches import pack, unpack
from dynamic_treerpo.trainer.models.sd3 import SD3Policy

ROOT = Path(__file__).resolve().parents[1]
SIZE = 64  # pixels: latents 8x8 through the 4-block VAE, 16 packed tokens
LETTERS = "abcdefghijklmnopqrstuvwxyz"
PROMPTS = ["a red cat", "two dogs"]


# ------------------------------------------------------------------------------ tiny parts
def clip_tokenizer():
    """A letter-level CLIP BPE tokenizer (no merges) from files, as real folders ship it; the Rust
    tokenizer on transformers 4 and 5 alike (the pack's own loader)."""
    import tempfile

    from dynamic_treerpo.trainer.compat.transformers_api import clip_tokenizer as load

    vocab = {c: i for i, c in enumerate(LETTERS)}
    vocab.update({c + "</w>": len(LETTERS) + i for i, c in enumerate(LETTERS)})
    vocab.update({"<|startoftext|>": 2 * len(LETTERS), "<|endoftext|>": 2 * len(LETTERS) + 1})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        (Path(tmp) / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 77}),
                                                          encoding="utf-8")
        return load(tmp)


def t5_tokenizer():
    """A letter-level T5 (Unigram) tokenizer built with the tokenizers library, for both versions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)]
    pieces += [(c, -2.0) for c in LETTERS] + [("\u2581" + c, -1.5) for c in LETTERS]
    core = Tokenizer(models.Unigram(pieces, unk_id=2))
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                           extra_ids=0)


def tiny_vae(scaling: float, shift: float):
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 8, 8, 8),
                         layers_per_block=1, latent_channels=16, norm_num_groups=4, sample_size=SIZE,
                         scaling_factor=scaling, shift_factor=shift, use_quant_conv=False,
                         use_post_quant_conv=False)


def clip_model(hidden: int, projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=2 * len(LETTERS) + 2, hidden_size=hidden, intermediate_size=37,
                            num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=77,
                            projection_dim=hidden, bos_token_id=52, eos_token_id=53, pad_token_id=53)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()


def t5_model(d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=56, d_model=d_model, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
                      relative_attention_num_buckets=8, dropout_rate=0.1)
    return T5EncoderModel(config).eval()


def flux_transformer(seed: int = 0, guidance_embeds: bool = True):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    return FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                  attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                  pooled_projection_dim=32, guidance_embeds=guidance_embeds,
                                  axes_dims_rope=(4, 6, 6))


def sd3_transformer(seed: int = 0):
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(seed)
    return SD3Transformer2DModel(sample_size=SIZE // 8, patch_size=2, in_channels=16, num_layers=2,
                                 attention_head_dim=8, num_attention_heads=4, joint_attention_dim=32,
                                 caption_projection_dim=32, pooled_projection_dim=32, out_channels=16,
                                 pos_embed_max_size=16, dual_attention_layers=(0,), qk_norm="rms_norm")


def flux_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    torch.manual_seed(1)
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15),
        vae=tiny_vae(0.3611, 0.1159), text_encoder=clip_model(32, projection=False),
        tokenizer=clip_tokenizer(), text_encoder_2=t5_model(32), tokenizer_2=t5_tokenizer(),
        transformer=flux_transformer())


def sd3_pipeline(with_t5: bool = True):
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    torch.manual_seed(2)
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=tiny_vae(1.5305, 0.0609),
        text_encoder=clip_model(16, projection=True), tokenizer=clip_tokenizer(),
        text_encoder_2=clip_model(16, projection=True), tokenizer_2=clip_tokenizer(),
        text_encoder_3=t5_model(32) if with_t5 else None, tokenizer_3=t5_tokenizer() if with_t5 else None,
        transformer=sd3_transformer())


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("flux")
    flux_pipeline().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sd3")
    sd3_pipeline().save_pretrained(path)
    return path


def load_flux(path: Path, **kwargs) -> FluxPolicy:
    return FluxPolicy.from_pretrained(path, **{"height": SIZE, "width": SIZE, "dtype": "float32", **kwargs})


def load_sd3(path: Path, **kwargs) -> SD3Policy:
    return SD3Policy.from_pretrained(path, **{"height": SIZE, "width": SIZE, "dtype": "float32", **kwargs})


def euler(policy, noise: torch.Tensor, sigmas: torch.Tensor, cond) -> torch.Tensor:
    """Euler steps driven by the policy's velocity, on the pipeline's own sigma grid."""
    x = noise.clone()
    for s, s_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist(), strict=True):
        x = x - (s - s_next) * policy.velocity(x, torch.full((x.shape[0],), s), cond)
    return x


def run_pipeline(pipe, latents: torch.Tensor, steps: int,
                 guidance: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's images and its final latents (caught by the step callback)."""
    final = {}

    def grab(_pipe, _i, _t, kwargs):
        final["latents"] = kwargs["latents"].clone()
        return kwargs

    images = pipe(prompt=PROMPTS, height=SIZE, width=SIZE, num_inference_steps=steps, guidance_scale=guidance,
                  latents=latents, output_type="pt", callback_on_step_end=grab).images
    return images, final["latents"]


# ------------------------------------------------------------------------------ agreement
def test_flux_euler_and_decode_match_the_pipeline(flux_dir: Path) -> None:
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(flux_dir, local_files_only=True)
    policy = load_flux(flux_dir, guidance=3.5, decode_batch=1)
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    images, packed = run_pipeline(pipe, pack(noise), steps=4, guidance=3.5)
    reference = unpack(packed, *policy.latent_shape)
    sigmas = pipe.scheduler.sigmas  # the dynamically shifted grid the pipeline used, ending at 0
    mine = euler(policy, noise, sigmas, policy.encode(PROMPTS))
    assert (mine - reference).abs().max() < 1e-4  # measured: 0.0 (float32, same math)
    assert (reference - noise).abs().max() > 0.5  # the model moved the latents
    rows: list[int] = []
    policy.vae.decoder.register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[0]))
    decoded = policy.decode(reference)
    assert rows == [1, 1]  # decode_batch=1: one VAE call per row
    assert decoded.dtype == torch.float32 and decoded.shape == images.shape
    assert (decoded - images).abs().max() < 1e-5  # measured: 1.5e-6
    # sensitivity: the guidance embedding and the prompts both change the result
    policy.guidance = 1.0
    assert (euler(policy, noise, sigmas, policy.encode(PROMPTS)) - reference).abs().max() > 1e-3
    policy.guidance = 3.5
    assert (euler(policy, noise, sigmas, policy.encode(PROMPTS[::-1])) - reference).abs().max() > 1e-3


def test_sd3_euler_with_cfg_and_decode_match_the_pipeline(sd3_dir: Path) -> None:
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir, local_files_only=True)
    policy = load_sd3(sd3_dir, guidance=4.5, decode_batch=1)
    assert policy.forwards_per_row == 2
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    images, reference = run_pipeline(pipe, noise, steps=3, guidance=4.5)
    mine = euler(policy, noise, pipe.scheduler.sigmas, policy.encode(PROMPTS))
    assert (mine - reference).abs().max() < 1e-4  # measured: 1.9e-6 (float32)
    assert (reference - noise).abs().max() > 0.5
    decoded = policy.decode(reference)
    assert (decoded - images).abs().max() < 1e-5  # measured: 3.4e-6
    policy.guidance = 2.0  # a different guidance scale must show
    other = euler(policy, noise, pipe.scheduler.sigmas, policy.encode(PROMPTS))
    assert (other - reference).abs().max() > 1e-3


def test_sd3_cfg_is_one_doubled_batch(sd3_dir: Path) -> None:
    guided = load_sd3(sd3_dir, guidance=4.5)
    plain = SD3Policy(guided.transformer, guided.vae, height=SIZE, width=SIZE,
                      prompt_encoder=guided.cache.encoder, guidance=1.0)
    assert (guided.forwards_per_row, plain.forwards_per_row) == (2, 1)
    batches: list[int] = []
    guided.transformer.register_forward_hook(
        lambda _m, _a, kw, _o: batches.append(kw["hidden_states"].shape[0]), with_kwargs=True)
    x = torch.randn(3, *guided.latent_shape, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.9, 0.5, 0.2])
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    v = guided.velocity(x, sigma, guided.encode(prompts))
    assert batches == [6]  # one transformer call with [uncond; cond]
    batches.clear()
    with torch.no_grad():
        v_cond = plain.velocity(x, sigma, plain.encode(prompts))
        v_uncond = plain.velocity(x, sigma, plain.encode(["", "", ""]))
    assert batches == [3, 3]
    expected = v_uncond + 4.5 * (v_cond - v_uncond)
    assert (v - expected).abs().max() < 1e-5
    assert (v_cond - v_uncond).abs().max() > 1e-3


def test_encode_runs_each_text_encoder_once_per_distinct_prompt(flux_dir: Path, sd3_dir: Path) -> None:
    for policy in (load_flux(flux_dir), load_sd3(sd3_dir, guidance=4.5)):
        calls: list[int] = []

        def count(_module, args, _out, calls=calls):
            calls.append(args[0].shape[0])

        for module in policy.text_modules:
            module.register_forward_hook(count)
        first = policy.encode(["a cat", "a dog", "a cat"])
        assert calls == [2] * len(policy.text_modules)  # each encoder ran once, on the 2 distinct prompts
        calls.clear()
        again = policy.encode(["a dog", "a cat"])
        assert calls == []  # served from the cache
        for key, value in first.items():
            assert value.shape[0] == 3 and value.device == policy.device
            assert torch.equal(again[key][0], first[key][1]) and torch.equal(first[key][0], first[key][2])
        if isinstance(policy, SD3Policy):
            policy.uncond()
            policy.uncond()
            assert calls == [1] * len(policy.text_modules)  # "" encoded once, then cached
        policy.train()  # T5 has dropout 0.1: train mode must not reach the text encoders
        assert all(not m.training for m in policy.text_modules) and policy.transformer.training
        policy.cache.rows.clear()
        assert torch.equal(policy.encode(["a cat"])["prompt_embeds"][0], first["prompt_embeds"][0])


# ------------------------------------------------------------------------------ training
def lora_gradients(policy, x: torch.Tensor, sigma: torch.Tensor, cond) -> dict[str, torch.Tensor]:
    policy.train()
    for p in policy.trainable_parameters():
        p.grad = None
    loss = policy.velocity(x, sigma, cond).square().mean()
    loss.backward()
    return {n: p.grad.clone() for n, p in policy.transformer.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_lora_gradients_flow_and_checkpointing_changes_nothing(family: str, flux_dir: Path,
                                                               sd3_dir: Path) -> None:
    policy = load_flux(flux_dir) if family == "flux" else load_sd3(sd3_dir, guidance=4.5)
    assert not list(policy.trainable_parameters())  # frozen until the trainer attaches a LoRA
    attach_lora(policy.transformer, rank=4, alpha=4.0, targets=["to_q", "to_k", "to_v", "to_out.0"])
    with torch.no_grad():  # B = 0 at attach: give it values so that A receives gradient too
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    names = [n for n, _ in policy.transformer.named_parameters() if "lora_" in n]
    assert len(list(policy.trainable_parameters())) == len(names) > 0
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    sigma = torch.tensor([0.8, 0.3])
    cond = policy.encode(PROMPTS)
    plain = lora_gradients(policy, x, sigma, cond)
    assert all(float(g.abs().sum()) > 0 for g in plain.values())

    block = policy.transformer.transformer_blocks[0]
    runs: list[int] = []
    block.register_forward_pre_hook(lambda *_: runs.append(1))
    policy.transformer.enable_gradient_checkpointing()
    checkpointed = lora_gradients(policy, x, sigma, cond)
    assert len(runs) == 2  # the block ran again during backward: checkpointing is active
    for name, grad in plain.items():
        assert torch.allclose(checkpointed[name], grad, rtol=1e-4, atol=1e-7), name


def test_gradient_checkpointing_option(flux_dir: Path) -> None:
    assert load_flux(flux_dir, gradient_checkpointing=True).transformer.gradient_checkpointing
    assert not load_flux(flux_dir).transformer.gradient_checkpointing


def test_bfloat16_weights_with_float32_step_math(flux_dir: Path) -> None:
    full = load_flux(flux_dir)
    half = FluxPolicy.from_pretrained(flux_dir, height=SIZE, width=SIZE)  # dtype defaults to bfloat16
    assert half.dtype == torch.bfloat16 and half.text_encoder_2.dtype == torch.bfloat16
    assert half.vae.dtype == torch.float32
    x = torch.randn(2, *full.latent_shape, generator=torch.Generator().manual_seed(4))
    sigma = torch.tensor([0.7, 0.4])
    v_full = full.velocity(x, sigma, full.encode(PROMPTS))
    v_half = half.velocity(x, sigma, half.encode(PROMPTS))
    assert v_half.dtype == torch.float32
    assert (v_half - v_full).abs().max() < 0.05 * v_full.abs().max()


# ------------------------------------------------------------------------------ construction
def test_prompt_encoder_instead_of_text_encoders(flux_dir: Path) -> None:
    loaded = load_flux(flux_dir)
    calls: list[list[str]] = []

    def fixed(prompts: list[str]) -> dict[str, torch.Tensor]:
        calls.append(list(prompts))
        return loaded.cache.encoder(prompts)

    policy = FluxPolicy(loaded.transformer, None, height=SIZE, width=SIZE, prompt_encoder=fixed)
    assert policy.latent_shape == (16, SIZE // 8, SIZE // 8) and policy.image_tokens == (SIZE // 16) ** 2
    cond = policy.encode(PROMPTS + PROMPTS)
    policy.encode(PROMPTS)
    assert calls == [PROMPTS]
    x = torch.randn(4, *policy.latent_shape, generator=torch.Generator().manual_seed(5))
    sigma = torch.full((4,), 0.5)
    assert torch.equal(policy.velocity(x, sigma, cond), loaded.velocity(x, sigma, loaded.encode(PROMPTS * 2)))
    with pytest.raises(ValueError, match="without a VAE"):
        policy.decode(x)
    with pytest.raises(ValueError, match="CLIP and T5"):
        FluxPolicy(loaded.transformer, None, height=SIZE, width=SIZE)
    bad = PromptCache(lambda p: {"prompt_embeds": torch.zeros(1, 2, 3)}, ("prompt_embeds", "pooled"))
    with pytest.raises(ValueError, match="no 'pooled'"):
        bad.get(["a"], torch.device("cpu"))
    with pytest.raises(ValueError, match="do not fit"):
        policy.velocity(torch.zeros(1, 16, 4, 4), torch.ones(1), cond)


def test_single_file_transformer(tmp_path: Path, flux_dir: Path, sd3_dir: Path) -> None:
    from safetensors.torch import save_file

    for family, folder, build in (("flux", flux_dir, flux_transformer), ("sd3", sd3_dir, sd3_transformer)):
        other = build(seed=7)  # different weights than the folder's, in diffusers' own key layout
        file = tmp_path / f"{family}-finetune.safetensors"
        save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(file))
        load = load_flux if family == "flux" else load_sd3
        from_file = load(folder, transformer_file=file)
        from_folder = load(folder)
        x = torch.randn(2, *from_file.latent_shape, generator=torch.Generator().manual_seed(6))
        sigma = torch.tensor([0.6, 0.2])
        cond = from_file.encode(PROMPTS)
        v_file = from_file.velocity(x, sigma, cond)
        expected = type(from_file)(other, None, height=SIZE, width=SIZE,
                                   prompt_encoder=from_file.cache.encoder, guidance=from_file.guidance)
        assert torch.allclose(v_file, expected.velocity(x, sigma, cond), atol=1e-6)
        assert (v_file - from_folder.velocity(x, sigma, cond)).abs().max() > 1e-3


def test_sd3_without_t5(tmp_path: Path, sd3_dir: Path) -> None:

    folder = tmp_path / "sd3-no-t5"
    pipe = sd3_pipeline(with_t5=False)
    pipe.save_pretrained(folder)
    policy = load_sd3(folder, max_sequence_length=16)
    assert policy.text_encoder_3 is None
    cond = policy.encode(PROMPTS)
    embeds, _, pooled, _ = pipe.encode_prompt(PROMPTS, None, None, do_classifier_free_guidance=False,
                                              max_sequence_length=16)
    # diffusers before 0.32 pads the missing T5 part to 77 tokens whatever max_sequence_length says:
    # zeros either way, so compare the CLIP tokens and check the rest is zero on both sides
    assert cond["prompt_embeds"].shape[1] == 77 + 16
    assert torch.allclose(cond["prompt_embeds"][:, :77], embeds[:, :77])
    assert not embeds[:, 77:].any()
    assert torch.allclose(cond["pooled_prompt_embeds"], pooled)
    assert not cond["prompt_embeds"][:, 77:].any()  # zeros where T5 would be
    skipped = load_sd3(sd3_dir, use_t5=False)  # the folder has T5; the option leaves it out
    assert skipped.text_encoder_3 is None and not skipped.encode(["a"])["prompt_embeds"][:, 77:].any()


# ------------------------------------------------------------------------------ errors
def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_errors_are_one_line(tmp_path: Path, flux_dir: Path, sd3_dir: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_flux(tmp_path / "nowhere")
    assert "black-forest-labs/FLUX.1-dev" in one_line(err)

    broken = tmp_path / "flux-no-t5"
    shutil.copytree(flux_dir, broken)
    shutil.rmtree(broken / "text_encoder_2")
    with pytest.raises(FileNotFoundError) as err:
        load_flux(broken)
    assert "text_encoder_2" in one_line(err) and "T5" in one_line(err)

    no_weights = tmp_path / "flux-no-vae-weights"
    shutil.copytree(flux_dir, no_weights)
    for f in (no_weights / "vae").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_flux(no_weights)
    assert "vae" in one_line(err)

    corrupt = tmp_path / "flux-corrupt"
    shutil.copytree(flux_dir, corrupt)
    weights = next((corrupt / "vae").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError) as err:
        load_flux(corrupt)
    assert "vae" in one_line(err) and "corrupt" in one_line(err)

    bad_file = tmp_path / "bad.safetensors"
    bad_file.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError) as err:
        load_flux(flux_dir, transformer_file=bad_file)
    assert "bad.safetensors" in one_line(err)
    with pytest.raises(FileNotFoundError) as err:
        load_flux(flux_dir, transformer_file=tmp_path / "missing.safetensors")
    assert "missing.safetensors" in one_line(err)

    with pytest.raises(ValueError) as err:
        load_flux(sd3_dir)
    assert "StableDiffusion3Pipeline" in one_line(err)

    sd3_broken = tmp_path / "sd3-no-t5-files"
    shutil.copytree(sd3_dir, sd3_broken)
    shutil.rmtree(sd3_broken / "text_encoder_3")
    with pytest.raises(FileNotFoundError) as err:
        load_sd3(sd3_broken)
    assert "stabilityai/stable-diffusion-3.5" in one_line(err) and "use_t5=False" in one_line(err)

    for height in (60, 0, 72):
        with pytest.raises(ValueError) as err:
            load_flux(flux_dir if height else tmp_path / "nowhere", height=height, width=SIZE)
        assert "multiple of 16" in one_line(err)
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("float8")
    check_resolution(512, 768)


# ------------------------------------------------------------------------------ the GPU smoke script
def load_smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "scripts" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_gpu_smoke_runs_tiny_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    smoke = load_smoke()
    assert smoke.main(["--tiny"]) == 0
    out = capsys.readouterr().out
    results = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            fields = dict(item.split("=", 1) for item in line.split()[1:])
            results[fields["model"]] = fields
    assert set(results) == {"flux", "sd3"}, out
    for fields in results.values():
        for key in ("iteration_s", "rollout_fwd_per_s", "train_fwd_per_s", "peak_mem_gib"):
            assert float(fields[key]) > 0, (key, fields)
    assert "iteration 2" in out and "ok" in out.splitlines()[-1]


@pytest.mark.skipif(Version(diffusers.__version__) < Version(FP8_DIFFUSERS),
                    reason=f"fp8 storage needs diffusers>={FP8_DIFFUSERS}; below, tests/test_versions.py "
                           "checks that model.quantize: fp8 is refused in one line")
def test_gpu_smoke_trains_over_fp8_weights(capsys: pytest.CaptureFixture[str]) -> None:
    """``--quantize fp8`` (the memory check of an fp8 base) runs its two iterations and says so."""
    smoke = load_smoke()
    assert smoke.main(["--tiny", "--models", "flux", "--quantize", "fp8", "--rank", "8"]) == 0
    out = capsys.readouterr().out
    result = next(line for line in out.splitlines() if line.startswith("RESULT "))
    assert "quantize=fp8 rank=8" in result and "ok" in out.splitlines()[-1]


def test_gpu_smoke_times_strategies_at_the_papers_setting(capsys: pytest.CaptureFixture[str]) -> None:
    smoke = load_smoke()
    chosen = "mixgrpo,dynamic_treerpo,branchgrpo"
    assert smoke.main(["--tiny", "--models", "flux", "--strategies", chosen]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        if line.startswith(("RESULT ", "RATIO ")):
            fields = dict(item.split("=", 1) for item in line.split()[1:])
            rows.setdefault(fields["strategy"], {}).update(fields)
    assert set(rows) == set(chosen.split(","))
    # the paper's setting: 16 images, forwards as treerpo nfe counts them (FLUX: one forward per row)
    forwards = [rows[s]["rollout_forwards"] for s in ("mixgrpo", "dynamic_treerpo", "branchgrpo")]
    assert forwards == ["400", "201", "257"]  # BranchGRPO splits at 0, 3, 6, 9 of 25 (its 0.15 T spacing)
    assert float(rows["mixgrpo"]["vs_mixgrpo"]) == 1.0 and rows["dynamic_treerpo"]["paper_table1"] == "0.629"
    assert rows["branchgrpo"]["paper_table1"] == "-"
    assert smoke.main(["--tiny", "--strategies", "nope"]) == 2


def test_gpu_smoke_fails_loudly(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    smoke = load_smoke()
    assert smoke.main(["--tiny", "--models", "nope"]) == 2
    monkeypatch.setattr(smoke, "brightness_reward",
                        lambda images, prompts: {"reward": torch.full((images.shape[0],), float("nan"))})
    assert smoke.main(["--tiny", "--models", "flux"]) == 1
    assert "FAILED model=flux" in capsys.readouterr().out


def test_gpu_smoke_measures_the_flux_pick_template_tiny_on_cpu(tmp_path: Path) -> None:
    """``--template flux_pick_fp8 --tiny``: the picks template on tiny random weights in ComfyUI, through
    every stage (files, sampling with the training node refused for want of picks, the scripted picks,
    training, before/after images), one RESULT line each and one for the run; the files are where its
    loaders and weight widgets name them. The GPU run (``bash scripts/gpu_smoke.sh --template
    flux_pick_fp8``) is the same code at the real shapes. ComfyUI runs in a subprocess (global state)."""
    import os
    import subprocess

    from comfyui_server import require_comfyui

    root = require_comfyui()
    env = {**os.environ, "TREERPO_COMFYUI": str(root), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), "--template", "flux_pick_fp8",
               "--tiny", "--work", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stages = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            fields = dict(item.split("=", 1) for item in line.split()[1:])
            assert fields["template"] == "flux_pick_fp8"
            stages[fields["stage"]] = fields
    assert list(stages) == ["files", "sample", "pick", "train", "compare", "all"], done.stdout
    assert stages["sample"]["trees"] == stages["pick"]["trees"] == "1"
    assert stages["train"]["iterations"] == "1"
    assert all(float(s["seconds"]) > 0 for s in stages.values())
    assert float(stages["all"]["peak_gib"]) > 0 and stages["all"]["peak_mem_source"] == "cpu_peak_rss"
    refused = [line for line in done.stdout.splitlines() if "refused at validation" in line]
    assert len(refused) == 1 and "stage sample: node 7" in refused[0] and "no picks folder" in refused[0]
    models = tmp_path / "models"
    for name in ("diffusion_models/flux1-dev.safetensors", "text_encoders/t5xxl_fp8_e4m3fn.safetensors",
                 "text_encoders/clip_l.safetensors", "vae/ae.safetensors",
                 "rewards/PickScore_v1/config.json"):
        assert (models / name).is_file(), name
    assert list((tmp_path / "output" / "loras").glob("treerpo_flux_taste*.safetensors"))
    assert done.stdout.splitlines()[-1].endswith("ok")
    assert load_smoke().main(["--template", "nope", "--tiny"]) == 2
