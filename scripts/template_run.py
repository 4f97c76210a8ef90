"""Run a FLUX.1-dev template of ``workflows/`` in ComfyUI on random weights, stage by stage.

The FLUX templates need files this project cannot ship (FLUX.1-dev, its text encoders and autoencoder,
PickScore or HPS-v2.1). Here random weights stand in for them, written as files of the same names and
layouts into a ComfyUI models folder, so that the template's own graph runs through ComfyUI's own loaders
(``UNETLoader`` with its fp8 ``weight_dtype``, ``DualCLIPLoader`` type flux, ``VAELoader``), ComfyUI's
own model classes and the pack's nodes, validated and executed by ComfyUI's ``validate_prompt`` and
``PromptExecutor`` as the server runs a queued prompt. ``scripts/gpu_smoke.py --template`` measures a
template's memory and time this way on a GPU; the tests run the tiny form on a CPU.

Two sizes:

* **real**: every file at its release's shapes (FLUX.1-dev 11.9B parameters, written in fp8 as
  UNETLoader's ``fp8_e4m3fn`` keeps them; CLIP-L; T5-XXL in fp8; the 16-channel autoencoder; PickScore's
  or HPS-v2.1's ViT-H-14 CLIP), about 19 GB of files.
* **tiny**: FLUX 64 wide (2 double + 2 single blocks), T5 32 wide, tiny CLIPs; CLIP-L and the autoencoder
  stay at their real size (ComfyUI builds them from fixed configs). ComfyUI's detection fixes FLUX's 24
  heads of 128 and T5-XXL's config, so :func:`tiny_shim` changes exactly those two: the head count and
  rope axes it reads for a FLUX file narrower than 3072, and T5's config through ComfyUI's own
  per-encoder override (``model_options["t5xxl_model_config"]``).

A template that picks (``flux_pick_fp8``) runs as a person uses it: the first run samples the trees while
ComfyUI refuses the training branch ("no picks folder yet"), a scripted person then picks through the
picks store (:func:`scripted_picks`: the brightest two leaves liked, the darkest disliked), and the next
run trains and draws the before/after images.

ComfyUI is imported inside the functions (from ``$TREERPO_COMFYUI`` or the checkout's ``.comfyui``):
import this module anywhere, call :func:`boot` in a process that may hold ComfyUI's global state.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / "workflows" / "api"
GIB = 2**30

# ComfyUI's unet_config of FLUX.1-dev (what comfy/model_detection.py reads from flux1-dev.safetensors)
FLUX_DEV = {"image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16,
            "vec_in_dim": 768, "context_in_dim": 4096, "hidden_size": 3072, "mlp_ratio": 4.0, "num_heads": 24,
            "depth": 19, "depth_single_blocks": 38, "axes_dim": [16, 56, 56], "theta": 10000, "patch_size": 2,
            "qkv_bias": True}
TINY_T5 = {"d_ff": 64, "d_kv": 16, "d_model": 32, "num_heads": 2, "num_layers": 2}
TINY_HEADS, TINY_AXES = 2, [8, 12, 12]  # 64 wide: 2 heads of 32 = 8 + 12 + 12 rope channels
TINY_FLUX = {**FLUX_DEV, "hidden_size": 64, "num_heads": TINY_HEADS, "axes_dim": TINY_AXES, "depth": 2,
             "depth_single_blocks": 2, "context_in_dim": TINY_T5["d_model"]}
# the FLUX autoencoder as comfy/sd.py builds it for ae.safetensors (16 latent channels, no quant convs)
AE_CONFIG = {"double_z": True, "z_channels": 16, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
             "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}
# PickScore_v1 is a transformers CLIPModel of ViT-H-14's shape (laion/CLIP-ViT-H-14-laion2B-s32B-b79K)
PICKSCORE = {"text_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                             "num_attention_heads": 16, "max_position_embeddings": 77, "vocab_size": 49408,
                             "hidden_act": "gelu"},
             "vision_config": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                               "num_attention_heads": 16, "image_size": 224, "patch_size": 14,
                               "hidden_act": "gelu"},
             "projection_dim": 1024}
TINY_PICKSCORE = {"text_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "max_position_embeddings": 77,
                                  "vocab_size": 49408, "hidden_act": "gelu"},
                  "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                    "num_attention_heads": 2, "image_size": 32, "patch_size": 8,
                                    "hidden_act": "gelu"},
                  "projection_dim": 16}
# HPS-v2.1 is open_clip's ViT-H-14 (head widths 80 image, 64 text: trainer/rewards/clip_family.py)
HPS = {"embed_dim": 1024, "vision_cfg": {"layers": 32, "width": 1280, "head_width": 80, "patch_size": 14,
                                          "image_size": 224, "mlp_ratio": 4.0},
       "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 1024, "heads": 16, "layers": 24,
                    "mlp_ratio": 4.0}}
TINY_HPS = {"embed_dim": 16, "vision_cfg": {"layers": 2, "width": 80, "head_width": 80, "patch_size": 8,
                                             "image_size": 32, "mlp_ratio": 1.0},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 2,
                         "mlp_ratio": 1.0}}

# The files each template names (its loaders' widgets and its reward weights), and what they hold.
FILES = {
    "diffusion_models/flux1-dev.safetensors": "flux",
    "text_encoders/clip_l.safetensors": "clip_l",
    "text_encoders/t5xxl_fp8_e4m3fn.safetensors": "t5xxl",
    "vae/ae.safetensors": "ae",
    "rewards/PickScore_v1": "pickscore",
    "rewards/HPS_v2.1_compressed.pt": "hps-v2.1",
}
FLUX_FP8 = ["diffusion_models/flux1-dev.safetensors", "text_encoders/clip_l.safetensors",
            "text_encoders/t5xxl_fp8_e4m3fn.safetensors", "vae/ae.safetensors"]
TEMPLATES = {"flux_pick_fp8": [*FLUX_FP8, "rewards/PickScore_v1"],
             "flux_dev_train_fp8": [*FLUX_FP8, "rewards/HPS_v2.1_compressed.pt"]}


# ------------------------------------------------------------------------------ random weights


def random_tensor(name: str, shape: tuple[int, ...], generator: torch.Generator, device: torch.device
                  ) -> torch.Tensor:
    """Values with O(1) activations: norm gains 1, matrices N(0, 1/fan_in), biases and vectors small."""
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) == 0:
        return torch.tensor(math.log(100.0))  # a CLIP's logit scale
    if len(shape) == 1 and leaf in ("weight", "scale", "gamma"):
        return torch.ones(shape, device=device)
    value = torch.randn(shape, generator=generator, device=device)
    if len(shape) >= 2 and (leaf == "weight" or leaf.endswith("proj")):
        return value / math.sqrt(math.prod(shape[1:]))
    return value * (0.02 if leaf == "bias" else 0.1)


def random_state(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, device: torch.device, seed: int
                 ) -> dict[str, torch.Tensor]:
    """A state dict of ``shapes`` with random values, made on ``device`` (fast on a GPU), held on the CPU in
    ``dtype``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return {name: random_tensor(name, tuple(shape), generator, device).to(dtype).cpu().contiguous()
            for name, shape in shapes.items()}


