"""Out-of-place augmented assignment while autograd records, and block checkpointing on top."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dynamic_treerpo.trainer.models.autograd_safe import out_of_place_updates
from dynamic_treerpo.trainer.models.block_checkpoint import checkpointed_blocks


class AddsInPlace(nn.Module):
    """A residual block written as ComfyUI writes them: the input is normed, then added into."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x += self.proj(self.norm(x))
        x *= 0.5
        return x


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([AddsInPlace() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        for block in self.blocks:
            x = block(x)
        return x


def reference_grads(model: Stack, x: torch.Tensor) -> list[torch.Tensor]:
    """The same function written out of place, by hand."""
    h = x * 1.0
    for block in model.blocks:
        h = (h + block.proj(block.norm(h))) * 0.5
    grads = torch.autograd.grad(h.square().sum(), list(model.parameters()))
    return [g.clone() for g in grads]


@pytest.fixture
def model() -> Stack:
    torch.manual_seed(0)
    return Stack()


def test_in_place_blocks_cannot_be_differentiated_without_the_guard(model) -> None:
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="inplace"):
        model(x).square().sum().backward()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_guard_gives_the_true_gradient_with_and_without_checkpointing(model, checkpointing) -> None:
    x = torch.randn(4, 8)
    expected = reference_grads(model, x)
    with out_of_place_updates(), (checkpointed_blocks(model) if checkpointing else torch.enable_grad()):
        model(x).square().sum().backward()
    for param, grad in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(param.grad, grad)


def test_guard_keeps_in_place_updates_without_gradients_and_is_removed_after(model) -> None:
    x = torch.zeros(3)
    with out_of_place_updates(), torch.no_grad():
        y = x
        y += 1  # no autograd record: still in place, as the model was written
    assert x.tolist() == [1.0, 1.0, 1.0]
    a = torch.zeros(2, requires_grad=True) * 1.0
    before = a
    a += 1  # outside the guard: torch's own in-place operator again
    assert a is before


def test_checkpointed_blocks_are_restored_and_need_a_block_list() -> None:
    model = Stack()
    with checkpointed_blocks(model) as count:
        assert count == 3 and "forward" in model.blocks[0].__dict__
    assert "forward" not in model.blocks[0].__dict__
    with pytest.raises(ValueError, match="no block list"), checkpointed_blocks(nn.Linear(2, 2)):
        pass
