"""The sampler: one rollout engine for trees, chains and mixed ODE/SDE plans.

A :class:`RolloutPlan` (``plan.py``) says, step by step, which solver runs and how many children
each node draws. Dynamic-TreeRPO, MixGRPO and DanceGRPO are only different plans (see
``strategies.py``), so they share every line of sampling code and their forward counts are comparable.

The engine evaluates all live nodes of all prompts in one model call per step (split only by
``max_batch``), hands them to the step's solver (``solvers.py``: what a step does is there, one
function per solver), and records what the solver returns in a growing tree. All randomness comes
from one generator per prompt (so sharding prompts across processes does not change any sample),
and the result is a :class:`Tree` of plain tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .cond import Cond, index_tensor, select_rows
from .flow import predicted_x0
from .plan import RolloutPlan as RolloutPlan  # re-exported: callers import the plan from the sampler
from .solvers import History, StepInput, StepResult, solver_for
from .solvers import StepOp as StepOp  # re-exported, as RolloutPlan

VelocityFn = Callable[[Tensor, Tensor, Cond], Tensor]
"""``v(x [B, ...], sigma [B], cond rows) -> [B, ...]``: any batched flow-matching model."""


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


# ------------------------------------------------------------------------------ randomness
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


# ------------------------------------------------------------------------------ the growing tree
class TreeBuilder:
    """The tree while it grows: every node's parent, depth and prompt, the live nodes (the leaves so
    far), and the forwards and edges of the stochastic steps, kept as lists and concatenated once at
    the end. It records what a solver returned and knows nothing of how a step is computed."""

    def __init__(self, num_prompts: int, roots_per_prompt: int) -> None:
        roots = num_prompts * roots_per_prompt
        self.num_prompts = num_prompts
        self.node_parent: list[int] = [-1] * roots
        self.node_depth: list[int] = [0] * roots
        self.node_prompt: list[int] = [p for p in range(num_prompts) for _ in range(roots_per_prompt)]
        self.active: list[int] = list(range(roots))  # the live nodes, prompt-major
        self.active_prompt: Tensor = index_tensor(self.node_prompt)
        self.fwd_node: list[Tensor] = []
        self.fwd_step: list[Tensor] = []
        self.fwd_x: list[Tensor] = []
        self.edge_forward: list[Tensor] = []
        self.edge_child: list[Tensor] = []
        self.edge_x_child: list[Tensor] = []
        self.edge_log_prob: list[Tensor] = []
        self.edge_train: list[Tensor] = []
        self.num_fwd = 0
        self.nfe, self.model_calls, self.calls_per_step = 0, 0, []

    def count_forwards(self, rows: int, calls: int) -> None:
        """One step's model evaluation: ``rows`` forwards in ``calls`` batched calls."""
        self.nfe += rows
        self.model_calls += calls
        self.calls_per_step.append(calls)

    def record(self, step: int, op: StepOp, x: Tensor, result: StepResult) -> None:
        """What a solver returned for the live states ``x``: moved nodes change nothing here; drawn
        children become nodes, the parents' states one forward each, the children edges."""
        parents, b = x.shape[0], op.branch
        drew = result.log_prob is not None
        if result.x.shape[0] != parents * (b if drew else 1):
            raise ValueError(f"step {step}: solver {op.solver!r} returned {result.x.shape[0]} rows for "
                             f"{parents} nodes" + (f" x {b} children" if drew else ""))
        if not drew:
            return
        first_child = len(self.node_parent)
        children = list(range(first_child, first_child + parents * b))
        depth, prompt = self.node_depth, self.node_prompt
        self.node_parent += [parent for parent in self.active for _ in range(b)]
        self.node_depth += [depth[parent] + 1 for parent in self.active for _ in range(b)]
        self.node_prompt += [prompt[parent] for parent in self.active for _ in range(b)]
        self.fwd_node.append(index_tensor(self.active))
        self.fwd_step.append(torch.full((parents,), step, dtype=torch.long))
        self.fwd_x.append(x)
        self.edge_forward.append(torch.arange(self.num_fwd, self.num_fwd + parents).repeat_interleave(b))
        self.edge_child.append(index_tensor(children))
        self.edge_x_child.append(result.x)
        self.edge_log_prob.append(result.log_prob)
        self.edge_train.append(torch.full((parents * b,), op.train, dtype=torch.bool))
        self.num_fwd += parents
        self.active = children
        if b > 1:
            self.active_prompt = self.active_prompt.repeat_interleave(b)

    def finish(self, plan: RolloutPlan, leaves: Tensor, generators: Sequence[torch.Generator]) -> Tree:
        """The :class:`Tree`, with ``leaves`` the live nodes' final latents (DanceGRPO's plans keep a
        random subset of each root's trained edges, drawn after sampling)."""
        long0 = torch.zeros(0, dtype=torch.long)
        lat0 = torch.zeros((0, *leaves.shape[1:]), device=leaves.device)
        children = _cat(self.edge_child, long0)
        trained = _cat(self.edge_train, torch.zeros(0, dtype=torch.bool))
        if plan.trained_per_row is not None:
            trained = keep_trained_per_root(trained, children, self.node_parent, self.node_prompt,
                                            plan.trained_per_row, generators)
        return Tree(plan=plan, num_prompts=self.num_prompts, node_parent=index_tensor(self.node_parent),
                    node_depth=index_tensor(self.node_depth), node_prompt=index_tensor(self.node_prompt),
                    fwd_node=_cat(self.fwd_node, long0), fwd_step=_cat(self.fwd_step, long0),
                    fwd_x=_cat(self.fwd_x, lat0), edge_forward=_cat(self.edge_forward, long0),
                    edge_child=children, edge_x_child=_cat(self.edge_x_child, lat0),
                    edge_log_prob_old=_cat(self.edge_log_prob, torch.zeros(0, device=leaves.device)),
                    edge_train=trained, leaf_node=index_tensor(self.active), leaf_latents=leaves,
                    nfe=self.nfe, model_calls=self.model_calls, calls_per_step=self.calls_per_step)