def meta_shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def flux_shapes(tiny: bool) -> dict[str, tuple[int, ...]]:
    """The keys and shapes of a FLUX.1-dev diffusion-model file (the original layout ComfyUI reads)."""
    import comfy.supported_models

    config = comfy.supported_models.Flux(dict(TINY_FLUX if tiny else FLUX_DEV))
    config.set_inference_dtype(torch.bfloat16, None)
    with torch.device("meta"):
        model = config.get_model({}, device=torch.device("meta"))
    return meta_shapes(model.diffusion_model)


def text_encoder_shapes(tiny: bool) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """The keys and shapes of clip_l.safetensors and the T5-XXL file, from ComfyUI's own encoder classes."""
    import comfy.sd1_clip
    import comfy.text_encoders.sd3_clip

    with torch.device("meta"):
        clip_l = comfy.sd1_clip.SDClipModel(device="meta", dtype=torch.float16)
        options = {"t5xxl_model_config": dict(TINY_T5)} if tiny else {}
        t5 = comfy.text_encoders.sd3_clip.T5XXLModel(device="meta", dtype=torch.float16,
                                                     model_options=options)
    return meta_shapes(clip_l.transformer), meta_shapes(t5.transformer)


def ae_shapes() -> dict[str, tuple[int, ...]]:
    from comfy.ldm.models.autoencoder import AutoencodingEngine

    part = "comfy.ldm.modules.diffusionmodules.model."
    with torch.device("meta"):
        vae = AutoencodingEngine(
            regularizer_config={"target": "comfy.ldm.models.autoencoder.DiagonalGaussianRegularizer"},
            encoder_config={"target": part + "Encoder", "params": AE_CONFIG},
            decoder_config={"target": part + "Decoder", "params": AE_CONFIG})
    return meta_shapes(vae)


