"""What makes a data-parallel run equal to one process, as pure functions: the update chunks and
the batch-wide advantage std do not depend on how the prompts are split across ranks."""

from __future__ import annotations

import torch

from dynamic_treerpo.trainer.core.advantages import edge_advantages
from dynamic_treerpo.trainer.core.flow import make_sigmas
from dynamic_treerpo.trainer.core.strategies import TreeConfig, build_plan
from dynamic_treerpo.trainer.core.tree import rollout
from dynamic_treerpo.trainer.training.loop import update_chunks

PLAN = build_plan(TreeConfig(steps=6, window_start=0, depth=3, branching=2), make_sigmas("shift", 6))


def grow(seeds: list[int]):
    return rollout(lambda x, s, c: 0.3 * x, None, PLAN, seeds, (2,))


def keys(prompt: torch.Tensor, step: torch.Tensor, first: int = 0) -> list[tuple[int, int, int]]:
    """A name for each forward (or edge) that does not depend on the tree it sits in: its prompt's
    index in the whole batch, its step, and its place among that prompt's ones at that step (ids
    are layer-major, so a shard's ids are not a block of the whole tree's)."""
    seen: dict[tuple[int, int], int] = {}
    out = []
    for p, s in zip(prompt.tolist(), step.tolist(), strict=True):
        k = seen.get((p, s), 0)
        seen[(p, s)] = k + 1
        out.append((p + first, s, k))
    return out


def test_update_chunks_are_the_same_forwards_however_the_prompts_are_sharded() -> None:
    seeds = [11, 12, 13, 14]
    whole = grow(seeds)
    chunks = update_chunks(whole.fwd_prompt, whole.fwd_step, whole.trained_forwards, 2, 2, seed=5,
                           iteration=3)
    assert len(chunks) == 4 and sum(c.numel() for c in chunks) == 2 * whole.trained_forwards.numel()
    names = keys(whole.fwd_prompt, whole.fwd_step)
    for first in (0, 2):  # two ranks of two prompts each
        part = grow(seeds[first:first + 2])
        local = update_chunks(part.fwd_prompt, part.fwd_step, part.trained_forwards, 2, 2, seed=5,
                              iteration=3, first_prompt=first)
        local_names = keys(part.fwd_prompt, part.fwd_step, first)
        for mine, full in zip(local, chunks, strict=True):
            expected = {names[i] for i in full.tolist() if first <= names[i][0] < first + 2}
            assert {local_names[i] for i in mine.tolist()} == expected and expected
    for chunk in chunks:  # every prompt has the same layers, with the same counts, in every chunk
        counts = {p: sorted(whole.fwd_step[chunk][whole.fwd_prompt[chunk] == p].tolist()) for p in range(4)}
        assert len({tuple(c) for c in counts.values()}) == 1 and counts[0]


def test_batch_std_summed_over_ranks_is_the_std_of_the_whole_batch() -> None:
    seeds = [21, 22, 23, 24]
    whole, halves = grow(seeds), [grow(seeds[:2]), grow(seeds[2:])]
    g = torch.Generator().manual_seed(0)
    spread = torch.tensor([1.0, 3.0, 0.3, 2.0])[whole.node_prompt[whole.leaf_node]]  # per-prompt scale
    values = torch.randn(whole.leaf_node.numel(), generator=g) * spread
    half = values.numel() // 2  # leaves are prompt-major
    expected = edge_advantages(whole, values, std_scope="batch")
    assert not torch.allclose(expected, edge_advantages(whole, values))  # the scopes differ
    sums: dict[int, torch.Tensor] = {}

    def other_rank(index: int):
        """A reduce that adds the other half's sums, as an all-reduce over two ranks would."""
        def reduce(t: torch.Tensor) -> torch.Tensor:
            sums[index] = t
            return t + sums[1 - index] if 1 - index in sums else t
        return reduce

    # compute rank 1's sums first (as if it had already contributed), then rank 0 and rank 1
    edge_advantages(halves[1], values[half:], std_scope="batch", reduce=other_rank(1))
    first = edge_advantages(halves[0], values[:half], std_scope="batch", reduce=other_rank(0))
    second = edge_advantages(halves[1], values[half:], std_scope="batch", reduce=other_rank(1))
    got = dict(zip(keys(halves[0].edge_prompt, halves[0].edge_step), first.tolist(), strict=True))
    got.update(zip(keys(halves[1].edge_prompt, halves[1].edge_step, 2), second.tolist(), strict=True))
    want = dict(zip(keys(whole.edge_prompt, whole.edge_step), expected.tolist(), strict=True))
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-5, key
