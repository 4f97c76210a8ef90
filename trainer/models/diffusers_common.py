"""What the diffusers policies (FLUX.1 in ``flux.py``, SD3/SD3.5 in ``sd3.py``) share.

- dtypes by name and the resolution check;
- :class:`Offload`: frozen helpers (text encoders, VAE) wait on the CPU and visit the device only
  while they run, so a 24 GB transformer need not share the accelerator with 10 GB of T5;
- local loading: every missing piece of a diffusers folder is a one-line ``FileNotFoundError``
  that names the file and where users get the model; unreadable weights are a one-line
  ``ValueError``; nothing touches the network (``local_files_only=True`` everywhere);
- :class:`PromptCache`: each distinct prompt is encoded once (the encoders are frozen);
- :class:`DiffusersPolicy`: the parts of the Policy protocol that do not depend on the family
  (caching, VAE decode/encode in batches, devices, trainable parameters).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..compat.transformers_api import dtype_argument
from ..compat.versions import require
from .policy import PolicyBase

PromptEncoder = Callable[[list[str]], dict[str, Tensor]]
"""``prompts -> {name: [len(prompts), ...]}``: conditioning of distinct prompts, one row each."""

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}
WEIGHT_PATTERNS = ("*.safetensors", "*.bin")
FP8_DIFFUSERS = "0.33"  # the first diffusers with enable_layerwise_casting (fp8 storage)
MAX_T5_TOKENS = 512  # the longest T5 prompt of FLUX.1 and SD3
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "spiece.model", "tokenizer_config.json")


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"``/``"bf16"``/... or a ``torch.dtype`` -> ``torch.dtype`` (one-line error)."""
    if isinstance(value, torch.dtype):
        return value
    key = str(value).lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {value!r}; expected one of {sorted(set(DTYPES))}")
    return DTYPES[key]


def check_sequence_length(value: int, limit: int) -> None:
    """T5's token budget: 1 to ``limit`` (512 for both pipelines' T5)."""
    if not 1 <= value <= limit:
        raise ValueError(f"max_sequence_length must be in [1, {limit}], got {value}")


def check_resolution(height: int, width: int, multiple: int = 16) -> None:
    """Pixel sizes must be positive multiples of ``multiple`` (VAE /8, then 2x2 patches)."""
    for name, value in (("height", height), ("width", width)):
        if not isinstance(value, int) or value <= 0 or value % multiple:
            raise ValueError(f"{name}={value!r}: the resolution must be a positive multiple of {multiple} "
                             f"(the VAE divides by {multiple // 2}, then 2x2 patches)")


# ------------------------------------------------------------------------------ local loading
@dataclass(frozen=True)
class ModelSource:
    """A model family as users know it: its name, and where they get the weights."""

    family: str
    hint: str
    pipeline: str  # substring of model_index.json's ``_class_name``


def _missing(source: ModelSource, path: Path, what: str) -> FileNotFoundError:
    return FileNotFoundError(f"{source.family} model folder incomplete: {path} is missing ({what}); "
                             f"get it from {source.hint}")