def write_pickscore(folder: Path, tiny: bool, device: torch.device, comfy_root: Path) -> None:
    """A PickScore folder: config.json, model.safetensors (fp16) and CLIP's tokenizer files (ComfyUI's own
    copy of the BPE vocabulary PickScore's processor uses)."""
    from safetensors.torch import save_file
    from transformers import CLIPConfig, CLIPModel

    folder.mkdir(parents=True, exist_ok=True)
    config = CLIPConfig(**(TINY_PICKSCORE if tiny else PICKSCORE))
    with torch.device("meta"):
        model = CLIPModel(config)
    shapes = {k: s for k, s in meta_shapes(model).items() if not k.endswith("position_ids")}
    save_file(random_state(shapes, torch.float16, device, seed=4), str(folder / "model.safetensors"))
    config.save_pretrained(folder)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(comfy_root / "comfy" / "sd1_tokenizer" / name, folder / name)


def write_hps(file: Path, tiny: bool, device: torch.device) -> None:
    """An HPS-v2.1 checkpoint: ``{"state_dict": {"module.<open_clip key>": fp16}}``, as the release."""
    import open_clip

    file.parent.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = open_clip.CLIP(**(TINY_HPS if tiny else HPS), quick_gelu=False)
    shapes = {k: s for k, s in meta_shapes(model).items() if k != "attn_mask"}
    state = random_state(shapes, torch.float16, device, seed=5)
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, file)


def write_files(models: Path, names: list[str], tiny: bool, device: torch.device, comfy_root: Path,
                report: Callable[[str], None] = print) -> float:
    """Write the named files (keys of :data:`FILES`) under ``models`` with random weights; the seconds."""
    from safetensors.torch import save_file

    start = time.perf_counter()
    fp8 = torch.float8_e4m3fn
    for name in names:
        kind, path = FILES[name], models / name
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if kind == "flux":  # stored in fp8, as UNETLoader's fp8_e4m3fn keeps the release's bf16 weights
            save_file(random_state(flux_shapes(tiny), fp8, device, seed=0), str(path))
        elif kind == "clip_l":
            save_file(random_state(text_encoder_shapes(tiny)[0], torch.float16, device, seed=1), str(path))
        elif kind == "t5xxl":
            save_file(random_state(text_encoder_shapes(tiny)[1], fp8, device, seed=2), str(path))
        elif kind == "ae":
            save_file(random_state(ae_shapes(), torch.bfloat16, device, seed=3), str(path))
        elif kind == "pickscore":
            write_pickscore(path, tiny, device, comfy_root)
        elif kind == "hps-v2.1":
            write_hps(path, tiny, device)
        size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")))
        report(f"wrote {name} ({size / GIB:.2f} GiB) in {time.perf_counter() - t0:.1f} s")
    return time.perf_counter() - start


@contextmanager
def tiny_shim() -> Iterator[None]:
    """While open: ComfyUI's loaders build the tiny files' models. Its FLUX detection fixes 24 heads of 128
    (3072 wide): a FLUX file narrower than that gets :data:`TINY_HEADS` heads and :data:`TINY_AXES` rope
    axes instead. DualCLIPLoader's T5-XXL gets the tiny config through ComfyUI's per-encoder override."""
    import comfy.model_detection
    import comfy.sd

    detect, load_clip = comfy.model_detection.detect_unet_config, comfy.sd.load_clip

    def tiny_detect(state_dict: dict, key_prefix: str, metadata: Any = None) -> Any:
        config = detect(state_dict, key_prefix, metadata=metadata)
        narrow = config and config.get("hidden_size") != FLUX_DEV["hidden_size"]
        if narrow and config.get("image_model") == "flux":
            config.update(num_heads=TINY_HEADS, axes_dim=list(TINY_AXES))
        return config

    def tiny_load_clip(*args: Any, model_options: dict | None = None, **kwargs: Any) -> Any:
        options = {**(model_options or {}), "t5xxl_model_config": dict(TINY_T5)}
        return load_clip(*args, model_options=options, **kwargs)

    comfy.model_detection.detect_unet_config, comfy.sd.load_clip = tiny_detect, tiny_load_clip
    try:
        yield
    finally:
        comfy.model_detection.detect_unet_config, comfy.sd.load_clip = detect, load_clip


# ------------------------------------------------------------------------------ the graph


def template(name: str) -> dict:
    return json.loads((WORKFLOWS / f"{name}.api.json").read_text())


