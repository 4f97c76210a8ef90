"""The sampler: one rollout engine for trees, chains and mixed ODE/SDE plans.

A :class:`RolloutPlan` says, step by step, which solver runs and how many children each node
draws. Dynamic-TreeRPO, MixGRPO and DanceGRPO are only different plans (see ``strategies.py``),
so they share every line of sampling code and their forward counts are comparable.

The engine evaluates all live nodes of all prompts in one model call per step (split only by
``max_batch``), draws all randomness from one generator per prompt (so sharding prompts across
processes does not change any sample), and returns a :class:`Tree` of plain tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from .cond import Cond, index_tensor, select_rows
from .flow import (
    FULL_NOISE,
    SDE_KINDS,
    LogProbForm,
    NoiseSubspace,
    dpm2m_step,
    gaussian_log_prob,
    ode_step,
    predicted_x0,
    sde_transition,
)

VelocityFn = Callable[[Tensor, Tensor, Cond], Tensor]
"""``v(x [B, ...], sigma [B], cond rows) -> [B, ...]``: any batched flow-matching model."""

Solver = Literal["euler", "sde", "dpm2m"]


@dataclass(frozen=True)
class StepOp:
    """One step ``sigma -> sigma_next`` of a plan.

    ``sde`` steps draw ``branch`` children per node with ``noise_level``; ``train`` marks their
    edges as trained. ``noise_scale`` multiplies the noise a child draws and nothing else: the mean
    and the density (its log-probability) keep ``noise_level``'s, as BranchGRPO's split steps do
    (Fredreic1849/BranchGRPO@19fbb9f ``fastvideo/train_branchgrpo_flux.py`` 271-279). ``euler`` and
    ``dpm2m`` steps are deterministic and move nodes in place.
    """

    sigma: float
    sigma_next: float
    solver: Solver = "euler"
    branch: int = 1
    noise_level: float = 0.0
    train: bool = False
    noise_scale: float = 1.0


@dataclass(frozen=True)
class RolloutPlan:
    """A complete sampling recipe for one prompt's group, applied to every prompt of a batch."""

    strategy: str
    ops: tuple[StepOp, ...]
    roots_per_prompt: int
    shared_root_noise: bool = False
    antithetic: bool = False
    sde_kind: str = "flow_grpo"
    window_start: int = 0
    log_prob_reduction: Literal["mean", "sum"] = "mean"
    log_prob_form: LogProbForm = "gaussian"
    noise: NoiseSubspace = FULL_NOISE
    trained_per_row: int | None = None  # keep this many trained steps per root, drawn per root

    def __post_init__(self) -> None:
        if self.roots_per_prompt < 1:
            raise ValueError(f"roots_per_prompt must be >= 1, got {self.roots_per_prompt}")
        if self.trained_per_row is not None and self.trained_per_row < 1:
            raise ValueError(f"trained_per_row must be >= 1, got {self.trained_per_row}")
        if self.sde_kind not in SDE_KINDS:
            raise ValueError(f"unknown sde_kind {self.sde_kind!r}; expected one of {SDE_KINDS}")
        if not self.ops:
            raise ValueError("a plan needs at least one step")
        for i, op in enumerate(self.ops):
            if not op.sigma > op.sigma_next >= 0.0:
                raise ValueError(f"step {i}: sigma must decrease, got {op.sigma} -> {op.sigma_next}")
            if op.branch < 1:
                raise ValueError(f"step {i}: branch must be >= 1, got {op.branch}")
            if op.noise_scale <= 0.0 or (op.noise_scale != 1.0 and op.solver != "sde"):
                raise ValueError(f"step {i}: noise_scale must be > 0, and apply to an SDE step")
            if op.solver == "sde":
                if op.noise_level <= 0.0:
                    raise ValueError(f"step {i}: an SDE step needs noise_level > 0")
                if op.sigma_next <= 0.0:
                    raise ValueError(f"step {i}: the final step (to sigma 0) has no density; "
                                     "it cannot be an SDE step")
            elif op.branch != 1 or op.train:
                raise ValueError(f"step {i}: only SDE steps can branch or be trained")
        if self.ops[-1].sigma_next != 0.0:
            raise ValueError("a plan must end at sigma 0")

    @property
    def leaves_per_prompt(self) -> int:
        """Images scored per prompt."""
        return self.roots_per_prompt * math.prod(op.branch for op in self.ops)


