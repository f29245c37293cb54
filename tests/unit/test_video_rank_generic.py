"""The shared flow / sampler / NFT math is rank-generic: on video latents [B, C, T, h, w] it gives exactly what it
gives on the same numbers laid out as images [B, C, T*h, w] (every op is per element or a per-sample mean), and the
SFT task derives clip latent shapes from the clip's own frame count."""

from __future__ import annotations

import torch

from sanarl.core.flow import interpolate, sigma_grid, velocity_target, x0_from_velocity
from sanarl.core.nft_loss import nft_loss
from sanarl.core.samplers import initial_noise, sample_loop
from sanarl.methods.sft.task import latent_shape_of

VIDEO = (3, 2, 4, 3, 5)  # B, C, T, h, w
IMAGE = (3, 2, 12, 5)  # B, C, T*h, w


def as_image(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1])


def test_interpolation_and_targets_broadcast_per_sample_sigma():
    torch.manual_seed(0)
    x0, eps, s = torch.randn(VIDEO), torch.randn(VIDEO), torch.tensor([0.1, 0.5, 0.9])
    x_s = interpolate(x0, eps, s)
    for b in range(3):  # x_s = (1 - s) x0 + s eps, sample by sample
        torch.testing.assert_close(x_s[b], (1 - s[b]) * x0[b] + s[b] * eps[b])
    v = velocity_target(x0, eps)
    torch.testing.assert_close(x0_from_velocity(x_s, s, v), x0, atol=1e-6, rtol=0)


def _linear_velocity(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """v(x, s) = 0.3 x - s_b (elementwise, a function of the numbers only, not of the layout)."""
    return 0.3 * x - s.reshape(-1, *[1] * (x.ndim - 1))


def test_sample_loop_on_clips_equals_the_image_layout_for_ode_and_sde():
    seeds = [1, 2, 3]
    x_video, gens_v = initial_noise(VIDEO[1:], seeds)
    x_image, gens_i = initial_noise(IMAGE[1:], seeds)
    torch.testing.assert_close(as_image(x_video), x_image)  # per-seed noise fills the same numbers
    grid = sigma_grid(4, 3.0)
    for solver, eta in (("euler", 0.0), ("dpm2", 0.0), ("flow_sde", 0.7)):
        _, gens_v = initial_noise(VIDEO[1:], seeds)
        _, gens_i = initial_noise(IMAGE[1:], seeds)
        out_v = sample_loop(_linear_velocity, x_video, grid, solver=solver, eta=eta, generators=gens_v,
                            return_trajectory=True)  # fmt: skip
        out_i = sample_loop(_linear_velocity, x_image, grid, solver=solver, eta=eta, generators=gens_i,
                            return_trajectory=True)  # fmt: skip
        torch.testing.assert_close(as_image(out_v.latents), out_i.latents, atol=1e-6, rtol=0)
        if out_i.log_probs is not None:
            torch.testing.assert_close(out_v.log_probs, out_i.log_probs, atol=1e-5, rtol=0)


def test_nft_loss_on_clips_equals_the_image_layout():
    torch.manual_seed(1)
    v_theta, v_old, x_t, x0 = (torch.randn(VIDEO) for _ in range(4))
    t, adv = torch.tensor([0.2, 0.6, 0.9]), torch.tensor([1.0, -0.5, 0.0])
    kwargs = {"beta": 1.0, "adv_clip_max": 5.0}
    loss_v, metrics_v = nft_loss(v_theta, v_old, x_t, x0, t, adv, **kwargs)
    loss_i, metrics_i = nft_loss(*(as_image(z) for z in (v_theta, v_old, x_t, x0)), t, adv, **kwargs)
    torch.testing.assert_close(loss_v, loss_i)
    for key, value in metrics_i.items():
        torch.testing.assert_close(torch.as_tensor(metrics_v[key]), torch.as_tensor(value))


class _RecordingAdapter:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def latent_shape(self, height: int, width: int, frames: int | None = None) -> tuple[int, ...]:
        self.calls.append((height, width, frames))
        return (4, 1 + ((frames or 9) - 1) // 4, height // 8, width // 8)


def test_sft_latent_shape_passes_the_clip_frame_count_and_nothing_for_images():
    adapter = _RecordingAdapter()
    assert latent_shape_of(adapter, torch.Size([2, 3, 5, 16, 32])) == (4, 2, 2, 4)
    assert latent_shape_of(adapter, torch.Size([2, 3, 16, 32])) == (4, 3, 2, 4)
    assert adapter.calls == [(16, 32, 5), (16, 32, None)]
