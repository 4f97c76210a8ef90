"""Training under the guard: checkpoints measured on validation pairs, then the person's limit chooses.

:class:`GuardedTraining` wraps a trainer (``trainer.training.loop.Trainer``; the training layer builds
this with :mod:`~..training.guarded`, which also supplies how validation images are drawn) whose
reward names a taste term
(``picks``, the personal reward; ``function`` for a benchmark's hidden taste) and at least one guard
term (``scene``, ``pickscore``, ...). It measures the base model, then every ``guard.every`` iterations
keeps a CPU copy of the LoRA; a checkpoint is measured by the mean taste and guard over the validation pairs
(ODE images of fixed prompt/seed pairs that training never draws), after training the last one first and
earlier ones only while the later ones are past the limit or lost taste (:mod:`~.order`; ``guard.measure:
every`` measures each one as it is kept). At the end it also measures the LoRA at lower strengths where the
last checkpoints went past the limit, chooses (:func:`~.choice.choose`), and loads the chosen weights into the
policy. Every kept checkpoint stays available: a person may take another one, or another strength, without
training again (:meth:`GuardedResult.apply`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from ..config.schema import GuardConfig, TrainConfig
from ..lora.adapters import load_lora_state, lora_state_dict
from ..rewards.mix import RewardMix, parse_reward_spec
from ..rewards.registry import PICKS
from .choice import Choice, allowed, choose, take, tastiest_past_limit
from .controller import ControllerConfig, ControllerState, picks_weight, update
from .levels import guard_limit
from .order import next_to_measure
from .strengths import bisect_strength
from .terms import guard_spec
from .trail import Trail, TrailPoint, paired_se, point_key, scaled_lora, snapshot

Scores = Callable[[Tensor, Sequence[str]], dict[str, Tensor]]
Images = Callable[[], tuple[Tensor, list[str]]]
"""Draws the validation pairs' images with the current weights: ``(images [N, 3, H, W], prompts)``."""


class Steps(Protocol):
    """What the guard needs of a trainer (``trainer.training.loop.Trainer`` has it)."""

    config: TrainConfig
    policy: Any
    reward: RewardMix
    device: torch.device

    def step(self, iteration: int) -> dict[str, Any]: ...

    def check_progress(self, iteration: int) -> None: ...


@dataclass
class GuardedResult:
    """A guarded run: its trail, a LoRA per kept checkpoint (strength 1, on the CPU), the choice."""

    trail: Trail
    snapshots: dict[int, dict[str, Tensor]]
    choice: Choice
    images: dict[str, Tensor] = field(default_factory=dict)  # validation images by point key, a few
    base_guard: Tensor | None = None  # the base model's guard score per validation pair

    def weights(self, iteration: int, strength: float) -> dict[str, Tensor]:
        """The LoRA of a kept checkpoint at a strength (iteration 0 or strength 0: the base model)."""
        if iteration == 0:
            any_state = next(iter(self.snapshots.values()))
            return scaled_lora(any_state, 0.0)
        return scaled_lora(self.snapshots[iteration], strength)

    def apply(self, transformer: torch.nn.Module, choice: Choice | None = None) -> Choice:
        """Load the chosen point's LoRA (the guard's choice by default) into ``transformer``."""
        choice = choice or self.choice
        point = choice.point
        load_lora_state(transformer, self.weights(0, 0.0) if point is None else
                        self.weights(point.iteration, point.strength))
        return choice

    def take(self, iteration: int, strength: float) -> Choice:
        """A person's own choice of checkpoint and strength (no training)."""
        return take(self.trail, iteration, strength, self.snapshots)


