"""Flow-matching schedules and single steps: ODE (Euler), SDE (three forms), DPM-Solver++(2M).

Everything here is a pure function of tensors. The step math always runs in float32, whatever
dtype the model returns, because the SDE log-probabilities are differences of tiny numbers.
Conventions (docs/algorithm.md, "Flow matching and steps"): ``x_s = (1 - s) x0 + s eps``,
``s = 1`` is pure noise, the model predicts ``v ~ eps - x0``, a step goes from ``sigma`` to
``sigma_next < sigma``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

ScheduleKind = Literal["linear", "shift", "flux"]
SdeKind = Literal["flow_grpo", "dance", "cps"]
SDE_KINDS: tuple[str, ...] = get_args(SdeKind)
LogProbForm = Literal["gaussian", "unnormalised"]
"""``gaussian``: the step's Gaussian log-density. ``unnormalised``: ``-(x - mean)^2`` with every
constant removed, no ``1 / (2 std^2)`` and no ``log std``, as Flow-GRPO's code computes it for its
coefficient-preserving (cps) step (flow_grpo@9745241 ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py``
85-89, "remove all constants"); its ratios, and so what a clip range means, differ by ``1 / (2 std^2)``."""
SCHEDULE_KINDS: tuple[str, ...] = ("linear", "shift", "flux")

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- schedules
def _unit_grid(steps: int) -> Tensor:
    """``u_i = 1 - i/T`` for ``i = 0..T`` in float64 (exact endpoints 1 and 0)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return 1.0 - torch.arange(steps + 1, dtype=torch.float64) / steps


def linear_sigmas(steps: int) -> Tensor:
    """Uniform grid ``1 = s_0 > ... > s_T = 0``."""
    return _unit_grid(steps).float()


def shifted_sigmas(steps: int, shift: float = 3.0) -> Tensor:
    """Static time shift ``s = k u / (1 + (k - 1) u)`` (SD3, Flow-GRPO): more steps at high noise."""
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    u = _unit_grid(steps)
    return (shift * u / (1.0 + (shift - 1.0) * u)).float()


def flux_mu(image_tokens: int, base_shift: float = 0.5, max_shift: float = 1.15,
            base_tokens: int = 256, max_tokens: int = 4096) -> float:
    """FLUX's resolution-dependent shift: ``mu`` linear in the number of image tokens."""
    slope = (max_shift - base_shift) / (max_tokens - base_tokens)
    return base_shift + (image_tokens - base_tokens) * slope


def flux_sigmas(steps: int, image_tokens: int) -> Tensor:
    """FLUX dynamic shift ``s = e^mu / (e^mu + 1/u - 1)``; ``u = 0`` maps to ``s = 0``."""
    if image_tokens < 1:
        raise ValueError(f"image_tokens must be >= 1, got {image_tokens}")
    u = _unit_grid(steps)
    em = math.exp(flux_mu(image_tokens))
    s = torch.zeros_like(u)
    pos = u > 0
    s[pos] = em / (em + 1.0 / u[pos] - 1.0)
    return s.float()


def make_sigmas(kind: ScheduleKind, steps: int, shift: float = 3.0,
                image_tokens: int = 4096) -> Tensor:
    """Sigma grid of ``steps + 1`` values by schedule name (``linear``, ``shift``, ``flux``)."""
    if kind == "linear":
        return linear_sigmas(steps)
    if kind == "shift":
        return shifted_sigmas(steps, shift)
    if kind == "flux":
        return flux_sigmas(steps, image_tokens)
    raise ValueError(f"unknown schedule {kind!r}; expected one of {SCHEDULE_KINDS}")


# --------------------------------------------------------------------------- helpers
def _per_sample(value: Tensor | float, like: Tensor) -> Tensor:
    """Broadcast a scalar or a per-sample ``[B]`` value against ``[B, ...]`` in float32."""
    t = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    if t.ndim == 0:
        return t
    return t.reshape(t.shape[0], *([1] * (like.ndim - 1)))


def predicted_x0(x: Tensor, v: Tensor, sigma: Tensor | float) -> Tensor:
    """Clean-image estimate ``x0_hat = x - s v``."""
    x, v = x.float(), v.float()
    return x - _per_sample(sigma, x) * v


