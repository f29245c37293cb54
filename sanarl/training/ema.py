"""Weight averages: the EMA of the trained weights and the DiffusionNFT old-policy decay (docs/algorithms.md,
"DiffusionNFT").

- ``EMA``: float32 shadow copies, ``decay_k = min((1 + k) / (10 + k), ema_decay)`` (a warm-up that rises towards
  ``ema_decay``; the runner's k counts optimizer steps from 1, so the first decay is 2/11 as in the references), ``ema += (1 - decay_k) (p - ema)``, used for evaluation and export only.
- ``decay_old_weights`` / ``old_weight_decay``: the behaviour policy ``theta_old <- d theta_old + (1 - d) theta``
  with the schedules of DiffusionNFT (arXiv 2509.16117).

This module imports nothing else of sanarl.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

ParamsLike = nn.Module | Mapping[str, Tensor] | Sequence[Tensor]
"""A module (its named parameters are matched by name), a name -> tensor mapping, or tensors in EMA order."""


class EMA:
    """Exponential moving average of a fixed, ordered list of named parameters, kept in float32.

    Args:
        named_params: ``(name, tensor)`` pairs; their current values initialise the average.
        decay: ``ema_decay``, the cap of the warm-up decay.
        interval: ``ema_update_step_interval``; the average is updated at step k when ``(k + 1) % interval == 0``,
            as in DiffusionNFT's EMA wrapper; 0 or 1 = every step. The runner passes k = the optimizer steps done
            (1 after the first update), the global step the references pass, so the first decay is 2/11.
    """

    def __init__(
        self, named_params: Sequence[tuple[str, Tensor]], *, decay: float, interval: int = 1
    ) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"ema_decay must be in [0, 1], got {decay}; set train.ema_decay to e.g. 0.9.")
        if interval < 0:
            raise ValueError(f"ema_update_step_interval must be >= 0, got {interval}; 0 or 1 = every step.")
        self.names = [name for name, _ in named_params]
        if len(set(self.names)) != len(self.names):
            raise ValueError("EMA parameter names must be unique.")
        self.shadow = [p.detach().to(torch.float32).clone() for _, p in named_params]
        self.decay = float(decay)
        self.interval = int(interval)

    @classmethod
    def from_module(
        cls, module: nn.Module, *, decay: float, interval: int = 1, only_trainable: bool = True
    ) -> EMA:
        """Track ``module``'s parameters (only those with ``requires_grad`` unless ``only_trainable=False``)."""
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad or not only_trainable]
        return cls(named, decay=decay, interval=interval)

    def current_decay(self, step: int) -> float:
        """``decay_k = min((1 + k) / (10 + k), ema_decay)``."""
        return min((1.0 + step) / (10.0 + step), self.decay)

    def _resolve(self, params: ParamsLike) -> list[Tensor]:
        if isinstance(params, nn.Module):
            params = dict(params.named_parameters())
        if isinstance(params, Mapping):
            missing = [n for n in self.names if n not in params]
            if missing:
                raise ValueError(f"EMA tracks parameters the given module lacks: {missing[:5]} ...")
            tensors = [params[n] for n in self.names]
        else:
            tensors = list(params)
        if len(tensors) != len(self.shadow):
            raise ValueError(f"EMA tracks {len(self.shadow)} tensors but {len(tensors)} were given.")
        for name, t, e in zip(self.names, tensors, self.shadow, strict=True):
            if t.shape != e.shape:
                raise ValueError(f"EMA shape mismatch for {name}: {tuple(t.shape)} vs {tuple(e.shape)}.")
        return tensors

    @torch.no_grad()
    def update(self, params: ParamsLike, step: int) -> bool:
        """Fold the current weights into the average at step ``step`` (the runner: optimizer steps done).

        Returns:
            True when the average was updated (``(step + 1) % interval == 0``, or interval <= 1).
        """
        if self.interval > 1 and (step + 1) % self.interval != 0:
            return False
        one_minus = 1.0 - self.current_decay(step)
        for e, p in zip(self.shadow, self._resolve(params), strict=True):
            e.add_((p.detach().to(device=e.device, dtype=torch.float32) - e) * one_minus)
        return True

    @torch.no_grad()
    def copy_to(self, params: ParamsLike) -> None:
        """Write the averaged weights into ``params`` (cast to each parameter's dtype and device)."""
        for e, p in zip(self.shadow, self._resolve(params), strict=True):
            p.copy_(e.to(device=p.device, dtype=p.dtype))

    @contextmanager
    def swap(self, params: ParamsLike) -> Iterator[None]:
        """Temporarily load the averaged weights into ``params``; the originals come back on exit (even on error)."""
        tensors = self._resolve(params)
        saved = [p.detach().clone() for p in tensors]
        self.copy_to(tensors)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, orig in zip(tensors, saved, strict=True):
                    p.copy_(orig)

    def state_dict(self) -> dict[str, Any]:
        """``{"decay", "interval", "shadow": {name: float32 tensor}}``."""
        return {
            "decay": self.decay,
            "interval": self.interval,
            "shadow": {n: e.clone() for n, e in zip(self.names, self.shadow, strict=True)},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from ``state_dict()``; the tracked names and shapes must match."""
        shadow = state["shadow"]
        if list(shadow) != self.names:
            raise ValueError(
                "EMA checkpoint tracks different parameters than this model (was LoRA or only_trainable changed "
                f"since it was saved?): {len(shadow)} saved vs {len(self.names)} now."
            )
        self._resolve(shadow)
        self.shadow = [
            shadow[n].detach().to(device=e.device, dtype=torch.float32).clone()
            for n, e in zip(self.names, self.shadow, strict=True)
        ]
        self.decay = float(state["decay"])
        self.interval = int(state["interval"])


@torch.no_grad()
def decay_old_weights(old: Sequence[Tensor], new: Sequence[Tensor], decay: float) -> None:
    """In place ``old <- d old + (1 - d) new`` for each pair (DiffusionNFT behaviour-policy update).

    ``d = 0`` copies ``new`` into ``old`` (strictly on-policy); ``d = 1`` leaves ``old`` unchanged.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"old-weight decay must be in [0, 1], got {decay}.")
    if len(old) != len(new):
        raise ValueError(f"old and new weight lists differ in length: {len(old)} vs {len(new)}.")
    for o, n in zip(old, new, strict=True):
        if o.shape != n.shape:
            raise ValueError(f"old/new weight shape mismatch: {tuple(o.shape)} vs {tuple(n.shape)}.")
        o.mul_(decay).add_(n.detach().to(device=o.device, dtype=o.dtype), alpha=1.0 - decay)