def read_model_index(root: Path, source: ModelSource) -> dict[str, Any]:
    """``model_index.json`` of a diffusers folder, checked to belong to ``source``'s pipeline."""
    if not root.is_dir():
        raise FileNotFoundError(f"{source.family} model folder not found: {root}; get the diffusers "
                                f"folder from {source.hint}")
    index_file = root / "model_index.json"
    if not index_file.is_file():
        raise _missing(source, index_file, "a diffusers pipeline folder has model_index.json")
    try:
        index = json.loads(index_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{index_file}: not valid JSON ({err})") from err
    name = str(index.get("_class_name", ""))
    if source.pipeline not in name:
        raise ValueError(f"{root} holds a {name or 'unknown'} model, not {source.family} "
                         f"(model_index.json names {name!r})")
    return index


def index_has(index: dict[str, Any], component: str) -> bool:
    """Whether ``model_index.json`` lists ``component`` (``[null, null]`` means left out)."""
    entry = index.get(component)
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[1] is not None


def require_model(root: Path, name: str, source: ModelSource, what: str,
                  weights: bool = True) -> Path:
    """``root/name`` with a ``config.json`` and (when ``weights``) its weight files, shards included."""
    folder = root / name
    if not folder.is_dir():
        raise _missing(source, folder, what)
    if not (folder / "config.json").is_file():
        raise _missing(source, folder / "config.json", f"the config of the {what}")
    if not weights:
        return folder
    for index_file in sorted(folder.glob("*.index.json")):
        try:
            shards = set(json.loads(index_file.read_text()).get("weight_map", {}).values())
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
            raise ValueError(f"{index_file}: not a valid weight index ({err})") from err
        for shard in sorted(shards):
            if not (folder / shard).is_file():
                raise _missing(source, folder / shard, f"a weight shard of the {what}")
    if not any(f for pattern in WEIGHT_PATTERNS for f in folder.glob(pattern)):
        raise _missing(source, folder / "*.safetensors", f"the weights of the {what}")
    return folder


def require_tokenizer(root: Path, name: str, source: ModelSource, what: str) -> Path:
    """``root/name`` with at least one tokenizer file."""
    folder = root / name
    if not folder.is_dir():
        raise _missing(source, folder, what)
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise _missing(source, folder / "tokenizer.json", f"the files of the {what}")
    return folder


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def load_local(loader: Callable[..., Any], target: Path, what: str, **kwargs: Any) -> Any:
    """``loader(target, local_files_only=True, **kwargs)``; a failure is one line naming ``target``.

    Reached only after the ``require_*`` checks, so what fails here is the content: truncated or
    corrupt weights, a config of another model, or a shard that does not fit.
    """
    try:
        return loader(str(target), local_files_only=True, **kwargs)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{target}: cannot load the {what} ({_first_line(err)})") from err
    except (OSError, ValueError, RuntimeError, LookupError, TypeError, AttributeError) as err:
        raise ValueError(f"{target}: cannot load the {what}: corrupt or incompatible files "
                         f"({_first_line(err)})") from err
    except Exception as err:  # safetensors' SafetensorError derives from Exception only
        if type(err).__name__ != "SafetensorError":
            raise
        raise ValueError(f"{target}: cannot load the {what}: corrupt weights ({_first_line(err)})") from err


def require_components(root: Path, source: ModelSource, components: Mapping[str, str]) -> dict[str, Path]:
    """Each of ``components`` (folder -> what it is) checked: ``tokenizer*`` folders need tokenizer
    files, the others a config and weights."""
    def check(name: str, what: str) -> Path:
        require = require_tokenizer if name.startswith("tokenizer") else require_model
        return require(root, name, source, what)

    return {name: check(name, what) for name, what in components.items()}


def check_folder(root: Path, source: ModelSource, transformer_file: str | Path | None,
                 components: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Path]]:
    """Check a diffusers folder before anything loads, so a missing file fails in one line at once:
    its ``model_index.json``, the transformer (unless a single file replaces it) and ``components``.
    Returns the index and each component's folder."""
    index = read_model_index(root, source)
    if transformer_file is None:
        require_model(root, "transformer", source, "transformer")
    return index, require_components(root, source, components)


def load_components(parts: Mapping[str, Path], text: Mapping[str, tuple[str, Any]],
                    dtype: torch.dtype) -> dict[str, Any]:
    """Each checked text component (folder -> (what it is, its class)) with its class's
    ``from_pretrained``: encoders in ``dtype``, tokenizers as they are."""
    return {name: load_local(cls.from_pretrained, parts[name], what,
                             **({} if name.startswith("tokenizer") else dtype_argument(dtype)))
            for name, (what, cls) in text.items()}


