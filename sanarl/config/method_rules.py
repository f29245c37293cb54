"""What the config loader reads of a method: the seam between the loader and the method registry.

The config package sits below the methods (docs/architecture.md, "Layers") and never imports them. It declares
here what it needs of one method, `MethodRules` (the `train.train_policy.type` / `trainer_type` pair that selects
it, its checks and its warnings), and the loader's caller hands it the table: the method registry's `METHODS`
(sanarl/methods/registry.py), whose `Method` entries satisfy `MethodRules`. `sanarl.methods.config_loading` is that
caller for every command, the bench, evaluation and the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from sanarl.config.schema import Config


class MethodRules(Protocol):
    """One method as the loader sees it."""

    @property
    def policy_type(self) -> str:
        """`train.train_policy.type`."""

    @property
    def trainer_type(self) -> str:
        """`train.train_policy.trainer_type`."""

    @property
    def validate(self) -> Callable[[Config], None] | None:
        """Its cross-field checks (ConfigError naming the key and the fix), run after the generic ones; None: the
        generic ones only."""

    @property
    def warnings(self) -> Callable[[Config], list[str]]:
        """Valid settings that have no effect for it (the loader's notes, before the generic ones)."""


MethodTable = Sequence[MethodRules]
"""The methods a loader accepts, in the registry's order."""
M = TypeVar("M", bound=MethodRules)


def trainer_types(methods: MethodTable) -> dict[str, tuple[str, ...]]:
    """`train.train_policy.type` -> its `trainer_type` values, in table order."""
    out: dict[str, tuple[str, ...]] = {}
    for method in methods:
        out[method.policy_type] = (*out.get(method.policy_type, ()), method.trainer_type)
    return out


def rules_of(cfg: Config, methods: Sequence[M]) -> M | None:
    """The entry of the method `cfg` selects (None: no such pair; `checks.check_task` reports it)."""
    tp = cfg.train.train_policy
    return next((m for m in methods if (m.policy_type, m.trainer_type) == (tp.type, tp.trainer_type)), None)