@dataclass
class Tree:
    """What a rollout produced: nodes, the model forwards at SDE steps, edges, leaves.

    Node ids, forward ids and edge ids index the tensors below. Forwards are the parent states
    at SDE steps (one model evaluation each, shared by that parent's ``branch`` children); an
    edge is one drawn child with its old log-probability. Everything is prompt-major.
    """

    plan: RolloutPlan
    num_prompts: int
    node_parent: Tensor  # [nodes] long, -1 for roots
    node_depth: Tensor  # [nodes] long, number of SDE edges above the node
    node_prompt: Tensor  # [nodes] long
    fwd_node: Tensor  # [F] long: the parent node evaluated
    fwd_step: Tensor  # [F] long: index into plan.ops
    fwd_x: Tensor  # [F, *latent] float32: parent state at that step
    edge_forward: Tensor  # [E] long
    edge_child: Tensor  # [E] long
    edge_x_child: Tensor  # [E, *latent] float32
    edge_log_prob_old: Tensor  # [E] float32
    edge_train: Tensor  # [E] bool
    leaf_node: Tensor  # [L] long
    leaf_latents: Tensor  # [L, *latent] float32: final clean latents
    nfe: int  # per-sample model forwards
    model_calls: int  # batched calls to the velocity function
    calls_per_step: list[int] = field(default_factory=list)

    # ---------------------------------------------------------------- per-forward views
    def _op_values(self, attr: str, steps: Tensor) -> Tensor:
        values = [getattr(op, attr) for op in self.plan.ops]
        return torch.tensor(values, dtype=torch.float32)[steps]

    @property
    def fwd_sigma(self) -> Tensor:
        return self._op_values("sigma", self.fwd_step)

    @property
    def fwd_sigma_next(self) -> Tensor:
        return self._op_values("sigma_next", self.fwd_step)

    @property
    def fwd_noise_level(self) -> Tensor:
        return self._op_values("noise_level", self.fwd_step)

    @property
    def fwd_prompt(self) -> Tensor:
        return self.node_prompt[self.fwd_node]

    @property
    def fwd_depth(self) -> Tensor:
        """Tree layer of the forward: the depth of the parent node."""
        return self.node_depth[self.fwd_node]

    # ---------------------------------------------------------------- per-edge views
    @property
    def edge_parent(self) -> Tensor:
        return self.fwd_node[self.edge_forward]

    @property
    def edge_x_parent(self) -> Tensor:
        return self.fwd_x[self.edge_forward]

    @property
    def edge_step(self) -> Tensor:
        return self.fwd_step[self.edge_forward]

    @property
    def edge_sigma(self) -> Tensor:
        return self.fwd_sigma[self.edge_forward]

    @property
    def edge_sigma_next(self) -> Tensor:
        return self.fwd_sigma_next[self.edge_forward]

    @property
    def edge_noise_level(self) -> Tensor:
        return self.fwd_noise_level[self.edge_forward]

    @property
    def edge_prompt(self) -> Tensor:
        return self.node_prompt[self.edge_child]

    @property
    def edge_depth(self) -> Tensor:
        """Depth of the edge's child (the group its advantage is normalised in)."""
        return self.node_depth[self.edge_child]

    # ---------------------------------------------------------------- structure
    @property
    def num_nodes(self) -> int:
        return int(self.node_parent.numel())

    @property
    def leaves_per_prompt(self) -> int:
        return self.plan.leaves_per_prompt

    @property
    def trained_forwards(self) -> Tensor:
        """Ids of forwards with at least one trained edge (what a training pass evaluates)."""
        mask = torch.zeros(self.fwd_node.numel(), dtype=torch.bool)
        mask[self.edge_forward[self.edge_train]] = True
        return mask.nonzero().flatten()

    def ancestor_at_depth(self, nodes: Tensor, depth: int | Tensor) -> Tensor:
        """Ancestor of each node at ``depth`` (scalar or per node; itself if already there)."""
        out = nodes.clone()
        target = torch.as_tensor(depth, dtype=torch.long).expand(out.shape)
        for _ in range(int(self.node_depth.max().item()) + 1):
            deeper = self.node_depth[out] > target
            if not bool(deeper.any()):
                break
            out[deeper] = self.node_parent[out[deeper]]
        return out


