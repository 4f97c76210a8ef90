"""What training from picks spends by default, in one place: the node (TreeRPO Train LoRA from Picks) on
the embedded model, its pick-and-train template, the headless preset ``configs/picks.yaml`` and
``treerpo bench taste`` all read :data:`PICKS_BUDGET`, and tests fail when one of them parts from it.

Why one object: a benchmark figure is about what a person gets. When the node trained 8 rounds at one
learning rate and the benchmark 24 at another, no figure said what pressing run in the template gives.
The template's trees (its prompts, trees per prompt and tree shape) are here too, so that the
benchmark's template row draws the trees a person who opens the template draws.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TemplateTrees:
    """The trees the pick-and-train template samples (TreeRPO Sample Trees to Pick's widgets there)."""

    prompts: tuple[str, ...] = ("two red circles", "a blue square on the left", "a green triangle at the top")
    trees_per_prompt: int = 4
    seed: int = 0
    steps: int = 10
    depth: int = 3
    branching: int = 2
    window_start: int = 0
    noise_level: float = 0.6

    @property
    def trees(self) -> int:
        return len(self.prompts) * self.trees_per_prompt


@dataclass(frozen=True)
class PicksBudget:
    """The training a person's picks get: rounds per picks weight, the learning rate, prompts per round,
    the LoRA's size, and the guard's checkpoints, validation pairs, picks weights, margin and when it
    measures (``trainer/guard``; docs/picks.md says what each means in plain words). Since 0.6 the rounds,
    rate and LoRA are those ``treerpo bench taste`` measured in 0.5: the node's earlier 8 rounds at 0.001
    moved the images too little to reach the guard's limit (docs/results-taste.md compares the two)."""

    iterations: int = 24
    lr: float = 0.0016
    prompts_per_iteration: int = 8
    lora_rank: int = 16
    lora_alpha: float = 16.0
    checkpoints: int = 4
    validation_pairs: int = 512
    weights: tuple[float, ...] = (0.4,)
    margin: float = 1.0
    measure: str = "backward"
    template: TemplateTrees = TemplateTrees()

    def overrides(self) -> list[str]:
        """The config overrides (``--set`` lines) that give a run this budget's training; the rounds are
        the node's widget (``iterations``), so they are not among them."""
        weights = ", ".join(f"{w:g}" for w in self.weights)
        return [f"optim.lr={self.lr:g}", f"data.prompts_per_iteration={self.prompts_per_iteration}",
                f"lora.rank={self.lora_rank}", f"lora.alpha={self.lora_alpha:g}",
                f"guard.checkpoints={self.checkpoints}", f"guard.pairs={self.validation_pairs}",
                f"guard.weights=[{weights}]", f"guard.margin={self.margin:g}",
                f"guard.measure={self.measure}"]


PICKS_BUDGET = PicksBudget()
"""The shipped budget (the node's defaults on the embedded model)."""