def scaled(graph: dict, trees_per_prompt: int | None = None, iterations: int | None = None,
           side: int | None = None, guard_pairs: int | None = None) -> dict:
    """The graph with the widgets that only set how long it runs changed: trees per prompt, training
    rounds, the image side (empty latents and ModelSamplingFlux), and where the picks trainer keeps to the
    prompt under a guard, its validation pairs (a ``guard.pairs`` line added to its settings); every other
    widget as saved."""
    graph = json.loads(json.dumps(graph))
    for node in graph.values():
        inputs, kind = node["inputs"], node["class_type"]
        if guard_pairs is not None and "keep_following" in inputs:
            inputs["settings"] = inputs["settings"].rstrip("\n") + f"\nguard.pairs={guard_pairs}"
        if trees_per_prompt is not None and kind == "TreeRPOSampleToPick":
            inputs["trees_per_prompt"] = trees_per_prompt
        if iterations is not None and kind in ("TreeRPOTrainFromPicks", "TreeRPOTrainLoRA"):
            inputs["iterations"] = iterations
        if side is not None and kind in ("EmptySD3LatentImage", "ModelSamplingFlux"):
            inputs["width"] = inputs["height"] = side
    return graph


def first_prompts(graph: dict, count: int | None) -> dict:
    """The graph with the tree sampler's prompts cut to the first ``count`` lines (None: all)."""
    graph = json.loads(json.dumps(graph))
    if count is not None:
        for key in nodes_of(graph, "TreeRPOSampleToPick"):
            lines = [line for line in graph[key]["inputs"]["prompts"].splitlines() if line.strip()]
            graph[key]["inputs"]["prompts"] = "\n".join(lines[:count])
    return graph


def nodes_of(graph: dict, *kinds: str) -> list[str]:
    return [k for k, v in graph.items() if v["class_type"] in kinds]


def scripted_picks(folder: Path) -> dict[str, tuple[list[int], list[int]]]:
    """A scripted person: on each tree nobody labelled, likes the two brightest leaves and dislikes the
    darkest, saved through the picks store (what the picking panel's route calls)."""
    from dynamic_treerpo.trainer.preferences.store import PickStore

    store = PickStore(folder)
    made = {}
    for tree in store.unlabelled():
        brightness = store.load_images(tree).float().mean(dim=(1, 2, 3))
        order = torch.argsort(brightness, descending=True).tolist()
        liked, disliked = sorted(order[:2]), [order[-1]]
        store.save_picks(tree, liked, disliked)
        made[tree] = (liked, disliked)
    return made


# ------------------------------------------------------------------------------ running in ComfyUI


class _Server:
    """What ComfyUI's executor expects of its server: somewhere to send events (nothing listens)."""

    client_id = None
    last_node_id = None
    last_prompt_id = None
    sockets_metadata: dict = {}  # noqa: RUF012

    def send_sync(self, event: str, data: Any, sid: str | None = None) -> None:
        pass

    def queue_updated(self) -> None:
        pass


@dataclass
class Stage:
    """One stage of a run: seconds, on a GPU its peak memory (less the ballast), and the models ComfyUI
    held at its end (``name@device``, GiB loaded there)."""

    name: str
    seconds: float
    peak_gib: float | None = None
    reserved_gib: float | None = None
    resident_gib: float | None = None  # allocated when the stage ended
    loaded: list[tuple[str, float]] = field(default_factory=list)
    refused: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Session:
    """ComfyUI in this process with this pack, one executor kept across runs (as a server keeps its
    cache), a models folder of random files, and an optional ballast that leaves ``card_gib`` free."""

    host: Any
    executor: Any
    device: torch.device
    ballast: torch.Tensor | None = None

    @property
    def ballast_gib(self) -> float:
        return 0.0 if self.ballast is None else self.ballast.numel() / GIB

    def run(self, graph: dict, outputs: list[str], name: str) -> Stage:
        """Validate ``graph`` as the server does and run ``outputs`` (those that passed validation must
        include them); the refusals of the others are kept, one line each."""
        execution = self.host.modules["execution"]
        prompt_id = str(uuid.uuid4())
        valid, error, good, node_errors = self.host.loop.run_until_complete(
            execution.validate_prompt(prompt_id, graph, None))
        refused = {node: [str(e.get("details") or e.get("message")) for e in entry["errors"]]
                   for node, entry in node_errors.items()}
        if not valid:
            raise RuntimeError(f"ComfyUI refused the graph: {error}; {refused}")
        missing = [o for o in outputs if o not in good]
        if missing:
            raise RuntimeError(f"outputs {missing} did not pass validation: {refused}")
        model_management = sys.modules["comfy.model_management"]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        self.host.loop.run_until_complete(self.executor.execute_async(graph, prompt_id, {}, outputs))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        if not self.executor.success:
            failures = [d for e, d in self.executor.status_messages if e == "execution_error"]
            message = failures[-1].get("exception_message", "?").strip() if failures else "interrupted"
            node = failures[-1].get("node_id") if failures else "?"
            raise RuntimeError(f"node {node} failed in stage {name}: {message}")
        stage = Stage(name, seconds, refused=refused)
        if self.device.type == "cuda":
            stage.peak_gib = torch.cuda.max_memory_allocated(self.device) / GIB - self.ballast_gib
            stage.reserved_gib = torch.cuda.max_memory_reserved(self.device) / GIB - self.ballast_gib
            stage.resident_gib = torch.cuda.memory_allocated(self.device) / GIB - self.ballast_gib
        for loaded in model_management.current_loaded_models:
            patcher = loaded.model
            if patcher is None:
                continue
            inner = getattr(patcher, "model", None)
            label = type(getattr(inner, "diffusion_model", None) or inner).__name__.rstrip("_")
            where = torch.device(loaded.device).type
            stage.loaded.append((f"{label}@{where}", loaded.model_loaded_memory() / GIB))
        return stage