def predicted_noise(x: Tensor, v: Tensor, sigma: Tensor | float) -> Tensor:
    """Noise estimate ``eps_hat = x + (1 - s) v``."""
    x, v = x.float(), v.float()
    return x + (1.0 - _per_sample(sigma, x)) * v


# --------------------------------------------------------------------------- steps
def ode_step(x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float) -> Tensor:
    """Euler step of the probability-flow ODE: ``x - (s - s_next) v``."""
    x, v = x.float(), v.float()
    return x - (_per_sample(sigma, x) - _per_sample(sigma_next, x)) * v


def sde_noise_scale(kind: SdeKind, sigma: Tensor, sigma_next: Tensor,
                    noise_level: Tensor) -> Tensor:
    """Diffusion coefficient ``g`` of one SDE step (per sample).

    ``flow_grpo``: ``a sqrt(s / (1 - s))``, with ``1 - s_next`` in the denominator at ``s = 1``
    (there ``s_next`` is the grid's ``s_1``); ``dance``: constant ``a``; ``cps``: the step's
    std itself, ``s_next sin(a pi / 2)``.
    """
    sigma, sigma_next, a = (torch.as_tensor(t, dtype=torch.float32)
                            for t in (sigma, sigma_next, noise_level))
    if kind == "flow_grpo":
        denom = 1.0 - torch.where(sigma >= 1.0, sigma_next, sigma)
        return a * torch.sqrt(sigma / denom)
    if kind == "dance":
        return a * torch.ones_like(sigma)
    if kind == "cps":
        return sigma_next * torch.sin(a * (math.pi / 2.0))
    raise ValueError(f"unknown sde kind {kind!r}; expected one of {SDE_KINDS}")


@dataclass(frozen=True)
class NoiseSubspace:
    """Where the SDE step noise lives [choice]: in every latent element (``pool = 1``, the
    anchors' isotropic noise), or only in the image's low frequencies: noise constant over
    ``pool x pool`` blocks of the image grid, the covariance an orthogonal projector ``P``.

    Why: the policy gradient of a step is ``eps . d mean / d theta`` summed over the noised
    elements, and every element whose noise does not change the reward adds variance without
    signal. Composition (which object, where, what colour) lives in the low frequencies, so
    restricting exploration to them keeps the signal and drops most of that variance. The drift
    correction is projected too, so the step still has the ODE's marginals (a constant noise
    covariance ``P`` needs the score term ``P grad log p``). Elements outside the subspace move
    deterministically and carry no density: log-probabilities are over the ``fraction * D``
    dimensions of the subspace.

    ``unshuffle``: the latent is ``pixel_unshuffle(image, unshuffle)`` (a pixel-space model), so
    blocks are taken in image pixels; 1 for latents whose grid is already spatial (VAE latents).
    """

    pool: int = 1
    unshuffle: int = 1

    def __post_init__(self) -> None:
        if self.pool < 1 or self.unshuffle < 1:
            raise ValueError(f"noise pool and unshuffle must be >= 1, got {self.pool}, "
                             f"{self.unshuffle}")

    @property
    def full(self) -> bool:
        """True for isotropic noise (no projection)."""
        return self.pool == 1

    @property
    def fraction(self) -> float:
        """Dimensions of the subspace over all latent dimensions."""
        return 1.0 / self.pool**2

    def check(self, latent_shape: tuple[int, ...]) -> None:
        """Raise a one-line error unless the blocks tile the image of ``[C, H, W]`` latents."""
        if self.full:
            return
        if len(latent_shape) != 3:
            raise ValueError(f"pooled SDE noise needs [C, H, W] latents, got {tuple(latent_shape)}")
        h, w = (side * self.unshuffle for side in latent_shape[-2:])
        if h % self.pool or w % self.pool:
            raise ValueError(f"noise pool {self.pool} does not divide the {h}x{w} image grid")

    def project(self, x: Tensor) -> Tensor:
        """``P x``: average over each ``pool x pool`` image block, broadcast back ``[B, C, H, W]``."""
        if self.full:
            return x
        self.check(tuple(x.shape[1:]))
        image = F.pixel_shuffle(x, self.unshuffle) if self.unshuffle > 1 else x
        low = F.avg_pool2d(image, self.pool)
        low = low.repeat_interleave(self.pool, dim=-2).repeat_interleave(self.pool, dim=-1)
        return F.pixel_unshuffle(low, self.unshuffle) if self.unshuffle > 1 else low