def _cat(parts: list[Tensor], empty: Tensor) -> Tensor:
    return torch.cat(parts) if parts else empty


# ------------------------------------------------------------------------------ sampling
def _evaluate(velocity: VelocityFn, x: Tensor, sigma: float, cond_rows: Cond,
              max_batch: int | None) -> tuple[Tensor, int]:
    """All rows through the model, in chunks of ``max_batch``; returns ``(v, calls)``."""
    rows = x.shape[0]
    if not max_batch or max_batch >= rows:  # one call for all rows, the usual case
        sig = torch.full((rows,), sigma, dtype=torch.float32, device=x.device)
        return velocity(x, sig, cond_rows).float(), 1
    chunk = max(1, max_batch)
    outs = []
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        sig = torch.full((stop - start,), sigma, dtype=torch.float32, device=x.device)
        outs.append(velocity(x[start:stop], sig, select_rows(cond_rows, torch.arange(start, stop))).float())
    return torch.cat(outs), len(outs)


def _root_states(plan: RolloutPlan, generators: Sequence[torch.Generator], latent_shape: tuple[int, ...],
                 noise: Tensor | None, device: torch.device | str | None) -> Tensor:
    """The roots' noise as ``[P * roots, *latent]`` float32 rows on ``device``: drawn from the
    prompts' generators first (before any step's noise), or the given ``noise``."""
    num_prompts, roots = len(generators), plan.roots_per_prompt
    if noise is None:
        noise = initial_noise(plan, generators, latent_shape)
    elif tuple(noise.shape) != (num_prompts, roots, *latent_shape):
        raise ValueError(f"noise must have shape {(num_prompts, roots, *latent_shape)}, "
                         f"got {tuple(noise.shape)}")
    dev = torch.device(device) if device is not None else noise.device
    return noise.reshape(num_prompts * roots, *latent_shape).float().to(dev)


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

    Each step is one model call for all live nodes, then the step's solver (looked up once by name
    in ``solvers.SOLVERS``); the rollout only grows the tree from what the solver returns, so a new
    solver needs no change here.
    """
    if len(seeds) < 1:
        raise ValueError("rollout needs at least one prompt (one seed per prompt)")
    gens = prompt_generators(seeds)
    x = _root_states(plan, gens, tuple(int(s) for s in latent_shape), noise, device)
    steps = [solver_for(op.solver).step for op in plan.ops]
    options = plan.sde_options
    tree = TreeBuilder(len(seeds), plan.roots_per_prompt)
    cond_rows = select_rows(cond, tree.active_prompt)
    history = History()
    for i, (op, solve) in enumerate(zip(plan.ops, steps, strict=True)):
        v, calls = _evaluate(velocity, x, op.sigma, cond_rows, max_batch)
        x0 = predicted_x0(x, v, op.sigma)  # every step's, as a multistep solver's history
        if on_step is not None:
            on_step(i, len(plan.ops), x0)
        tree.count_forwards(x.shape[0], calls)
        result = solve(StepInput(op, x, v, x0, history, tree.active_prompt, gens, options))
        tree.record(i, op, x, result)
        if result.x.shape[0] != x.shape[0]:  # nodes branched: each child's row needs its prompt's cond
            cond_rows = select_rows(cond, tree.active_prompt)
        x, history = result.x, result.history
    return tree.finish(plan, x, gens)


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
