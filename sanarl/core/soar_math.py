"""SOAR self-correction targets (HY-SOAR, arXiv 2604.12617; docs/algorithms.md, "SOAR").

Convention: `z_s = (1 - s) z0 + s z1` with z1 the noise, s = 1 pure noise. From the training point `z_s0` one
sampling step (to `s1 < s0`) gives `z1'`; re-noising `z1'` toward the same noise z1 at levels `s' in [s1, s_up]`
gives off-path points whose corrective target `(z' - z0) / s'` points back at the data. When `z1'` lies on the
true path, `z' = (1 - s') z0 + s' z1` and the target is exactly `z1 - z0`.

Per-sample levels (`s0`, `s1`, `s'`) are `[B]` tensors (or Python floats) and broadcast over `[B, C, H, W]` or
`[B, C, T, H, W]` latents.
"""

from __future__ import annotations

import torch

from .flow import broadcast_sigma
from .samplers import cps_step, flow_sde_step

SOAR_STEP_KINDS = ("ode", "simple", "sde", "flow_sde", "cps")
"""`ode` is path 0 (deterministic Euler); the other four are the stochastic paths 1..M-1."""


def aux_sigmas(
    s1: torch.Tensor,
    s0: torch.Tensor,
    num_points: int,
    sigma_upper_ratio: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Re-noising levels `s' ~ U[s1, s_up]`, `s_up = min(sigma_upper_ratio * s0, 1)`: s1, s0 `[B]` -> `[B, P]`.

    P = `num_points` (config trajectory_length). The public code hard-codes s_up = 1; sanarl honours the ratio
    (published default 1.5). The uniform draws come from `generator` on the CPU, then move to s1's device.
    """
    if num_points < 1:
        raise ValueError(f"trajectory_length (points per path) must be >= 1, got {num_points}.")
    if sigma_upper_ratio <= 0:
        raise ValueError(f"sigma_upper_ratio must be > 0, got {sigma_upper_ratio}; the default is 1.5.")
    if s1.ndim != 1 or s0.shape != s1.shape:
        raise ValueError(
            f"aux_sigmas needs s1 and s0 of one shape [B], got {tuple(s1.shape)} and {tuple(s0.shape)}."
        )
    s_up = (sigma_upper_ratio * s0).clamp(max=1.0)
    if bool((s_up < s1).any()):
        raise ValueError(
            f"sigma_upper_ratio={sigma_upper_ratio} puts the upper re-noising level below s1 for some samples; "
            "use a ratio >= 1."
        )
    u = torch.rand(s1.shape[0], num_points, generator=generator, dtype=torch.float64)
    u = u.to(device=s1.device, dtype=s1.dtype)
    return s1[:, None] + (s_up - s1)[:, None] * u


def renoise_toward(
    z1p: torch.Tensor, z1: torch.Tensor, s1: torch.Tensor | float, s_prime: torch.Tensor | float
) -> torch.Tensor:
    """Re-noise `z1'` (at level s1) toward the same noise z1 up to level s': `z' = (1 - a) z1' + a z1`,
    `a = (s' - s1) / (1 - s1)`; with s1 = 1 (no room left) a = 1. z1p, z1 `[B, ...]`; s1, s_prime `[B]`."""
    if z1p.shape != z1.shape:
        raise ValueError(
            f"renoise_toward needs z1' and z1 of one shape, got {tuple(z1p.shape)} and {tuple(z1.shape)}."
        )
    s1_b, sp_b = broadcast_sigma(s1, z1p), broadcast_sigma(s_prime, z1p)
    room = 1.0 - s1_b
    safe_room = torch.where(room > 0, room, torch.ones_like(room))
    a = torch.where(room > 0, (sp_b - s1_b) / safe_room, torch.ones_like(room))
    return (1.0 - a) * z1p + a * z1


def corrective_target(z_prime: torch.Tensor, z0: torch.Tensor, s_prime: torch.Tensor | float) -> torch.Tensor:
    """SOAR velocity target `v_corr = (z' - z0) / s'`: z_prime, z0 `[B, ...]`, s_prime `[B]` (all > 0)."""
    if z_prime.shape != z0.shape:
        raise ValueError(
            f"corrective_target needs z' and z0 of one shape, got {tuple(z_prime.shape)}, {tuple(z0.shape)}."
        )
    sp_b = broadcast_sigma(s_prime, z_prime)
    if not bool((sp_b > 0).all()):
        raise ValueError(
            "corrective_target needs s' > 0; leave samples with s' = 0 (t1 = 0) out of the auxiliary loss."
        )
    return (z_prime - z0) / sp_b


def _first_next(s0_b: torch.Tensor, s1_b: torch.Tensor, batch: int) -> float:
    """`s_first_next` of the Flow-GRPO step: the s1 shared by the samples that start at s0 = 1 (t0 = 1 maps to
    one t1 = 1 - 1 / num_sampling_steps); unused (0) when no sample starts there."""
    s0_v, s1_v = s0_b.reshape(-1).expand(batch), s1_b.reshape(-1).expand(batch)
    at_one = s1_v[s0_v >= 1.0]
    if at_one.numel() == 0:
        return 0.0
    if bool((at_one != at_one[0]).any()):
        raise ValueError(
            "soar_step(flow_sde): samples starting at s0 = 1 must share one s1 (the grid's next level)."
        )
    return float(at_one[0])


def soar_step(
    kind: str,
    z: torch.Tensor,
    v: torch.Tensor,
    s0: torch.Tensor | float,
    s1: torch.Tensor | float,
    noise_scale: float,
    noise: torch.Tensor | None = None,
    first_next: float | None = None,
) -> torch.Tensor:
    """One step from `z` (level s0) to level s1 < s0 with velocity `v` (the stop-gradient CFG velocity).

    z, v, noise `[B, ...]`; s0, s1 `[B]` or scalars; dt = s1 - s0. Kinds:
      ode:      z + v dt                                               (path 0; noise unused)
      simple:   z + v dt + noise_scale sqrt(|dt|) noise
      sde:      (1 - s1)(z - s0 v) + s1 noise
      flow_sde: Flow-GRPO SDE step with eta = noise_scale; at s0 = 1 its std uses s_first_next = `first_next`
                when given (HY-SOAR: the scheduler table's second level), else the s1 of those samples
      cps:      CPS step with eta = noise_scale
    flow_sde and cps are `sanarl.core.samplers.flow_sde_step` / `cps_step` (float32 arithmetic, result in
    z.dtype, need s1 < s0 strictly); the other kinds keep z's dtype.
    """
    if kind not in SOAR_STEP_KINDS:
        raise ValueError(f"unknown SOAR step type {kind!r}; use one of {', '.join(SOAR_STEP_KINDS)}.")
    if z.shape != v.shape:
        raise ValueError(f"soar_step needs z and v of one shape, got {tuple(z.shape)} and {tuple(v.shape)}.")
    s0_b, s1_b = broadcast_sigma(s0, z), broadcast_sigma(s1, z)
    if bool((s1_b > s0_b).any()) or bool((s0_b <= 0).any()) or bool((s1_b < 0).any()):
        raise ValueError(
            "soar_step needs 0 <= s1 <= s0 and s0 > 0 (sampling runs from noise s = 1 toward s = 0)."
        )
    dt = s1_b - s0_b
    if kind == "ode":
        return z + v * dt
    if noise is None or noise.shape != z.shape:
        got = None if noise is None else tuple(noise.shape)
        raise ValueError(f"soar_step({kind!r}) needs noise of shape {tuple(z.shape)}, got {got}.")
    if kind == "simple":
        return z + v * dt + noise_scale * torch.sqrt(dt.abs()) * noise
    if kind == "sde":
        return (1 - s1_b) * (z - s0_b * v) + s1_b * noise
    step = flow_sde_step if kind == "flow_sde" else cps_step
    s_first_next = None
    if kind == "flow_sde":
        s_first_next = first_next if first_next is not None else _first_next(s0_b, s1_b, z.shape[0])
    z_next, _, _, _ = step(z, v, s0, s1, eta=noise_scale, s_first_next=s_first_next, noise=noise)
    return z_next


def soar_normaliser(
    n_main: torch.Tensor | float, n_aux: torch.Tensor | float, lambda_aux: float
) -> torch.Tensor | float:
    """Loss denominator `max(N_main + lambda_aux N_aux, 1)` from the global (all-reduced) sample counts."""
    total = n_main + lambda_aux * n_aux
    if isinstance(total, torch.Tensor):
        return total.clamp_min(1.0)
    return max(float(total), 1.0)
