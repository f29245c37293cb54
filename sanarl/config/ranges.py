"""Value rules declared on the schema's fields, where the key's type, default and doc are.

    max_prompt_length: Annotated[int, AtLeast(1)] = 300
    optm_betas: Annotated[list[float], Items(2, Within(0, 1, high_open=True), "two numbers in [0, 1)", ...)]

A rule is a range (`Range`: `AtLeast`, `Above`, `Within`) or a rule on a list or a text (`Items`, `NotBlank`,
`Only`, `Holds`). The engine (`engine.field_rules`) reads them from the `Annotated` type and checks every built
config against them (`Engine.check_choices`, first of `loader.check_config`), with the message `check` writes;
docs/configuration.md shows each rule's `text()`. A value of None (an unset optional key) is not checked. Rules
that depend on another key, or on a condition, stay in checks.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Items:
    """A list of exactly `count` values, each within `each` (`inference_size`: two positive integers)."""

    count: int
    each: Range
    what: str
    """The rule in words, for the message: "[height, width] with two positive integers"."""
    example: str

    def text(self) -> str:
        return f"{self.count} values, each {self.each.text()}"

    def check(self, value: list[float] | None, key: str) -> None:
        if value is None or (len(value) == self.count and all(self.each.holds(v) for v in value)):
            return
        raise ConfigError(f"`{key}` = {value!r} must be {self.what}, e.g. {self.example}.")


@dataclass(frozen=True)
class NotBlank:
    """A text with something in it besides spaces."""

    fix: str
    """What to set instead: 'set a run directory, e.g. "./outputs/run"'."""

    def text(self) -> str:
        return "not empty"

    def check(self, value: str | None, key: str) -> None:
        if value is not None and not value.strip():
            raise ConfigError(f"`{key}` is empty; {self.fix}.")


@dataclass(frozen=True)
class Only:
    """A key Cosmos-RL has but sanarl supports at one value only (`policy.is_diffusers`)."""

    value: Any

    def text(self) -> str:
        return f"only {_toml(self.value)}"

    def check(self, value: Any, key: str) -> None:
        if value is not None and value != self.value:
            raise ConfigError(f"`{key}` = {_toml(value)} is not supported; set it to {_toml(self.value)}.")


@dataclass(frozen=True)
class Holds:
    """Any other rule on one key's value: `test(value)` must hold, else `message` (with `{key}` and `{value}`)."""

    test: Callable[[Any], bool]
    rule: str
    """The rule in words, as the reference shows it."""
    message: str

    def text(self) -> str:
        return self.rule

    def check(self, value: Any, key: str) -> None:
        if value is not None and not self.test(value):
            raise ConfigError(self.message.format(key=key, value=value))


def _toml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)
