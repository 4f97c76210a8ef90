"""The caption side of the embedded image encoder: a small set encoder over the embedded model's words.

Why a trainable tower and not the embedded model's frozen text encoder: that encoder is random on purpose
(it keeps words apart for the transformer), and a contrastive target has to put "a red circle and a blue
square" far from "a blue circle and a red square", which takes a tower trained for it. The tower serves
pretraining and the retrieval checks (it ships for them); the personal reward reads images alone.

Words are split as the embedded tokenizer splits them (lower case, words and commas) and take its ids
(``architecture.vocabulary``), between ``<bos>`` and ``<eos>``, padded to its ``MAX_TOKENS``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .architecture import MAX_TOKENS, vocabulary
from .image_tower import TEXT_FILE

WIDTH = 64


@lru_cache(maxsize=1)
def _ids() -> dict[str, int]:
    return {word: i for i, word in enumerate(vocabulary())}


def tokenize(prompts: Sequence[str]) -> Tensor:
    """``[P, MAX_TOKENS]`` token ids (0 is padding); a one-line error names a word outside the grammar."""
    ids = _ids()
    rows = torch.zeros(len(prompts), MAX_TOKENS, dtype=torch.long)
    for r, prompt in enumerate(prompts):
        words = re.findall(r"\w+|[^\w\s]", prompt.lower())
        unknown = [w for w in words if w not in ids]
        if unknown:
            raise ValueError(f"prompt {prompt!r}: unknown word {unknown[0]!r} for the embedded model")
        tokens = [ids["<bos>"], *(ids[w] for w in words), ids["<eos>"]][:MAX_TOKENS]
        rows[r, : len(tokens)] = torch.tensor(tokens)
    return rows


SEPARATORS = (",", "and")
MAX_GROUPS = 3


def phrase_index(ids: Tensor) -> Tensor:
    """``[P, MAX_TOKENS]``: the group phrase each word belongs to (0, 1, 2), -1 for the special tokens and
    the separators between phrases ("," and "and")."""
    vocab = _ids()
    separator = torch.zeros_like(ids, dtype=torch.bool)
    for word in SEPARATORS:
        separator |= ids == vocab[word]
    special = ids <= vocab["<unk>"]
    phrase = separator.long().cumsum(dim=1)
    return torch.where(separator | special, torch.full_like(phrase, -1), phrase.clamp(max=MAX_GROUPS - 1))


class TextTower(nn.Module):
    """Captions -> ``[P, dim]`` unit-norm embeddings: each group phrase ("two red circles on the left") is
    the sum of its words' embeddings through an MLP, the phrases are summed, normalised and mapped.

    Why this shape (a set of phrases) and not a transformer over the words: "a red circle and a blue
    square" and "a blue circle and a red square" hold the same words, and a small transformer trained
    contrastively falls back to a bag of words that cannot tell them apart. Words are bound within their
    phrase here by construction, and the order of the phrases carries nothing, as in the grammar."""

    def __init__(self, dim: int, width: int = WIDTH) -> None:
        super().__init__()
        self.shape = {"width": width}
        self.words = nn.Embedding(len(vocabulary()), width)
        self.phrase = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                    nn.Linear(2 * width, width))
        self.norm = nn.LayerNorm(width)
        self.project = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, dim))

    def forward(self, prompts: Sequence[str]) -> Tensor:
        ids = tokenize(prompts)
        phrase = phrase_index(ids)
        member = F.one_hot(phrase.clamp(min=0), MAX_GROUPS).float() * (phrase >= 0).unsqueeze(-1).float()
        bags = torch.einsum("ptg,ptw->pgw", member, self.words(ids))  # [P, groups, width]
        present = (member.sum(dim=1) > 0).float().unsqueeze(-1)
        pooled = self.norm((self.phrase(bags) * present).sum(dim=1))
        return F.normalize(self.project(pooled), dim=-1)


def load_text_tower(folder: Path, dim: int, shape: dict[str, int]) -> TextTower:
    """The text tower saved beside an image tower (``image_tower.save_towers``), in eval mode, frozen."""
    from safetensors.torch import load_file

    tower = TextTower(dim, **shape)
    tower.load_state_dict(load_file(str(folder / TEXT_FILE)))
    return tower.eval().requires_grad_(False)