# ------------------------------------------------------------------------------ sampling
def prompt_generators(seeds: Sequence[int]) -> list[torch.Generator]:
    """One CPU generator per prompt: samples do not depend on batch composition or device."""
    return [torch.Generator().manual_seed(int(seed)) for seed in seeds]


def keyed_generator(key: Sequence[int]) -> torch.Generator:
    """A CPU generator seeded from a tuple of integers (seed, iteration, prompt, ..., a tag): each
    draw that must not depend on sharding or batch order gets its own stream from what it is."""
    return torch.Generator().manual_seed(int(np.random.default_rng(list(key)).integers(2**62)))


def initial_noise(plan: RolloutPlan, generators: Sequence[torch.Generator],
                  latent_shape: Sequence[int]) -> Tensor:
    """``[P, roots, *latent]`` Gaussian noise; roots of a prompt share it when the plan says so."""
    per_prompt = []
    for gen in generators:
        count = 1 if plan.shared_root_noise else plan.roots_per_prompt
        noise = torch.randn((count, *latent_shape), generator=gen)
        per_prompt.append(noise.expand(plan.roots_per_prompt, *latent_shape))
    return torch.stack(per_prompt)


def _evaluate(velocity: VelocityFn, x: Tensor, sigma: float, cond_rows: Cond,
              max_batch: int | None) -> tuple[Tensor, int]:
    """All rows through the model, in chunks of ``max_batch``; returns ``(v, calls)``."""
    rows = x.shape[0]
    chunk = rows if not max_batch else max(1, max_batch)
    outs, calls = [], 0
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        part_cond = cond_rows if stop - start == rows else select_rows(
            cond_rows, torch.arange(start, stop))
        sig = torch.full((stop - start,), sigma, dtype=torch.float32, device=x.device)
        outs.append(velocity(x[start:stop], sig, part_cond).float())
        calls += 1
    return torch.cat(outs) if len(outs) > 1 else outs[0], calls


def _branch_noise(generators: Sequence[torch.Generator], per_prompt: list[int],
                  latent_shape: Sequence[int], device: torch.device, branch: int = 1,
                  antithetic: bool = False) -> Tensor:
    """Children's noise, prompt-major, each prompt drawing from its own generator.

    ``antithetic``: siblings come in mirrored pairs ``(eps, -eps)`` (an odd last child draws its
    own). Each child's marginal is unchanged, so log-probabilities and ratios stay exact, while the
    pair's shared part of the advantage cancels in the gradient, as in mirrored evolution strategies.
    """
    parts = []
    for p, n in enumerate(per_prompt):
        if not antithetic or branch < 2:
            parts.append(torch.randn((n, *latent_shape), generator=generators[p]))
            continue
        parents, pairs = n // branch, branch // 2
        half = torch.randn((parents, pairs, *latent_shape), generator=generators[p])
        mirrored = torch.stack([half, -half], dim=2).reshape(parents, 2 * pairs, *latent_shape)
        if branch % 2:
            odd = torch.randn((parents, 1, *latent_shape), generator=generators[p])
            mirrored = torch.cat([mirrored, odd], dim=1)
        parts.append(mirrored.reshape(n, *latent_shape))
    return torch.cat(parts).to(device)


def keep_trained_per_root(edge_train: Tensor, edge_child: Tensor, node_parent: Sequence[int],
                          node_prompt: Sequence[int], count: int,
                          generators: Sequence[torch.Generator]) -> Tensor:
    """Keep a random ``count`` of each root's trained edges (all when it has fewer), drawn from its
    prompt's generator: DanceGRPO trains a different random subset of steps for every trajectory."""
    root = list(range(len(node_parent)))
    for node, parent in enumerate(node_parent):  # parents precede children
        if parent >= 0:
            root[node] = root[parent]
    edge_root = torch.tensor(root, dtype=torch.long)[edge_child]
    kept = torch.zeros_like(edge_train)
    for r in sorted(set(edge_root[edge_train].tolist())):
        edges = (edge_train & (edge_root == r)).nonzero().flatten()
        order = torch.randperm(edges.numel(), generator=generators[node_prompt[r]])
        kept[edges[order[:count]]] = True
    return kept


