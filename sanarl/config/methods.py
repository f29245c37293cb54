"""The config loader's side of the method registry (sanarl/methods/registry.py).

The config package sits below the methods and cannot import them, so the registry hands its table to the loader
here when it is imported: which `train.train_policy.type` / `trainer_type` pairs exist and each method's
`validate(cfg)`. `sanarl/__init__.py` imports the registry, so every `import sanarl...` sees the full table.
"""

from __future__ import annotations

from collections.abc import Callable

from sanarl.config.schema import Config

Validate = Callable[[Config], None]

_METHODS: dict[tuple[str, str], Validate | None] = {}


def register(policy_type: str, trainer_type: str, validate: Validate | None) -> None:
    """Declare a (type, trainer_type) pair and its checks (None: the generic checks only)."""
    _METHODS[(policy_type, trainer_type)] = validate


def trainer_types() -> dict[str, tuple[str, ...]]:
    """`train.train_policy.type` -> its `trainer_type` values, in registration order."""
    out: dict[str, tuple[str, ...]] = {}
    for policy_type, trainer_type in _METHODS:
        out[policy_type] = (*out.get(policy_type, ()), trainer_type)
    return out


def validate_method(cfg: Config) -> None:
    """Run the checks of the method `cfg` selects (the pair itself is checked by the loader first)."""
    tp = cfg.train.train_policy
    validate = _METHODS.get((tp.type, tp.trainer_type))
    if validate is not None:
        validate(cfg)
