"""Value ranges declared on the schema's fields, where the key's type, default and doc are.

    max_prompt_length: Annotated[int, AtLeast(1)] = 300

The engine (`engine.field_rules`) reads them from the `Annotated` type and checks every built config against them
(`Engine.check_choices`, first of `loader.check_config`), with the message `check` writes; docs/configuration.md
shows them. A value of None (an unset optional key) is not checked. Ranges that depend on another key stay in
checks.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sanarl.errors import ConfigError


@dataclass(frozen=True)
class Range:
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    hint: str = ""
    """What the message adds after the rule: the published value, or what the bound means."""

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def text(self) -> str:
        """`>= 1`, `> 0.0`, `in (0, 1]`."""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"

    def check(self, value: float | None, key: str) -> None:
        """Raise ConfigError naming `key` when `value` is outside the range."""
        if value is None or self.holds(value):
            return
        verb = "be" if self.low is None or self.high is None else "lie"
        hint = f" ({self.hint})" if self.hint else ""
        raise ConfigError(f"`{key}` = {value!r} is out of range; it must {verb} {self.text()}{hint}.")


def AtLeast(low: float, hint: str = "") -> Range:  # noqa: N802  (reads as a type annotation)
    return Range(low=low, hint=hint)


def Above(low: float, hint: str = "") -> Range:  # noqa: N802
    return Range(low=low, low_open=True, hint=hint)


def Within(  # noqa: N802
    low: float, high: float, *, low_open: bool = False, high_open: bool = False, hint: str = ""
) -> Range:
    return Range(low=low, high=high, low_open=low_open, high_open=high_open, hint=hint)