@torch.no_grad()
def rollout(velocity: VelocityFn, cond: Cond, plan: RolloutPlan, seeds: Sequence[int],
            latent_shape: Sequence[int], noise: Tensor | None = None,
            max_batch: int | None = None, device: torch.device | str | None = None,
            on_step: Callable[[int, int, Tensor], None] | None = None) -> Tree:
    """Run ``plan`` for ``len(seeds)`` prompts and return the :class:`Tree`.

    ``cond`` holds one row per prompt (see ``cond.select_rows``). ``noise`` overrides the
    initial noise, shape ``[P, roots_per_prompt, *latent_shape]``. ``seeds[p]`` seeds every
    random draw of prompt ``p``: the same seeds give bitwise the same tree. ``on_step(step, steps,
    x0)`` sees each step's predicted clean latents of every active node (for live previews).
    """
    num_prompts = len(seeds)
    if num_prompts < 1:
        raise ValueError("rollout needs at least one prompt (one seed per prompt)")
    latent_shape = tuple(int(s) for s in latent_shape)
    gens = prompt_generators(seeds)
    roots = plan.roots_per_prompt
    if noise is None:
        noise = initial_noise(plan, gens, latent_shape)
    elif tuple(noise.shape) != (num_prompts, roots, *latent_shape):
        raise ValueError(f"noise must have shape {(num_prompts, roots, *latent_shape)}, "
                         f"got {tuple(noise.shape)}")
    dev = torch.device(device) if device is not None else noise.device
    x = noise.reshape(num_prompts * roots, *latent_shape).float().to(dev)

    node_parent = [-1] * (num_prompts * roots)
    node_depth = [0] * (num_prompts * roots)
    node_prompt = [p for p in range(num_prompts) for _ in range(roots)]
    active = list(range(num_prompts * roots))
    active_prompt = index_tensor(node_prompt)
    cond_rows = select_rows(cond, active_prompt)

    fwd_node: list[Tensor] = []
    fwd_step: list[Tensor] = []
    fwd_x: list[Tensor] = []
    edge_forward: list[Tensor] = []
    edge_child: list[Tensor] = []
    edge_x_child: list[Tensor] = []
    edge_log_prob: list[Tensor] = []
    edge_train: list[Tensor] = []
    nfe, calls, calls_per_step = 0, 0, []
    num_fwd = 0
    prev_x0: Tensor | None = None
    prev_sigma: float | None = None

    for step, op in enumerate(plan.ops):
        v, step_calls = _evaluate(velocity, x, op.sigma, cond_rows, max_batch)
        # every step's clean-image prediction is kept, so that a DPM-Solver++(2M) step after an
        # Euler or SDE step is second order, as MixGRPO-Flash's tail is (Tencent-Hunyuan/MixGRPO@e5cdd6a
        # fastvideo/utils/sampling_utils.py 114-127)
        x0 = predicted_x0(x, v, op.sigma)
        if on_step is not None:
            on_step(step, len(plan.ops), x0)
        nfe += x.shape[0]
        calls += step_calls
        calls_per_step.append(step_calls)
        if op.solver == "euler":
            x, prev_x0, prev_sigma = ode_step(x, v, op.sigma, op.sigma_next), x0, op.sigma
            continue
        if op.solver == "dpm2m":
            x = dpm2m_step(x, x0, op.sigma, op.sigma_next, prev_x0, prev_sigma)
            prev_x0, prev_sigma = x0, op.sigma
            continue
        prev_x0, prev_sigma = x0.repeat_interleave(op.branch, dim=0), op.sigma
        parents = x.shape[0]
        dist = sde_transition(plan.sde_kind, x, v, op.sigma, op.sigma_next, op.noise_level,
                              plan.noise)
        b = op.branch
        per_prompt = torch.bincount(active_prompt, minlength=num_prompts) * b
        eps = _branch_noise(gens, per_prompt.tolist(), latent_shape, dev, b, plan.antithetic)
        child_dist = dist.rows(torch.arange(parents, device=dev).repeat_interleave(b))
        x_child = child_dist.sample(eps * op.noise_scale if op.noise_scale != 1.0 else eps)
        log_prob = gaussian_log_prob(x_child, child_dist, plan.log_prob_reduction, plan.log_prob_form)

        first_child = len(node_parent)
        children = list(range(first_child, first_child + parents * b))
        for parent in active:
            node_parent.extend([parent] * b)
            node_depth.extend([node_depth[parent] + 1] * b)
            node_prompt.extend([node_prompt[parent]] * b)
        fwd_ids = torch.arange(num_fwd, num_fwd + parents)
        fwd_node.append(index_tensor(active))
        fwd_step.append(torch.full((parents,), step, dtype=torch.long))
        fwd_x.append(x)
        edge_forward.append(fwd_ids.repeat_interleave(b))
        edge_child.append(index_tensor(children))
        edge_x_child.append(x_child)
        edge_log_prob.append(log_prob)
        edge_train.append(torch.full((parents * b,), op.train, dtype=torch.bool))
        num_fwd += parents

        x, active = x_child, children
        if b > 1:
            active_prompt = active_prompt.repeat_interleave(b)
            cond_rows = select_rows(cond, active_prompt)

    def cat(parts: list[Tensor], empty: Tensor) -> Tensor:
        return torch.cat(parts) if parts else empty

    long0 = torch.zeros(0, dtype=torch.long)
    children = cat(edge_child, long0)
    trained = cat(edge_train, torch.zeros(0, dtype=torch.bool))
    if plan.trained_per_row is not None:
        trained = keep_trained_per_root(trained, children, node_parent, node_prompt,
                                        plan.trained_per_row, gens)
    lat0 = torch.zeros((0, *latent_shape), device=dev)
    return Tree(
        plan=plan,
        num_prompts=num_prompts,
        node_parent=index_tensor(node_parent),
        node_depth=index_tensor(node_depth),
        node_prompt=index_tensor(node_prompt),
        fwd_node=cat(fwd_node, long0),
        fwd_step=cat(fwd_step, long0),
        fwd_x=cat(fwd_x, lat0),
        edge_forward=cat(edge_forward, long0),
        edge_child=children,
        edge_x_child=cat(edge_x_child, lat0),
        edge_log_prob_old=cat(edge_log_prob, torch.zeros(0, device=dev)),
        edge_train=trained,
        leaf_node=index_tensor(active),
        leaf_latents=x,
        nfe=nfe,
        model_calls=calls,
        calls_per_step=calls_per_step,
    )


