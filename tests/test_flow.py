"""Schedules and single steps of the flow-matching SDE (docs/algorithm.md, "Flow matching and steps")."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dynamic_treerpo.trainer.core.flow import (
    Gaussian,
    NoiseSubspace,
    dpm2m_step,
    flux_mu,
    gaussian_log_prob,
    make_sigmas,
    ode_step,
    predicted_x0,
    score_scale,
    sde_noise_scale,
    sde_step,
    sde_transition,
)

KINDS = ["flow_grpo", "dance", "cps"]


def test_schedules_run_from_noise_to_data() -> None:
    for kind in ("linear", "shift", "flux"):
        s = make_sigmas(kind, 25, shift=3.0, image_tokens=1024)
        assert s.shape == (26,)
        assert s[0].item() == pytest.approx(1.0) and s[-1].item() == 0.0
        assert bool((s[:-1] > s[1:]).all()), kind


def test_static_shift_formula_and_flux_mu() -> None:
    s = make_sigmas("shift", 4, shift=3.0)
    u = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    torch.testing.assert_close(s, 3 * u / (1 + 2 * u))
    assert make_sigmas("shift", 4, shift=1.0).tolist() == pytest.approx(u.tolist())
    assert flux_mu(256) == pytest.approx(0.5) and flux_mu(4096) == pytest.approx(1.15)
    mu = 0.5 + (1024 - 256) * 0.65 / 3840
    f = make_sigmas("flux", 4, image_tokens=1024)
    expected = [math.exp(mu) / (math.exp(mu) + 1 / v - 1) for v in (1.0, 0.75, 0.5, 0.25)] + [0.0]
    assert f.tolist() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="unknown schedule"):
        make_sigmas("cosine", 4)


@pytest.mark.parametrize("kind", KINDS)
def test_log_prob_equals_torch_normal_mean(kind: str) -> None:
    gen = torch.Generator().manual_seed(1)
    x, v = torch.randn(5, 3, 4, 4, generator=gen), torch.randn(5, 3, 4, 4, generator=gen)
    sigma, sigma_next = torch.full((5,), 0.6), torch.full((5,), 0.5)
    dist = sde_transition(kind, x, v, sigma, sigma_next, torch.full((5,), 0.7))
    sample = torch.randn(5, 3, 4, 4, generator=gen)
    ours = gaussian_log_prob(sample, dist)
    ref = torch.stack([torch.distributions.Normal(dist.mean[i], dist.std[i]).log_prob(sample[i]).mean()
                       for i in range(5)])
    torch.testing.assert_close(ours, ref)
    ref_sum = torch.stack([torch.distributions.Normal(dist.mean[i], dist.std[i]).log_prob(sample[i]).sum()
                           for i in range(5)])
    torch.testing.assert_close(gaussian_log_prob(sample, dist, "sum"), ref_sum)


@pytest.mark.parametrize("kind", KINDS)
def test_zero_noise_step_is_the_euler_step(kind: str) -> None:
    gen = torch.Generator().manual_seed(2)
    x, v = torch.randn(4, 2, 3, generator=gen), torch.randn(4, 2, 3, generator=gen)
    x_next, log_prob = sde_step(kind, x, v, 0.8, 0.7, 0.0, torch.randn(4, 2, 3, generator=gen))
    torch.testing.assert_close(x_next, ode_step(x, v, 0.8, 0.7), rtol=1e-6, atol=1e-6)
    assert bool(log_prob.isnan().all())


def test_flow_grpo_mean_matches_its_published_form() -> None:
    """mean = x (1 + g^2 dt / 2s) + v (1 + g^2 (1 - s) / 2s) dt, dt = s_next - s < 0."""
    gen = torch.Generator().manual_seed(3)
    x, v = torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen)
    s, s_next, a = 0.7, 0.62, 0.7
    dist = sde_transition("flow_grpo", x, v, s, s_next, a)
    g = a * math.sqrt(s / (1 - s))
    dt = s_next - s
    expected = x * (1 + g**2 / (2 * s) * dt) + v * (1 + g**2 * (1 - s) / (2 * s)) * dt
    torch.testing.assert_close(dist.mean, expected)
    torch.testing.assert_close(dist.std, torch.full((3,), g * math.sqrt(-dt)))


def test_noise_scales() -> None:
    one = torch.tensor([1.0])
    # at s = 1 Flow-GRPO divides by 1 - s_1 instead of 0
    g = sde_noise_scale("flow_grpo", one, torch.tensor([0.9]), torch.tensor([0.5]))
    assert g.item() == pytest.approx(0.5 * math.sqrt(1 / 0.1))
    assert sde_noise_scale("dance", torch.tensor([0.3]), torch.tensor([0.2]),
                           torch.tensor([0.3])).item() == pytest.approx(0.3)
    cps = sde_noise_scale("cps", torch.tensor([0.5]), torch.tensor([0.4]), torch.tensor([1.0]))
    assert cps.item() == pytest.approx(0.4)
    with pytest.raises(ValueError, match="unknown sde kind"):
        sde_noise_scale("ddpm", one, one, one)


def test_math_runs_in_float32_for_bf16_models() -> None:
    x = torch.randn(2, 4).bfloat16()
    v = torch.randn(2, 4).bfloat16()
    x_next, log_prob = sde_step("flow_grpo", x, v, 0.5, 0.4, 0.7, torch.randn(2, 4))
    assert x_next.dtype == torch.float32 and log_prob.dtype == torch.float32


def _gaussian_flow(a: float):
    """Exact velocity when data ~ N(0, a^2): the ODE maps x(1) = z to x(0) = a z."""

    def velocity(x: torch.Tensor, s: float) -> torch.Tensor:
        return (s - (1 - s) * a**2) * x / ((1 - s) ** 2 * a**2 + s**2)

    return velocity


def test_dpm2m_is_euler_at_first_order_and_more_accurate_after() -> None:
    a, z = 0.3, torch.ones(1, 1)
    velocity = _gaussian_flow(a)
    x = torch.tensor([[0.7]])
    x0 = predicted_x0(x, velocity(x, 0.8), 0.8)
    torch.testing.assert_close(dpm2m_step(x, x0, 0.8, 0.6, None, None),
                               ode_step(x, velocity(x, 0.8), 0.8, 0.6))
    # integrate from s = 1 to s = 0.2, where the exact solution is sqrt(Var(x_s)) z
    sigmas = torch.linspace(1.0, 0.2, 7).tolist()
    exact = math.sqrt((1 - 0.2) ** 2 * a**2 + 0.2**2)
    euler, multi, prev = z.clone(), z.clone(), (None, None)
    for s, s_next in itertools.pairwise(sigmas):
        euler = ode_step(euler, velocity(euler, s), s, s_next)
        x0 = predicted_x0(multi, velocity(multi, s), s)
        multi = dpm2m_step(multi, x0, s, s_next, *prev)
        prev = (x0, s)
    assert abs(multi.item() - exact) < abs(euler.item() - exact) / 2


def test_gaussian_dataclass_std_per_sample() -> None:
    dist = Gaussian(torch.zeros(2, 3), torch.tensor([1.0, 2.0]))
    lp = gaussian_log_prob(torch.zeros(2, 3), dist)
    assert lp[0] > lp[1]


@pytest.mark.parametrize("kind", KINDS)
def test_score_scale_is_the_mean_derivative_over_std(kind: str) -> None:
    """``score_scale`` equals ``|d mean / d v| / std`` by autograd, and is small near ``s = 1``:
    the reason ``step_scale: score`` exists."""
    sigmas = make_sigmas("shift", 10)
    s, nxt = sigmas[:-1], sigmas[1:]
    a = torch.full_like(s, 0.6)
    got = score_scale(kind, s, nxt, a)
    for i in range(s.numel() - 1):  # the last step of cps has std 0
        v = torch.zeros(1, 1, requires_grad=True)
        dist = sde_transition(kind, torch.full((1, 1), 0.3), v, s[i:i + 1], nxt[i:i + 1], a[i:i + 1])
        (slope,) = torch.autograd.grad(dist.mean.sum(), v)
        assert got[i].item() == pytest.approx(slope.abs().item() / dist.std.item(), rel=1e-5)
    if kind == "flow_grpo":
        assert got[5] > 5 * got[0]


# ------------------------------------------------------------------ pooled (low-frequency) noise
def test_pooled_noise_is_an_orthogonal_projection_onto_image_blocks() -> None:
    gen = torch.Generator().manual_seed(5)
    pooled = NoiseSubspace(pool=4, unshuffle=4)
    x, y = torch.randn(2, 48, 8, 8, generator=gen), torch.randn(2, 48, 8, 8, generator=gen)
    px = pooled.project(x)
    torch.testing.assert_close(pooled.project(px), px)  # idempotent
    assert float((px * y).sum()) == pytest.approx(float((x * pooled.project(y)).sum()), rel=1e-5)
    image = torch.nn.functional.pixel_shuffle(px, 4)  # [2, 3, 32, 32]: constant on 4x4 pixel blocks
    blocks = image.reshape(2, 3, 8, 4, 8, 4)
    assert float((blocks - blocks[:, :, :, :1, :, :1]).abs().max()) < 1e-6
    assert float(blocks.std()) > 0.1  # but not constant overall
    assert NoiseSubspace().project(x) is x and NoiseSubspace(pool=2).fraction == 0.25
    with pytest.raises(ValueError, match="does not divide"):
        NoiseSubspace(pool=3).project(torch.randn(1, 1, 8, 8))


def test_pooled_log_prob_is_the_density_of_the_block_coordinates() -> None:
    gen = torch.Generator().manual_seed(6)
    pooled = NoiseSubspace(pool=2)
    dist = Gaussian(torch.randn(3, 2, 4, 4, generator=gen), torch.tensor([0.3, 0.5, 0.7]), pooled)
    sample = dist.sample(torch.randn(3, 2, 4, 4, generator=gen))
    # orthonormal coordinates of the subspace: each 2x2 block's sum / 2
    coords = torch.nn.functional.avg_pool2d(sample - dist.mean, 2) * 2
    ref = torch.stack([torch.distributions.Normal(0.0, dist.std[i]).log_prob(coords[i]).flatten()
                       for i in range(3)])
    torch.testing.assert_close(gaussian_log_prob(sample, dist), ref.mean(dim=1))
    torch.testing.assert_close(gaussian_log_prob(sample, dist, "sum"), ref.sum(dim=1))
    # what leaves the subspace (a detail inside the blocks) carries no density
    detail = torch.tensor([[1.0, -1.0], [-1.0, 1.0]]).repeat(2, 2).expand(3, 2, 4, 4)
    torch.testing.assert_close(gaussian_log_prob(sample + detail, dist), gaussian_log_prob(sample, dist))


@pytest.mark.parametrize("kind", KINDS)
def test_pooled_step_is_the_sde_inside_the_blocks_and_the_ode_outside(kind: str) -> None:
    gen = torch.Generator().manual_seed(7)
    pooled = NoiseSubspace(pool=2)
    x, v = torch.randn(4, 3, 4, 4, generator=gen), torch.randn(4, 3, 4, 4, generator=gen)
    full = sde_transition(kind, x, v, 0.8, 0.6, 0.7)
    part = sde_transition(kind, x, v, 0.8, 0.6, 0.7, pooled)
    torch.testing.assert_close(part.std, full.std)
    torch.testing.assert_close(pooled.project(part.mean), pooled.project(full.mean))
    if kind != "cps":  # the flow SDEs' drift outside the noise is the Euler step's
        euler = ode_step(x, v, 0.8, 0.6)
        torch.testing.assert_close(part.mean - pooled.project(part.mean),
                                   euler - pooled.project(euler))


@pytest.mark.parametrize("pool", [1, 2])
def test_pooled_sde_keeps_the_marginals_of_gaussian_data(pool: int) -> None:
    """With data ``x0 ~ N(m, c^2)`` the exact velocity is known in closed form; many small SDE
    steps from pure noise must keep ``x_s ~ N((1 - s) m, (1 - s)^2 c^2 + s^2)`` in every direction,
    inside the noised blocks and outside them. Without the projected drift correction the
    directions outside the blocks would shrink."""
    m, c = 0.5, 0.4
    gen = torch.Generator().manual_seed(8)
    subspace = NoiseSubspace(pool=pool)

    def velocity(x: torch.Tensor, s: float) -> torch.Tensor:
        var = (1 - s) ** 2 * c**2 + s**2
        centred = x - (1 - s) * m
        return s / var * centred - (m + (1 - s) * c**2 / var * centred)

    sigmas = torch.linspace(1.0, 0.3, 301).tolist()
    x = torch.randn(4000, 1, 4, 4, generator=gen)
    for s, s_next in itertools.pairwise(sigmas):
        x, _ = sde_step("flow_grpo", x, velocity(x, s), s, s_next, 0.8,
                        torch.randn(x.shape, generator=gen), subspace=subspace)
    s = sigmas[-1]
    centred = x - (1 - s) * m
    expected = (1 - s) ** 2 * c**2 + s**2
    inside = NoiseSubspace(pool=2).project(centred)
    for part, dims in ((inside, 4), (centred - inside, 12)):  # 4 block directions, 12 others
        assert float(part.pow(2).sum() / (x.shape[0] * dims)) == pytest.approx(expected, rel=0.05)