def check_loaded(model: nn.Module, target: Path, what: str) -> nn.Module:
    """A checkpoint that left parameters unset (on ``meta``) did not fit the config."""
    unset = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if unset:
        raise ValueError(f"{target}: the {what} checkpoint does not fit its config "
                         f"({len(unset)} tensors missing, e.g. {unset[0]!r})")
    return model


def load_transformer(cls: Any, root: Path, source: ModelSource, dtype: torch.dtype,
                     transformer_file: str | Path | None = None) -> nn.Module:
    """The transformer from ``root/transformer``, or from a single ``.safetensors`` file.

    A single file (an original BFL/SAI checkpoint, or one in diffusers' own key layout) is read by
    diffusers' ``from_single_file`` with the config of ``root/transformer``, so nothing is fetched.
    """
    if transformer_file is None:
        folder = require_model(root, "transformer", source, "transformer")
        model = load_local(cls.from_pretrained, folder, "transformer", torch_dtype=dtype)
        return check_loaded(model, folder, "transformer")
    file = Path(transformer_file)
    if not file.is_file():
        raise FileNotFoundError(f"{source.family} transformer checkpoint not found: {file}")
    if file.suffix != ".safetensors":
        raise ValueError(f"{file}: a single-file transformer must be a .safetensors file")
    require_model(root, "transformer", source, "transformer", weights=False)

    def single_file(target: str, **kw: Any) -> Any:
        return cls.from_single_file(target, config=str(root), subfolder="transformer", **kw)

    def own_layout(target: str, torch_dtype: torch.dtype, **_: Any) -> Any:
        return load_in_own_layout(cls, root / "transformer", Path(target), torch_dtype)

    reader = own_layout if in_own_layout(cls, root / "transformer", file) else single_file
    model = load_local(reader, file, "transformer", torch_dtype=dtype)
    return check_loaded(model, file, "transformer")


def _state_keys(cls: Any, config_folder: Path) -> set[str]:
    with torch.device("meta"):
        return set(cls.from_config(cls.load_config(str(config_folder))).state_dict())


def in_own_layout(cls: Any, config_folder: Path, file: Path) -> bool:
    """Whether a single file holds exactly the keys of diffusers' own model (a fine-tune saved with
    ``state_dict``), which diffusers' single-file converter reads only from 0.32 on."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            keys = set(handle.keys())
    except Exception:  # unreadable: let the converter report it
        return False
    return keys == _state_keys(cls, config_folder)


def load_in_own_layout(cls: Any, config_folder: Path, file: Path, dtype: torch.dtype) -> nn.Module:
    """A model of ``cls`` from its folder's config and a single file in its own key layout."""
    from safetensors.torch import load_file

    model = cls.from_config(cls.load_config(str(config_folder)))
    model.load_state_dict(load_file(str(file)), strict=True)
    return model.to(dtype)