FULL_NOISE = NoiseSubspace()


@dataclass(frozen=True)
class Gaussian:
    """Transition density of one SDE step: ``mean + std * P eps``; ``std`` is per sample ``[B]``,
    ``P`` the projector of ``subspace`` (the identity for isotropic noise)."""

    mean: Tensor
    std: Tensor
    subspace: NoiseSubspace = FULL_NOISE

    def sample(self, eps: Tensor) -> Tensor:
        """``mean + std * P eps`` for standard normal ``eps`` of the mean's shape."""
        return self.mean + _per_sample(self.std, self.mean) * self.subspace.project(eps.float())

    def rows(self, index: Tensor) -> Gaussian:
        """The transitions of rows ``index`` (repeats allowed: siblings share a parent's)."""
        return Gaussian(self.mean[index], self.std[index], self.subspace)


def sde_transition(kind: SdeKind, x: Tensor, v: Tensor, sigma: Tensor | float,
                   sigma_next: Tensor | float, noise_level: Tensor | float,
                   subspace: NoiseSubspace = FULL_NOISE) -> Gaussian:
    """Mean and std of ``x_next`` given ``x`` for the chosen SDE form (float32).

    ``flow_grpo``/``dance``: ``mean = x - D (v + g^2 / (2 s) P eps_hat)``, ``std = g sqrt(D)``.
    ``cps`` (coefficient-preserving): ``mean = (1 - s') x0_hat + sqrt(s'^2 - std^2) P eps_hat
    + s' (I - P) eps_hat``, ``std = s' sin(a pi/2)``. ``P`` is the noise subspace's projector
    (the identity by default). With noise level 0 each reduces to the Euler step.
    """
    x, v = x.float(), v.float()
    batch = x.shape[0]
    s = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(batch)
    s_next = torch.as_tensor(sigma_next, dtype=torch.float32, device=x.device).expand(batch)
    a = torch.as_tensor(noise_level, dtype=torch.float32, device=x.device).expand(batch)
    g = sde_noise_scale(kind, s, s_next, a)
    eps_hat = predicted_noise(x, v, s)
    if kind == "cps":
        x0_hat = predicted_x0(x, v, s)
        keep = torch.sqrt(torch.clamp(s_next**2 - g**2, min=0.0))
        noised = subspace.project(eps_hat)
        mean = _per_sample(1.0 - s_next, x) * x0_hat + _per_sample(keep, x) * noised
        if not subspace.full:  # outside the noise, the deterministic step keeps all of eps_hat
            mean = mean + _per_sample(s_next, x) * (eps_hat - noised)
        return Gaussian(mean, g, subspace)
    delta = s - s_next
    drift = v + _per_sample(g**2 / (2.0 * s), x) * subspace.project(eps_hat)
    mean = x - _per_sample(delta, x) * drift
    return Gaussian(mean, g * torch.sqrt(delta), subspace)


def gaussian_log_prob(sample: Tensor, dist: Gaussian, reduce: Literal["mean", "sum"] = "mean",
                      form: LogProbForm = "gaussian") -> Tensor:
    """Log-density of ``sample`` under ``dist``, reduced over the noised dimensions per sample.

    ``mean`` (default, as all anchors do) keeps ratios near 1; ``sum`` is the true density.
    With a pooled noise subspace the density is that of ``P (sample - mean)`` over the
    subspace's ``fraction * D`` dimensions. ``form`` (see :data:`LogProbForm`).
    """
    if reduce not in ("mean", "sum"):
        raise ValueError(f"unknown log-prob reduction {reduce!r}; expected 'mean' or 'sum'")
    if form not in ("gaussian", "unnormalised"):
        raise ValueError(f"unknown log-prob form {form!r}; expected 'gaussian' or 'unnormalised'")
    sample = sample.float()
    std = _per_sample(dist.std, sample)
    if dist.subspace.full:
        if form == "unnormalised":
            elem = -((sample - dist.mean) ** 2)
        else:
            elem = -((sample - dist.mean) ** 2) / (2.0 * std**2) - torch.log(std) - _LOG_SQRT_2PI
        flat = elem.flatten(1)
        return flat.mean(dim=1) if reduce == "mean" else flat.sum(dim=1)
    if form == "unnormalised":
        raise ValueError("the unnormalised log-probability is Flow-GRPO's, for isotropic noise only")
    dims = sample[0].numel() * dist.subspace.fraction
    residual = dist.subspace.project(sample - dist.mean)
    square = (residual**2).flatten(1).sum(dim=1) / (2.0 * std.flatten() ** 2)
    per_dim = -square / dims - torch.log(std.flatten()) - _LOG_SQRT_2PI
    return per_dim if reduce == "mean" else per_dim * dims