class GuardedTraining:
    """Drive ``trainer`` for a run, measuring and keeping checkpoints; see the module docstring."""

    def __init__(self, trainer: Steps, config: GuardConfig, images: Images, taste: str = PICKS,
                 log: Callable[[str], None] = print, keep_images: int = 0,
                 previous: GuardedResult | None = None, reward_spec: str | None = None,
                 by_prompt: bool = False) -> None:
        """``images``: draws the validation images; ``taste``: the reward's taste term (the rest guard);
        ``keep_images``: how many validation images of each point to keep for the before/after grid;
        ``previous``: a guarded run this one continues (its trail and checkpoints carry on);
        ``reward_spec``: the terms of ``trainer.reward`` when its config does not name them (a
        benchmark that hands the trainer a reward built elsewhere); ``by_prompt``: the fall's standard
        error over the validation prompts' mean changes rather than over the pairs (validation prompts
        that stand for other prompts, each seen at several seeds)."""
        self.trainer, self.config, self.log, self.draw = trainer, config, log, images
        self.by_prompt = by_prompt
        reward = trainer.reward
        if taste not in reward.fns:
            raise ValueError(f"the guard needs the taste term {taste!r} in the reward "
                             f"{trainer.config.reward!r}")
        spec = guard_spec(reward_spec or trainer.config.reward, taste)
        self.guard_terms = [t.name for t in parse_reward_spec(spec)]
        self.taste = reward.fns[taste]
        self.guard = RewardMix(spec, {}, trainer.device,
                               prebuilt={n: reward.fns[n] for n in self.guard_terms})
        self.keep_images = keep_images
        self.trail: Trail | None = previous.trail if previous is not None else None
        self.snapshots: dict[int, dict[str, Tensor]] = {} if previous is None else dict(previous.snapshots)
        self.base_guard: Tensor | None = previous.base_guard if previous is not None else None
        self.images: dict[str, Tensor] = dict(previous.images) if previous is not None else {}
        self.taste_name = taste
        self.start_weight = next(t.weight for t in parse_reward_spec(reward_spec or trainer.config.reward)
                                 if t.name == taste)  # where steering starts, as the reward is written
        self.steering: ControllerState | None = None  # set when the limit is known (begin), if steering

    # ------------------------------------------------------------------ measuring
    @torch.no_grad()
    def score(self) -> tuple[Tensor, Tensor, Tensor, list[str]]:
        """``(taste [N], guard [N], images, prompts)`` of the validation pairs under the current weights."""
        self.trainer.policy.eval()
        images, prompts = self.draw()
        images = images.float().cpu()
        return (self.taste(images, prompts)["reward"].float().cpu(),
                self.guard(images, prompts)["reward"].float().cpu(), images, list(prompts))

    def _measure(self, iteration: int, strength: float = 1.0) -> TrailPoint:
        taste, guard, images, prompts = self.score()
        if self.base_guard is None:
            self.base_guard = guard
        weight = self.trainer.reward.weight_of(self.taste_name) if strength == 1.0 and iteration else None
        point = TrailPoint(iteration, strength, float(taste.mean()), float(guard.mean()),
                           paired_se(guard, self.base_guard, prompts if self.by_prompt else None), weight)
        if self.keep_images:
            self.images[point_key(point)] = images[: self.keep_images]
        if self.trail is None:
            spread = float(guard.std(unbiased=True)) if guard.numel() > 1 else 0.0
            limit = guard_limit(self.config.keep, self.guard_terms, spread, self.config.limit)
            self.trail = Trail(limit, spread)
        self.trail.points.append(point)
        return point

    def begin(self) -> TrailPoint:
        """Measure the base model (the LoRA is still zero)."""
        point = self._measure(0)
        self.log(f"guard: base taste {point.taste:.4f}, prompt-following {point.guard:.4f}; limit: a fall "
                 f"of at most {self.trail.limit:.4f} ({self.config.keep})")
        return point

    def begin_from(self, other: GuardedResult) -> None:
        """Take the base model's measurement from ``other``, a run on the same validation pairs, instead
        of measuring it again: the base model is the same whatever the picks weight (the guard's images
        draw their own noise, so the training that follows draws the same). A continued run keeps its own."""
        if self.trail is not None:
            return
        base = other.trail.base
        self.trail = Trail(other.trail.limit, other.trail.guard_spread, [base])
        self.base_guard = other.base_guard
        if point_key(base) in other.images:
            self.images[point_key(base)] = other.images[point_key(base)]

    # ------------------------------------------------------------------ steering
    def _controller(self, point: TrailPoint) -> ControllerConfig:
        """The controller's setpoint after measuring ``point``: the limit less the margin the choice will
        ask of the fall's standard error, so that it steers to checkpoints the limit allows."""
        return ControllerConfig(limit=max(0.0, self.trail.limit - self.config.margin * point.guard_se))

    def _start_steering(self) -> ControllerState:
        """The controller as it stands after the checkpoints already on the trail (none in a new run; a
        resumed or continued run replays them, so it steers as an uninterrupted one would). It starts from
        the reward's own picks weight ``w``, lambda ``(1 - w) / w``: where the fixed weight would train."""
        w = self.start_weight
        start = ControllerConfig(limit=self.trail.limit)
        lam = min(start.most, (1.0 - w) / w)
        state = ControllerState(multiplier=lam, integral=lam / start.ki)
        for point in self.trail.points:
            if point.iteration > 0 and point.strength == 1.0:
                state = update(state, self.trail.fall(point), self._controller(point))
        return state

    def steer(self, point: TrailPoint) -> float:
        """After a checkpoint: the controller's next multiplier from the measured fall, and the picks
        weight it gives set on the trainer's reward for the iterations up to the next checkpoint."""
        assert self.steering is not None
        self.steering = update(self.steering, self.trail.fall(point), self._controller(point))
        return self._apply_steering()

    def _apply_steering(self) -> float:
        weight = picks_weight(self.steering)
        self.trainer.reward.set_share(self.taste_name, weight)
        self.log(f"guard: the picks weight is now {weight:.3f}")
        return weight

    def is_checkpoint(self, done: int, total: int) -> bool:
        """Whether the guard keeps a checkpoint after ``done`` of ``total`` iterations."""
        return done % self.config.every(total) == 0 or done == total

    def measures_every(self) -> bool:
        """Whether each checkpoint is measured as it is kept (``guard.measure: every``, or steering,
        which needs each fall); otherwise after training, last first (:func:`~.order.next_to_measure`)."""
        return self.config.measure == "every" or self.config.steer

    def checkpoint(self, done: int) -> TrailPoint | None:
        """Keep the LoRA after ``done`` iterations, and measure it now if the guard measures every
        checkpoint as it is kept (None: it is measured after training, if needed)."""
        self.snapshots[done] = snapshot(lora_state_dict(self.trainer.policy.transformer))
        if not self.measures_every():
            self.log(f"guard: kept the checkpoint after iteration {done} (measured after training)")
            return None
        return self._log_checkpoint(self._measure(done))

    def _log_checkpoint(self, point: TrailPoint) -> TrailPoint:
        gain = point.taste - self.trail.base.taste
        change = -self.trail.fall(point)
        self.log(f"guard: iteration {point.iteration}: taste {gain:+.4f}, prompt-following {change:+.4f} "
                 f"± {point.guard_se:.4f} (a fall of {self.trail.limit:.4f} allowed)")
        return point

    def _measure_backward(self) -> None:
        """The kept checkpoints not measured yet that the choice needs, last first; the trail then lists
        its checkpoints in order."""
        transformer = self.trainer.policy.transformer
        while (it := next_to_measure(self.trail, self.snapshots, self.config.margin)) is not None:
            load_lora_state(transformer, scaled_lora(self.snapshots[it], 1.0))
            self._log_checkpoint(self._measure(it))
        base, *rest = self.trail.points
        full = sorted((p for p in rest if p.strength == 1.0), key=lambda p: p.iteration)
        self.trail.points = [base, *full, *(p for p in rest if p.strength != 1.0)]

    def _strength_candidates(self) -> list[tuple[int, float]]:
        """Lower strengths for checkpoints the limit does not allow but that may hold more taste than the
        best one it allows: the first such checkpoint and the one with the most taste; each at the
        strength a straight line from the base predicts to land inside the limit with its margin (the
        fall and its standard error both shrink about in proportion to the strength:
        ``s * (fall + margin * se) <= limit``), and at 0.7 of that."""
        trail, margin = self.trail, self.config.margin
        trained = [p for p in trail.points if p.iteration > 0 and p.strength == 1.0]
        over = [p for p in trained if not allowed(trail, p, margin)]
        if not over or not self.config.strength_tries:
            return []
        chosen = {over[0].iteration: over[0]}
        tastiest = max(over, key=lambda p: p.taste)
        chosen[tastiest.iteration] = tastiest
        out: list[tuple[int, float]] = []
        for it, point in chosen.items():
            spent = trail.fall(point) + margin * point.guard_se
            s = min(0.95, max(0.1, trail.limit / spent)) if spent > 0 else 0.5
            for k in range(self.config.strength_tries):
                out.append((it, round(s * 0.7**k, 2)))
        return out

    def _bisect(self) -> None:
        """``search: bisect``: the checkpoint past the limit with the most taste, at strengths halving
        toward the strongest that fits (:func:`~.strengths.bisect_strength`), ``strength_tries``
        measurements."""
        trail, margin = self.trail, self.config.margin
        tastiest = tastiest_past_limit(trail, margin)
        if tastiest is None:
            return
        it = tastiest.iteration
        known = [(p.strength, allowed(trail, p, margin)) for p in trail.points if p.iteration == it]
        bisect_strength(known, self.config.strength_tries,
                        lambda s: allowed(trail, self._measure_strength(it, s), margin))

    def _measure_strength(self, iteration: int, strength: float) -> TrailPoint:
        """The trail's point of a checkpoint at a lower strength, measured now unless it already is."""
        known = self.trail.find(iteration, strength)
        if known is not None:
            return known
        load_lora_state(self.trainer.policy.transformer, scaled_lora(self.snapshots[iteration], strength))
        point = self._measure(iteration, strength)
        gain, change = point.taste - self.trail.base.taste, -self.trail.fall(point)
        self.log(f"guard: iteration {iteration} at strength {strength:g}: taste {gain:+.4f}, "
                 f"prompt-following {change:+.4f}")
        return point

    def finish(self) -> GuardedResult:
        """Measure lower strengths where useful, choose, and load the choice into the policy."""
        transformer = self.trainer.policy.transformer
        final = lora_state_dict(transformer)
        if not self.measures_every():
            self._measure_backward()
        if self.config.search == "bisect":
            self._bisect()
        else:
            for it, strength in self._strength_candidates():
                self._measure_strength(it, strength)
        load_lora_state(transformer, final)
        choice = choose(self.trail, self.config.margin)
        result = GuardedResult(self.trail, self.snapshots, choice, self.images, self.base_guard)
        result.apply(transformer)
        self.log(f"guard: chose {result.choice.reason}" if result.choice.point is not None
                 else f"guard: {result.choice.reason}")
        return result

    def run(self, start: int, count: int, on_iteration: Callable[[int, dict[str, Any]], None] | None = None
            ) -> GuardedResult:
        """Train iterations ``start .. start+count-1`` with checkpoints, then choose."""
        if self.trail is None:
            self.begin()
        if self.config.steer:
            self.steering = self._start_steering()
            if self.steering.steps:
                self._apply_steering()
        total = start + count
        for it in range(start, total):
            row = self.trainer.step(it)
            self.trainer.check_progress(it + 1)
            if on_iteration is not None:
                on_iteration(it - start + 1, row)
            if self.is_checkpoint(it + 1, total):
                point = self.checkpoint(it + 1)
                if self.steering is not None and point is not None and it + 1 < total:
                    self.steer(point)
        return self.finish()