def old_weight_decay(step: int, decay_type: int, custom_step: int = 0, custom_value: float = 0.0) -> float:
    """The decay ``d`` of the old-policy update after ``step`` (DiffusionNFT ``weight_copy_decay_type``).

    - 0: ``0`` (copy: strictly on-policy);
    - 1: ``min(0.001 step, 0.5)`` (default);
    - 2: ``0`` while ``step < 75``, then ``min(0.0075 (step - 75), 0.999)``;
    - 3: ``min(step custom_value / custom_step, custom_value)`` (Sol-RL's custom ramp; both must be > 0).
    """
    if decay_type == 0:
        return 0.0
    if decay_type == 1:
        return min(0.001 * step, 0.5)
    if decay_type == 2:
        return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
    if decay_type == 3:
        if custom_step <= 0 or custom_value <= 0:
            raise ValueError(
                f"weight_copy_decay_type 3 needs policy.diffusers.custom_decay_step > 0 and custom_decay_value > 0 "
                f"(got {custom_step}, {custom_value})."
            )
        return min(step * (custom_value / custom_step), custom_value)
    raise ValueError(
        f"unknown weight_copy_decay_type {decay_type}: set policy.diffusers.weight_copy_decay_type to 0 "
        "(on-policy), 1 (min(0.001 step, 0.5)), 2 (delayed: 0 before step 75) or 3 (custom ramp)."
    )