def sde_step(kind: SdeKind, x: Tensor, v: Tensor, sigma: Tensor | float,
             sigma_next: Tensor | float, noise_level: Tensor | float, noise: Tensor,
             reduce: Literal["mean", "sum"] = "mean",
             subspace: NoiseSubspace = FULL_NOISE) -> tuple[Tensor, Tensor]:
    """Draw ``x_next = mean + std * P noise`` and return it with its log-probability.

    ``noise`` is passed in (not drawn here) so that callers own all randomness.
    A zero noise level returns the Euler step and a log-probability of NaN (no density).
    """
    dist = sde_transition(kind, x, v, sigma, sigma_next, noise_level, subspace)
    x_next = dist.sample(noise)
    if bool((dist.std > 0).all()):
        log_prob = gaussian_log_prob(x_next, dist, reduce)
    else:
        log_prob = torch.full((x.shape[0],), float("nan"), device=x.device)
    return x_next, log_prob


def gaussian_kl_same_std(mean_a: Tensor, mean_b: Tensor, std: Tensor) -> Tensor:
    """KL between two Gaussians of equal std, averaged over elements (Flow-GRPO's KL term)."""
    diff = (mean_a.float() - mean_b.float()) ** 2
    return (diff / (2.0 * _per_sample(std, diff) ** 2)).flatten(1).mean(dim=1)


def score_scale(kind: SdeKind, sigma: Tensor, sigma_next: Tensor, noise_level: Tensor) -> Tensor:
    """Per step, ``|d mean / d v| / std``: how strongly one unit of standardised step noise pulls on
    the velocity through the step's log-density.

    Every SDE form here is affine in ``v``, so the coefficient is ``mean(v=1) - mean(v=0)`` at
    ``x = 0``. It differs between steps by an order of magnitude (small near ``s = 1``), which is
    why a sliding window changes the gradient scale an optimizer sees unless it is divided out.
    """
    sigma = torch.as_tensor(sigma, dtype=torch.float32).flatten()
    zero = torch.zeros(sigma.numel(), 1)
    at_one = sde_transition(kind, zero, torch.ones_like(zero), sigma, sigma_next, noise_level)
    at_zero = sde_transition(kind, zero, zero, sigma, sigma_next, noise_level)
    return (at_one.mean - at_zero.mean).abs().flatten() / at_one.std


# --------------------------------------------------------------------------- DPM-Solver++(2M)
def dpm2m_step(x: Tensor, x0: Tensor, sigma: float, sigma_next: float,
               prev_x0: Tensor | None, prev_sigma: float | None) -> Tensor:
    """One DPM-Solver++(2M) step in data prediction for ``alpha = 1 - s``, ``sigma = s``.

    First order (no history, or the final step to ``s = 0``) is exactly the Euler step.
    """
    x, x0 = x.float(), x0.float()
    if sigma_next <= 0.0:
        return x0
    ratio = sigma_next / sigma
    first_order = ratio * x + (1.0 - ratio) * x0
    if prev_x0 is None or prev_sigma is None or prev_sigma >= 1.0:
        return first_order

    def lam(s: float) -> float:
        return math.log((1.0 - s) / s)

    h = lam(sigma_next) - lam(sigma)
    r = (lam(sigma) - lam(prev_sigma)) / h
    d = (1.0 + 1.0 / (2.0 * r)) * x0 - (1.0 / (2.0 * r)) * prev_x0.float()
    return ratio * x + (1.0 - ratio) * d