# ------------------------------------------------------------------------------ devices
class Offload:
    """Where the frozen helpers live: on the device, or (``enabled``) on the CPU between uses."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.device = torch.device(device)
        self.enabled = bool(enabled)

    @property
    def home(self) -> torch.device:
        return torch.device("cpu") if self.enabled else self.device

    def place(self, *modules: nn.Module | None) -> None:
        for module in modules:
            if module is not None:
                module.to(self.home)

    @contextmanager
    def using(self, *modules: nn.Module | None) -> Iterator[None]:
        """Move ``modules`` to the device for the block, then back home."""
        live = [m for m in modules if m is not None]
        if self.enabled:
            for module in live:
                module.to(self.device)
        try:
            yield
        finally:
            if self.enabled:
                for module in live:
                    module.to(self.home)
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()


def module_device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def store_weights_in_fp8(transformer: nn.Module, compute_dtype: torch.dtype) -> None:
    """Keep the transformer's layer weights in float8_e4m3fn, each upcast to ``compute_dtype`` only
    while its layer runs (diffusers' layerwise casting; norms and embeddings stay as they are). It
    halves the memory of bf16 weights; done before the move to the GPU, the bf16 copy never lands
    there. peft creates a LoRA attached afterwards in ``compute_dtype`` (its ``compute_dtype`` hook)."""
    require("diffusers", FP8_DIFFUSERS, "model.quantize: fp8")  # enable_layerwise_casting came in 0.33
    transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=compute_dtype)
    for module in transformer.modules():
        if getattr(module, "weight", None) is not None and module.weight.dtype == torch.float8_e4m3fn:
            module.compute_dtype = compute_dtype


def module_dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


# ------------------------------------------------------------------------------ prompts
class PromptCache:
    """Conditioning per distinct prompt, computed once and kept on the CPU.

    The CPU keeps the cache from growing on the accelerator with the prompt set (a FLUX prompt is
    512 x 4096 values); a batch is stacked and moved to the device when asked for.
    """

    def __init__(self, encoder: PromptEncoder, keys: Sequence[str]) -> None:
        self.encoder = encoder
        self.keys = tuple(keys)
        self.rows: dict[str, dict[str, Tensor]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, prompts: Sequence[str], device: torch.device) -> dict[str, Tensor]:
        prompts = list(prompts)
        if not prompts:
            raise ValueError("encode needs at least one prompt")
        missing = [p for p in dict.fromkeys(prompts) if p not in self.rows]
        if missing:
            out = self.encoder(missing)
            absent = [k for k in self.keys if not isinstance(out, dict) or k not in out]
            if absent:
                raise ValueError(f"the prompt encoder returned no {absent[0]!r} (needs keys {self.keys})")
            for key in self.keys:
                if out[key].shape[0] != len(missing):
                    raise ValueError(f"the prompt encoder's {key!r} has {out[key].shape[0]} rows for "
                                     f"{len(missing)} prompts")
            for i, prompt in enumerate(missing):
                self.rows[prompt] = {k: out[k][i].detach().to("cpu").clone() for k in self.keys}
        return {k: torch.stack([self.rows[p][k] for p in prompts]).to(device) for k in self.keys}


# ------------------------------------------------------------------------------ VAE
def _latent_scaling(vae: nn.Module) -> tuple[float, float]:
    """The VAE's ``(scaling_factor, shift_factor)``: model latents are ``(z - shift) * scale``."""
    return float(vae.config.scaling_factor), float(vae.config.shift_factor or 0.0)


def _in_batches(vae: nn.Module, rows: Tensor, batch: int, offload: Offload,
                convert: Callable[[Tensor, torch.dtype], Tensor]) -> Tensor:
    """``convert`` over ``batch`` rows at a time, each in float32 on the VAE's device, the result
    float32 on ``rows``' device."""
    out = []
    with torch.no_grad(), offload.using(vae):
        dev, dtype = module_device(vae), module_dtype(vae)
        for start in range(0, rows.shape[0], max(1, batch)):
            x = rows[start:start + max(1, batch)].to(dev, torch.float32)
            out.append(convert(x, dtype).float().to(rows.device))
    return torch.cat(out)


def vae_decode(vae: nn.Module, latents: Tensor, batch: int, offload: Offload) -> Tensor:
    """Model-space latents -> images ``[B, 3, H, W]`` float32 in ``[0, 1]``, ``batch`` rows at a time.

    Undoes ``(z - shift_factor) * scaling_factor`` first; the result is on ``latents``' device.
    """
    scale, shift = _latent_scaling(vae)

    def decode(z: Tensor, dtype: torch.dtype) -> Tensor:
        image = vae.decode((z / scale + shift).to(dtype), return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0.0, 1.0)

    return _in_batches(vae, latents, batch, offload, decode)


def vae_encode(vae: nn.Module, images: Tensor, batch: int, offload: Offload) -> Tensor:
    """Images in ``[0, 1]`` -> model-space latents (the posterior mode), float32, ``batch`` at a time."""
    scale, shift = _latent_scaling(vae)

    def encode(x: Tensor, dtype: torch.dtype) -> Tensor:
        z = vae.encode((x * 2.0 - 1.0).to(dtype)).latent_dist.mode().float()
        return (z - shift) * scale

    return _in_batches(vae, images, batch, offload, encode)


# ------------------------------------------------------------------------------ the shared policy
class DiffusersPolicy(PolicyBase, nn.Module):
    """Family-independent half of a diffusers :class:`~trainer.models.policy.Policy`.

    Subclasses set ``cache_keys``, implement ``_encode_text`` (the built-in text encoders) and
    ``velocity``. Only the transformer trains: ``train()``/``eval()`` leave the text encoders and
    the VAE in eval mode (T5's dropout would otherwise change cached embeddings), and the
    transformer starts frozen (the trainer attaches a LoRA, or unfreezes it for full fine-tuning).
    """

    cache_keys: tuple[str, ...] = ("prompt_embeds", "pooled_prompt_embeds")  # what the prompt cache keeps
    source: ClassVar[ModelSource]
    transformer_class: ClassVar[str]  # the diffusers class of the family's transformer
    text_components: ClassVar[dict[str, tuple[str, str]]]  # folder -> (what it is, transformers class)

    def __init__(self, transformer: nn.Module, vae: nn.Module | None, *, height: int, width: int,
                 latent_channels: int, text: Mapping[str, Any], prompt_encoder: PromptEncoder | None,
                 guidance: float, max_sequence_length: int, offload: bool = False,
                 device: str | torch.device | None = None, gradient_checkpointing: bool = False,
                 decode_batch: int = 4, vae_scale_factor: int | None = None,
                 compute_dtype: torch.dtype | None = None) -> None:
        """``text``: the family's text encoders and tokenizers by name (``text_encoder``,
        ``tokenizer``, ...; None where left out), kept as attributes of those names. ``compute_dtype``:
        the transformer's, when its weights are stored in another (fp8); default: its weights'."""
        check_sequence_length(max_sequence_length, MAX_T5_TOKENS)
        super().__init__()
        if decode_batch < 1:
            raise ValueError(f"decode_batch must be >= 1, got {decode_batch}")
        if vae_scale_factor is None:
            vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 8
        factor = int(vae_scale_factor)
        check_resolution(height, width, 2 * factor)
        self.height, self.width = height, width
        self.vae_scale_factor = factor
        self.latent_shape: tuple[int, ...] = (latent_channels, height // factor, width // factor)
        self.image_tokens = (height // (2 * factor)) * (width // (2 * factor))
        self.decode_batch = int(decode_batch)
        dev = torch.device(device) if device is not None else module_device(transformer)
        self.offload = Offload(dev, offload)
        self.transformer = transformer.to(dev).requires_grad_(False).eval()
        self.compute_dtype = compute_dtype or module_dtype(self.transformer)
        if gradient_checkpointing:
            self.transformer.enable_gradient_checkpointing()
        self.vae = vae.requires_grad_(False).eval() if vae is not None else None
        encoders = [m for name, m in text.items() if name.startswith("text_encoder") and m is not None]
        self.text_modules = nn.ModuleList([m.requires_grad_(False).eval() for m in encoders])
        self.offload.place(self.vae, *self.text_modules)
        if prompt_encoder is None and not len(self.text_modules):
            raise ValueError(f"{type(self).__name__} needs text encoders or a prompt_encoder callable")
        self.cache = PromptCache(prompt_encoder or self._encode_text, self.cache_keys)
        for name, module in text.items():
            setattr(self, name, module)
        self.guidance = float(guidance)
        self.max_sequence_length = int(max_sequence_length)

    # ------------------------------------------------------------------ loading
    @classmethod
    def text_parts(cls, root: Path, index: dict[str, Any],
                   options: dict[str, Any]) -> tuple[dict[str, Path], dict[str, tuple[str, Any]]]:
        """The family's text components in a folder, checked: ``(folders, name -> (what, class))``.
        A family with optional components overrides it and takes its own keys out of ``options``."""
        import transformers

        text = {name: (what, getattr(transformers, class_name))
                for name, (what, class_name) in cls.text_components.items()}
        return require_components(root, cls.source, {n: what for n, (what, _) in text.items()}), text

    @classmethod
    def from_pretrained(cls, path: str | Path, *, height: int, width: int,
                        dtype: str | torch.dtype = "bfloat16", device: str | torch.device = "cpu",
                        transformer_file: str | Path | None = None,
                        vae_dtype: str | torch.dtype = "float32", quantize: str = "none",
                        **options: Any) -> Any:
        """Load a local diffusers folder of the family; ``transformer_file`` replaces its transformer
        weights. ``dtype`` applies to the transformer and the text encoders, ``vae_dtype`` to the
        VAE; ``options`` go to the constructor (``guidance``, ``max_sequence_length``, ``offload``,
        ``gradient_checkpointing``, ``decode_batch``). ``quantize="fp8"`` stores the transformer's
        weights in float8 (:func:`store_weights_in_fp8`). Every component is checked before any is
        loaded, so a missing file fails in one line at once."""
        if quantize not in ("none", "fp8"):
            raise ValueError(f"quantize must be 'none' or 'fp8', got {quantize!r}")
        if quantize == "fp8":  # refused before anything loads
            require("diffusers", FP8_DIFFUSERS, "model.quantize: fp8")
        import diffusers

        check_resolution(height, width)
        root = Path(path)
        torch_dtype, vae_torch_dtype = parse_dtype(dtype), parse_dtype(vae_dtype)
        index, parts = check_folder(root, cls.source, transformer_file, {"vae": "VAE"})
        text_folders, text = cls.text_parts(root, index, options)
        transformer = load_transformer(getattr(diffusers, cls.transformer_class), root, cls.source,
                                       torch_dtype, transformer_file)
        vae = load_local(diffusers.AutoencoderKL.from_pretrained, parts["vae"], "VAE",
                         torch_dtype=vae_torch_dtype)
        modules = load_components(text_folders, text, torch_dtype)
        if quantize == "fp8":  # on the host, before the policy moves the transformer to its device
            store_weights_in_fp8(transformer, torch_dtype)
            options["compute_dtype"] = torch_dtype
        return cls(transformer, vae, height=height, width=width, device=device, **modules, **options)

    # ------------------------------------------------------------------ devices and modes
    @property
    def device(self) -> torch.device:
        return module_device(self.transformer)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the transformer computes in (its weights may be stored in float8)."""
        return self.compute_dtype

    def train(self, mode: bool = True) -> DiffusersPolicy:
        self.training = mode
        self.transformer.train(mode)
        return self

    def check_latents(self, x: Tensor) -> None:
        if tuple(x.shape[1:]) != self.latent_shape:
            raise ValueError(f"latents of shape {tuple(x.shape[1:])} do not fit this policy's "
                             f"{self.latent_shape} ({self.height}x{self.width} pixels)")

    # ------------------------------------------------------------------ Policy
    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        raise NotImplementedError

    def encode(self, prompts: Sequence[str]) -> dict[str, Tensor]:
        """One row per prompt, on the device; each distinct prompt is encoded once (CPU cache)."""
        return self.cache.get(prompts, self.device)

    def decode(self, latents: Tensor) -> Tensor:
        """Images ``[B, 3, H, W]`` float32 in ``[0, 1]``, ``decode_batch`` rows per VAE call."""
        if self.vae is None:
            raise ValueError(f"this {type(self).__name__} was built without a VAE: decode needs one")
        self.check_latents(latents)
        return vae_decode(self.vae, latents, self.decode_batch, self.offload)

    def encode_images(self, images: Tensor) -> Tensor:
        """Images in ``[0, 1]`` to model-space latents (for the trainer's drift metric)."""
        if self.vae is None:
            raise ValueError(f"this {type(self).__name__} was built without a VAE: encode_images needs one")
        return vae_encode(self.vae, images, self.decode_batch, self.offload)

    def trainable_parameters(self) -> Iterable[nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]