# the tensors of a Tree, one row per node, forward, edge or leaf: what a stored tree holds
TREE_TENSORS = ("node_parent", "node_depth", "node_prompt", "fwd_node", "fwd_step", "fwd_x", "edge_forward",
                "edge_child", "edge_x_child", "edge_log_prob_old", "edge_train", "leaf_node", "leaf_latents")


def concat_trees(trees: Sequence[Tree]) -> Tree:
    """Several rollouts of one plan as one, prompt-major (node, forward and edge ids offset), as if
    they had been sampled together: what a stored tree of each of several prompts becomes for one
    training update."""
    if not trees:
        raise ValueError("concat_trees needs at least one tree")
    plan = trees[0].plan
    if any(t.plan != plan for t in trees[1:]):
        raise ValueError("only trees of the same plan can be trained together")
    parts: dict[str, list[Tensor]] = {name: [] for name in TREE_TENSORS}
    nodes = forwards = prompts = 0
    for t in trees:
        parts["node_parent"].append(torch.where(t.node_parent >= 0, t.node_parent + nodes, t.node_parent))
        parts["node_depth"].append(t.node_depth)
        parts["node_prompt"].append(t.node_prompt + prompts)
        parts["fwd_node"].append(t.fwd_node + nodes)
        parts["fwd_step"].append(t.fwd_step)
        parts["fwd_x"].append(t.fwd_x)
        parts["edge_forward"].append(t.edge_forward + forwards)
        parts["edge_child"].append(t.edge_child + nodes)
        parts["edge_x_child"].append(t.edge_x_child)
        parts["edge_log_prob_old"].append(t.edge_log_prob_old)
        parts["edge_train"].append(t.edge_train)
        parts["leaf_node"].append(t.leaf_node + nodes)
        parts["leaf_latents"].append(t.leaf_latents)
        nodes += t.num_nodes
        forwards += int(t.fwd_node.numel())
        prompts += t.num_prompts
    return Tree(plan=plan, num_prompts=prompts, nfe=sum(t.nfe for t in trees),
                model_calls=sum(t.model_calls for t in trees),
                **{name: torch.cat(values) for name, values in parts.items()})
