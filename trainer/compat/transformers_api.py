"""Every difference between transformers 4 and 5 that the pack meets, handled here and nowhere else.

Why one module: transformers 5 changed what several calls return or accept, and a check scattered
through the rewards would be missed in the next one. The differences:

- ``CLIPModel.get_image_features`` / ``get_text_features`` return the projected features as a tensor
  in 4, and an output whose ``pooler_output`` holds them in 5 (:func:`projected_features`).
- ``CLIPTextModel`` keeps its layers under ``text_model.`` in 4; 5 flattens them and saves the keys
  without the prefix, which 4 then silently skips (random weights, prompts ignored). Text encoders are
  read and written here in 4's layout, which 5 reads as well, strictly: a missing or unexpected tensor
  is an error, never a random initialisation (:func:`load_clip_text_model`, :func:`save_clip_text_model`).
- ``BertTokenizer`` takes a ``vocab`` (path or dict) in 5 and requires ``vocab_file`` in 4; the
  WordPiece tokenizer is the Rust (``tokenizers``) one in both (:func:`wordpiece_tokenizer`).
- ``CLIPTokenizer`` is the slow Python tokenizer in 4 and the Rust one in 5; the Rust one,
  ``CLIPTokenizerFast`` in 4, is what the reference processors use (:func:`clip_tokenizer`).
- ``from_pretrained`` takes the weights' dtype as ``torch_dtype`` in 4 (``dtype`` only from 4.56)
  and as ``dtype`` in 5, which deprecates ``torch_dtype`` (:func:`dtype_argument`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from packaging.version import Version
from torch import Tensor, nn

from .versions import installed_version

CLIP_TEXT_PREFIX = "text_model."
TEXT_ENCODER_WEIGHTS = "model.safetensors"


@lru_cache(maxsize=1)
def transformers_major() -> int:
    """The installed transformers' major version (4 or 5)."""
    found = installed_version("transformers")
    if found is None:
        raise ImportError("transformers is not installed: pip install -r requirements.txt")
    return Version(found).major


def dtype_argument(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """The keyword that gives a transformers ``from_pretrained`` its weights' dtype."""
    return {"dtype": dtype} if transformers_major() >= 5 else {"torch_dtype": dtype}


def projected_features(output: Any) -> Tensor:
    """The projected embeddings from ``get_image_features`` / ``get_text_features`` on any version."""
    return output if isinstance(output, Tensor) else output.pooler_output


# ---------------------------------------------------------------- CLIP text encoders on disk


def _canonical(key: str) -> str:
    """A CLIPTextModel key in transformers 4's layout (``text_model.`` + the layer's name)."""
    return key if key.startswith(CLIP_TEXT_PREFIX) else CLIP_TEXT_PREFIX + key


def clip_text_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The model's tensors under transformers 4's keys, which both versions read."""
    return {_canonical(k): v.detach().contiguous() for k, v in model.state_dict().items()
            if not k.endswith("position_ids")}


def save_clip_text_model(model: nn.Module, folder: str | Path) -> None:
    """``config.json`` and ``model.safetensors`` that transformers 4 and 5 load the same way."""
    from safetensors.torch import save_file

    from ..utils.atomic import atomic_write_text

    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    config = {**model.config.to_diff_dict(), "architectures": ["CLIPTextModel"]}
    config.pop("_name_or_path", None)
    atomic_write_text(root / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    tmp = root / (TEXT_ENCODER_WEIGHTS + ".tmp")
    save_file(clip_text_state_dict(model), str(tmp), metadata={"format": "pt"})
    tmp.replace(root / TEXT_ENCODER_WEIGHTS)


def load_clip_text_model(folder: str | Path) -> nn.Module:
    """A ``CLIPTextModel`` from ``config.json`` + ``model.safetensors`` in either key layout, strictly.

    The keys are mapped onto the installed version's layout; a tensor missing, left over or of another
    shape is a one-line ValueError naming the file.
    """
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel

    root = Path(folder)
    weights = root / TEXT_ENCODER_WEIGHTS
    raw = json.loads((root / "config.json").read_text(encoding="utf-8"))
    config = CLIPTextConfig(**{k: v for k, v in raw.items()
                               if k not in ("architectures", "transformers_version", "model_type")})
    model = CLIPTextModel(config)
    expected = model.state_dict()
    stored = {_canonical(k): v for k, v in load_file(str(weights)).items() if not k.endswith("position_ids")}
    wanted = {_canonical(k): k for k in expected if not k.endswith("position_ids")}
    missing, extra = sorted(set(wanted) - set(stored)), sorted(set(stored) - set(wanted))
    if missing or extra:
        what = f"missing {', '.join(missing[:3])}" if missing else f"unexpected {', '.join(extra[:3])}"
        raise ValueError(f"{weights} does not match the CLIP text encoder of its config.json: {what}")
    state = {}
    for key, name in wanted.items():
        if tuple(stored[key].shape) != tuple(expected[name].shape):
            raise ValueError(f"{weights}: tensor {key} has shape {tuple(stored[key].shape)}, its "
                             f"config.json expects {tuple(expected[name].shape)}")
        state[name] = stored[key]
    with torch.no_grad():
        model.load_state_dict(state, strict=False)  # position_ids buffers are rebuilt, not stored
    return model.eval()


# ---------------------------------------------------------------- tokenizers


def wordpiece_tokenizer(vocab_file: str | Path, do_lower_case: bool = True) -> Any:
    """BERT's WordPiece tokenizer (the Rust implementation on both versions) from ``vocab.txt``."""
    if transformers_major() >= 5:
        from transformers import BertTokenizer

        return BertTokenizer(vocab=str(vocab_file), do_lower_case=do_lower_case,
                             clean_up_tokenization_spaces=True)
    from transformers import BertTokenizerFast

    return BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=do_lower_case,
                             clean_up_tokenization_spaces=True)


def clip_tokenizer(folder: str | Path) -> Any:
    """CLIP's BPE tokenizer (the Rust implementation) from a folder with ``vocab.json`` + ``merges.txt``
    or ``tokenizer.json``."""
    if transformers_major() >= 5:
        from transformers import CLIPTokenizer as Tokenizer
    else:
        from transformers import CLIPTokenizerFast as Tokenizer
    return Tokenizer.from_pretrained(str(folder))
