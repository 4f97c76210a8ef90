"""How big a tree may grow. A tree of depth d and branching b has b^d leaves, so the inputs' own ranges
(depth and branching up to 8) allow 16.7 million images from one latent: such a tree would fill any
memory minutes into a run. Two budgets refuse it before anything runs, each in one line that names
depth and branching:

* the leaf budget, checked when ComfyUI validates the graph: at most ``MAX_LEAVES`` leaves per tree
  (per prompt for training, where ``trees_per_prompt`` trees or a baseline's group count too);
* the memory budget, checked when a sampler node knows its latent, before sampling: the tree's
  latents plus one model pass over all its leaves (ComfyUI's own estimate for the model) must fit in
  the device's memory less the model's weights.

No ComfyUI import here: the memory figures come in as numbers (``comfy_door.tree_memory`` reads them)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_LEAVES = 256  # per tree: e.g. depth 8 x branching 2, depth 4 x branching 4, depth 2 x branching 8 (64)
GIB = 1024**3


def tree_leaves(depth: int, branching: int) -> int:
    return branching**depth


def check_leaves(depth: int, branching: int, depth_name: str = "depth",
                 branching_name: str = "branching") -> None:
    """One error naming depth and branching when ``branching^depth`` exceeds the leaf budget."""
    leaves = tree_leaves(depth, branching)
    if leaves > MAX_LEAVES:
        raise ValueError(f"{depth_name}: {depth} splits of {branching} branches make {leaves:,} images per "
                         f"tree ({branching_name}^{depth_name}); the budget is {MAX_LEAVES} per tree: lower "
                         f"{depth_name} or {branching_name}")


# the settings keys that set how many images a training strategy draws per prompt
STRATEGY_IMAGE_KEYS = {
    "dynamic_treerpo": ("tree.depth", "tree.branching", "tree.trees_per_prompt"),
    "branchgrpo": ("branchgrpo.splits", "branchgrpo.branching"),
    "mixgrpo": ("mixgrpo.group_size",), "mixgrpo_flash": ("mixgrpo.group_size",),
    "dancegrpo": ("dancegrpo.group_size",),
    "flow_grpo": ("flow_grpo.group_size",), "flow_grpo_fast": ("flow_grpo.group_size",),
    "diffusionnft": ("diffusionnft.group_size",), "awm": ("awm.group_size",), "dgpo": ("dgpo.group_size",),
}


def check_training_images(strategy: str, images_per_prompt: int, values: dict[str, int]) -> None:
    """The training node's leaf budget: the images one iteration draws per prompt (its rollout plan's
    leaves), one error naming the settings keys that set them, with their values."""
    if images_per_prompt <= MAX_LEAVES:
        return
    keys = STRATEGY_IMAGE_KEYS.get(strategy, ())
    shown = [k for k in keys if k in values and (k in keys[:2] or values[k] != 1)]  # trees_per_prompt=1: no
    named = " and ".join(f"{k}={values[k]}" for k in shown) or strategy
    raise ValueError(f"settings: {named} make {images_per_prompt:,} images per prompt; the budget is "
                     f"{MAX_LEAVES} per prompt (the leaf budget of a tree): lower "
                     f"{' or '.join(k for k in keys[:2]) or 'the tree'}")


def stored_latents(depth: int, branching: int) -> int:
    """Latents a rollout of one tree holds at its peak: each node's state kept for training, once in
    the per-step lists and once in the tensors they are joined into, plus the working copies of the
    leaves (state, velocity, predicted image, the step's mean)."""
    nodes = sum(branching**k for k in range(depth + 1))
    return 2 * nodes + 4 * tree_leaves(depth, branching)


@dataclass(frozen=True)
class MemoryNeed:
    """What a tree sampler needs and has, in bytes (``device``: where the model runs)."""

    latents: int  # the tree's latents (float32)
    model_pass: int  # one model pass over every leaf, ComfyUI's estimate
    available: int  # the device's memory less the model's weights
    weights: int
    device: str

    @property
    def total(self) -> int:
        return self.latents + self.model_pass


def check_memory(need: MemoryNeed, depth: int, branching: int, trees: int,
                 latent_shape: tuple[int, ...]) -> None:
    """One error naming depth and branching when the tree cannot fit in the device's memory."""
    if need.total <= need.available:
        return
    leaves = tree_leaves(depth, branching)
    shape = "x".join(str(s) for s in latent_shape)
    grown = f"{leaves} leaves of {shape} per tree" + (f", {trees} trees" if trees > 1 else "")
    raise ValueError(f"depth: {depth} splits of {branching} branches grow {grown}: about "
                     f"{size(need.total)} (the tree's latents {size(need.latents)}, one model pass over its "
                     f"leaves {size(need.model_pass)}), more than the {size(need.available)} that "
                     f"{need.device} has beside the model's {size(need.weights)} of weights: lower depth or "
                     "branching, or use a smaller or shorter latent batch")


def size(count: int) -> str:
    """Bytes as GiB, or MiB under a tenth of a GiB."""
    return f"{count / GIB:.1f} GiB" if count >= GIB / 10 else f"{count / 2**20:.0f} MiB"