def boot(models: Path, output: Path, temp: Path, device: torch.device, card_gib: float = 0.0) -> Session:
    """ComfyUI with this pack, reading models from ``models``. On a GPU larger than ``card_gib``, a ballast
    tensor takes the difference, so that ComfyUI (its free-memory figures) and torch (its out-of-memory
    errors) see a card of that size with this card's CUDA context; peaks are reported without it."""
    from dynamic_treerpo.trainer.comfyui_host.runner import boot as boot_comfyui
    from dynamic_treerpo.trainer.comfyui_host.runner import comfyui_root

    output.mkdir(parents=True, exist_ok=True)
    temp.mkdir(parents=True, exist_ok=True)
    host = boot_comfyui(comfyui_root(), output, temp)
    folder_paths = host.modules["folder_paths"]
    folder_paths.models_dir = str(models)
    for kind in ("diffusion_models", "text_encoders", "vae", "loras"):
        (models / kind).mkdir(parents=True, exist_ok=True)
        folder_paths.add_model_folder_path(kind, str(models / kind), is_default=True)
    execution = host.modules["execution"]
    executor = execution.PromptExecutor(_Server(), cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"lru": 0, "ram": 0})
    ballast = None
    if device.type == "cuda" and card_gib > 0:  # what this card's CUDA context already takes, the small
        free, total = torch.cuda.mem_get_info(device)  # card's takes too: leave card_gib less that free
        extra = free - (int(card_gib * GIB) - (total - free))
        if extra > 0:
            ballast = torch.empty(extra, dtype=torch.uint8, device=device)
    return Session(host, executor, device, ballast)


def run_template(name: str, work: Path, tiny: bool, device: torch.device, trees_per_prompt: int | None,
                 iterations: int | None, side: int | None, card_gib: float = 0.0,
                 report: Callable[[str], None] = print, graph: dict | None = None,
                 guard_pairs: int | None = None) -> list[Stage]:
    """Write the template's files with random weights under ``work/models``, then run the template in
    ComfyUI (output in ``work/output``): for a picks template, sampling, scripted picks, training and the
    before/after images; for a training template, training and the trained sample. One :class:`Stage` per
    step, the first being the files' writing. ``graph``: the template's graph as given instead of its file."""
    if name not in TEMPLATES:
        raise ValueError(f"no random files for template {name!r}; one of {', '.join(TEMPLATES)}")
    models = work / "models"
    session = boot(models, work / "output", work / "temp", device, card_gib)  # ComfyUI first: its classes
    written = write_files(models, TEMPLATES[name], tiny, device, session.host.root, report)  # give the shapes
    stages = [Stage("files", written)]
    graph = scaled(graph or template(name), trees_per_prompt, iterations, side, guard_pairs)
    shim = tiny_shim() if tiny else _nothing()
    with shim:
        sample = nodes_of(graph, "TreeRPOSampleToPick")
        if sample:
            first = session.run(graph, sample, "sample")
            folder = Path(session.host.modules["folder_paths"].get_output_directory()) / "treerpo_picks" / \
                graph[sample[0]]["inputs"]["picks_folder"]
            first.extra["trees"] = len(list((folder / "trees").iterdir()))
            stages.append(first)
            t0 = time.perf_counter()
            picked = scripted_picks(folder)
            stages.append(Stage("pick", time.perf_counter() - t0, extra={"trees": len(picked)}))
        saves = nodes_of(graph, "TreeRPOSaveLoRA")
        stages.append(session.run(graph, saves, "train"))
        stages.append(session.run(graph, nodes_of(graph, "SaveImage"), "compare"))
    return stages


@contextmanager
def _nothing() -> Iterator[None]:
    yield
